// The shard core, driven directly (no network): table administration,
// routing checks, and every bad input answered with a clear status that
// changes nothing.
#include "shard/shard.h"

#include <atomic>
#include <limits>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "tests/server/requests.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

class ShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(shard_.CreateTable(AdagradTable("user", 4), &created_));
    ASSERT_OK(shard_.CreateTable(AdagradTable("item", 2), &created_));
  }
  // All rows of `keys` in table `name`, read-only.
  std::vector<float> Rows(const std::string& name, const std::vector<uint64_t>& keys) {
    v1::LookupRequest req;
    v1::LookupResponse resp;
    AddLookup(&req, name, keys, /*read_only=*/true);
    EXPECT_OK(shard_.Lookup(req, &resp));
    return Floats(resp.tables(0).rows());
  }
  uint64_t StoredRows(const std::string& name) {
    v1::ListTablesResponse list;
    shard_.ListTables(&list);
    for (const auto& t : list.tables()) {
      if (t.config().name() == name) return t.rows();
    }
    return ~uint64_t{0};
  }
  static void ExpectError(const absl::Status& s, absl::StatusCode code,
                          const std::vector<std::string>& fragments) {
    EXPECT_EQ(s.code(), code) << s;
    for (const auto& f : fragments) {
      EXPECT_NE(s.message().find(f), absl::string_view::npos) << "'" << f << "' not in: " << s;
    }
  }

  ShardOptions Options() {
    ShardOptions o;
    o.shard_index = 0;
    o.shard_count = 2;
    o.max_keys_per_request = 1000;
    o.max_message_bytes = 64 * 1024;
    return o;
  }
  Shard shard_{Options()};
  v1::CreateTableResponse created_;
  std::vector<uint64_t> keys_ = OwnedKeys(0, 2, 10);
};

TEST_F(ShardTest, CreatingAnIdenticalTableAgainSucceedsWithoutCreating) {
  v1::CreateTableResponse again;
  ASSERT_OK(shard_.CreateTable(AdagradTable("user", 4), &again));
  EXPECT_FALSE(again.created());
  EXPECT_EQ(again.table().config().dim(), 4u);
}

TEST_F(ShardTest, CreatingAnExistingTableWithAnotherDimFailsNamingBothDims) {
  v1::CreateTableResponse r;
  ExpectError(shard_.CreateTable(AdagradTable("user", 8), &r), absl::StatusCode::kAlreadyExists,
              {"table 'user'", "dim: existing 4, requested 8"});
  v1::TableConfig other = AdagradTable("user", 4);
  other.mutable_optimizer()->mutable_sgd()->set_learning_rate(1);
  ExpectError(shard_.CreateTable(other, &r), absl::StatusCode::kAlreadyExists, {"optimizer"});
}

TEST_F(ShardTest, CreateTableWithoutOptimizerOrWithBadDimIsRejected) {
  v1::CreateTableResponse r;
  v1::TableConfig c = AdagradTable("x", 4);
  c.clear_optimizer();
  ExpectError(shard_.CreateTable(c, &r), absl::StatusCode::kInvalidArgument,
              {"table 'x'", "'optimizer'"});
  ExpectError(shard_.CreateTable(AdagradTable("y", 0), &r), absl::StatusCode::kInvalidArgument,
              {"table 'y'", "'dim'", "received 0"});
  ExpectError(shard_.CreateTable(AdagradTable("bad name!", 4), &r),
              absl::StatusCode::kInvalidArgument, {"'name'"});
}

// Regression: these four named the field but not the value received.
TEST_F(ShardTest, BadOptimizerInitializerAndEvictionValuesAreQuotedInTheError) {
  v1::CreateTableResponse r;
  auto ftrl = [](float l1, float l2) {
    v1::TableConfig c = AdagradTable("f", 4);
    c.mutable_optimizer()->mutable_ftrl()->set_learning_rate(0.1f);
    c.mutable_optimizer()->mutable_ftrl()->set_l1(l1);
    c.mutable_optimizer()->mutable_ftrl()->set_l2(l2);
    return c;
  };
  ExpectError(shard_.CreateTable(ftrl(-0.5f, 0), &r), absl::StatusCode::kInvalidArgument,
              {"table 'f'", "'optimizer.ftrl.l1'", "expected finite >= 0", "received -0.5"});
  ExpectError(shard_.CreateTable(ftrl(0, -2), &r), absl::StatusCode::kInvalidArgument,
              {"table 'f'", "'optimizer.ftrl.l2'", "received -2"});
  v1::TableConfig constant = AdagradTable("c", 4);
  constant.mutable_initializer()->mutable_constant()->set_value(
      std::numeric_limits<float>::infinity());
  ExpectError(shard_.CreateTable(constant, &r), absl::StatusCode::kInvalidArgument,
              {"table 'c'", "'initializer.constant.value'", "expected finite", "received inf"});
  v1::TableConfig eviction = AdagradTable("e", 4);
  eviction.set_capacity(100);
  eviction.set_eviction(static_cast<v1::EvictionPolicy>(7));
  ExpectError(shard_.CreateTable(eviction, &r), absl::StatusCode::kInvalidArgument,
              {"table 'e'", "'eviction'", "EVICTION_POLICY_LRU", "received 7"});
  for (const char* name : {"f", "c", "e"}) EXPECT_EQ(StoredRows(name), ~uint64_t{0}) << name;
}

TEST_F(ShardTest, RmsPropTablesGetDefaultsAndABadRhoIsRefused) {
  v1::CreateTableResponse r;
  v1::TableConfig c = AdagradTable("r", 4);
  c.mutable_optimizer()->mutable_rmsprop()->set_learning_rate(0.01f);
  ASSERT_OK(shard_.CreateTable(c, &r));
  EXPECT_TRUE(r.created());
  EXPECT_EQ(r.table().config().optimizer().rmsprop().rho(), 0.9f);
  EXPECT_EQ(r.table().config().optimizer().rmsprop().epsilon(), 1e-7f);
  c.set_name("bad");
  c.mutable_optimizer()->mutable_rmsprop()->set_rho(1.5f);
  ExpectError(shard_.CreateTable(c, &r), absl::StatusCode::kInvalidArgument,
              {"table 'bad'", "'optimizer.rmsprop.rho'", "expected in [0, 1)", "received 1.5"});
  EXPECT_EQ(StoredRows("bad"), ~uint64_t{0});
}

TEST_F(ShardTest, ListTablesIsSortedAndDropTableRemoves) {
  v1::ListTablesResponse list;
  shard_.ListTables(&list);
  ASSERT_EQ(list.tables_size(), 2);
  EXPECT_EQ(list.tables(0).config().name(), "item");
  EXPECT_EQ(list.tables(1).config().name(), "user");
  ASSERT_OK(shard_.DropTable("item"));
  ExpectError(shard_.DropTable("item"), absl::StatusCode::kNotFound, {"table 'item'"});
  v1::LookupRequest req;
  v1::LookupResponse resp;
  AddLookup(&req, "item", keys_);
  ExpectError(shard_.Lookup(req, &resp), absl::StatusCode::kNotFound, {"table 'item'"});
}

TEST_F(ShardTest, LookupAnswersEveryTableInRequestOrder) {
  v1::LookupRequest req;
  v1::LookupResponse resp;
  AddLookup(&req, "item", keys_);
  AddLookup(&req, "user", {keys_[0], keys_[0]});
  ASSERT_OK(shard_.Lookup(req, &resp));
  ASSERT_EQ(resp.tables_size(), 2);
  EXPECT_EQ(resp.tables(0).table(), "item");
  EXPECT_EQ(resp.tables(0).rows().size(), keys_.size() * 2 * 4);
  EXPECT_EQ(resp.tables(0).missing(), keys_.size());
  EXPECT_EQ(resp.tables(1).dim(), 4u);
  EXPECT_EQ(resp.tables(1).missing(), 1u);  // the repeated key is inserted once
  EXPECT_EQ(StoredRows("item"), keys_.size());
}

TEST_F(ShardTest, ReadOnlyLookupStoresNothing) {
  Rows("user", keys_);
  EXPECT_EQ(StoredRows("user"), 0u);
}

TEST_F(ShardTest, PushAppliesToEveryTableAndReportsCounts) {
  v1::PushRequest req;
  v1::PushResponse resp;
  AddGradients(&req, "item", {keys_[0], keys_[0], keys_[1]}, std::vector<float>(6, 1.0f));
  ASSERT_OK(shard_.Push(req, &resp));
  ASSERT_EQ(resp.tables_size(), 1);
  EXPECT_EQ(resp.tables(0).updated(), 2u);
  EXPECT_EQ(resp.tables(0).inserted(), 2u);
}

TEST_F(ShardTest, ZeroKeysIsAValidEmptyAnswer) {
  v1::LookupRequest req;
  v1::LookupResponse resp;
  AddLookup(&req, "user", {});
  ASSERT_OK(shard_.Lookup(req, &resp));
  ASSERT_EQ(resp.tables_size(), 1);
  EXPECT_TRUE(resp.tables(0).rows().empty());
  v1::PushRequest push;
  v1::PushResponse presp;
  AddGradients(&push, "user", {}, {});
  ASSERT_OK(shard_.Push(push, &presp));
  EXPECT_EQ(presp.tables(0).updated(), 0u);
}

TEST_F(ShardTest, UnknownTableIsNotFoundNamingTheTableAndField) {
  v1::LookupRequest req;
  v1::LookupResponse resp;
  AddLookup(&req, "user", keys_);
  AddLookup(&req, "nope", keys_);
  ExpectError(shard_.Lookup(req, &resp), absl::StatusCode::kNotFound,
              {"table 'nope'", "tables[1].table"});
  EXPECT_EQ(StoredRows("user"), 0u);  // the valid first table was not touched
}

TEST_F(ShardTest, KeyBytesNotAMultipleOfEightAreRejected) {
  v1::LookupRequest req;
  v1::LookupResponse resp;
  AddLookup(&req, "user", keys_);
  req.mutable_tables(0)->mutable_keys()->append("abcde");
  ExpectError(shard_.Lookup(req, &resp), absl::StatusCode::kInvalidArgument,
              {"table 'user'", "'keys'", "multiple of 8", "received 85"});
  EXPECT_EQ(StoredRows("user"), 0u);
}

TEST_F(ShardTest, GradientBytesOfTheWrongSizeAreRejectedAndChangeNothing) {
  v1::PushRequest req;
  v1::PushResponse resp;
  AddGradients(&req, "item", keys_, std::vector<float>(keys_.size() * 2, 1.0f));  // valid
  AddGradients(&req, "user", keys_, std::vector<float>(keys_.size() * 4 - 1, 1.0f));
  ExpectError(shard_.Push(req, &resp), absl::StatusCode::kInvalidArgument,
              {"table 'user'", "'gradients'", "expected 160 bytes", "received 156"});
  EXPECT_EQ(StoredRows("item"), 0u);  // the valid first table was not applied
}

TEST_F(ShardTest, NonFiniteGradientsAreRejectedAndChangeNothing) {
  std::vector<float> before = Rows("item", keys_);
  v1::PushRequest req;
  v1::PushResponse resp;
  std::vector<float> grads(keys_.size() * 2, 0.5f);
  grads[7] = std::numeric_limits<float>::infinity();
  AddGradients(&req, "item", keys_, grads);
  ExpectError(shard_.Push(req, &resp), absl::StatusCode::kInvalidArgument,
              {"table 'item'", "'gradients'", "finite", "row 3"});
  EXPECT_EQ(Rows("item", keys_), before);
  EXPECT_EQ(StoredRows("item"), 0u);
}

// A push as ReceivedExchange hands it over: each table's gradients moved out
// of the message into pieces of `piece_bytes` (the last one shorter), the
// way gRPC's receive buffers cut them (anywhere, inside a row or a float).
struct PushInPieces {
  PushInPieces(v1::PushRequest request, size_t piece_bytes) : message(std::move(request)) {
    for (v1::TableGradients& t : *message.mutable_tables()) {
      bytes.push_back(std::move(*t.mutable_gradients()));
      t.clear_gradients();
    }
    pieces.resize(bytes.size());
    for (size_t i = 0; i < bytes.size(); ++i) {
      for (size_t at = 0; at < bytes[i].size(); at += piece_bytes) {
        pieces[i].push_back(absl::string_view(bytes[i]).substr(at, piece_bytes));
      }
      in_place.push_back(&pieces[i]);
    }
  }
  v1::PushRequest message;
  std::vector<std::string> bytes;
  std::vector<std::vector<absl::string_view>> pieces;
  std::vector<const std::vector<absl::string_view>*> in_place;
};

// Narrow rows split between pieces are packed first, wide ones (dim 128 and
// up in fp32) read by address; either way the rows end as the field's push
// leaves them.
TEST_F(ShardTest, GradientsLeftInPiecesApplyAsTheFieldDoes) {
  // 1: every row and float split; 7: rows split at odd offsets; 1000: one
  // piece per narrow table, several per wide one.
  for (size_t piece_bytes : {size_t{1}, size_t{7}, size_t{1000}}) {
    Shard fields(Options()), pieces(Options());
    for (Shard* s : {&fields, &pieces}) {
      ASSERT_OK(s->CreateTable(AdagradTable("user", 4), &created_));
      ASSERT_OK(s->CreateTable(AdagradTable("item", 2), &created_));
      ASSERT_OK(s->CreateTable(AdagradTable("wide", 128), &created_));
    }
    for (int step = 0; step < 3; ++step) {
      v1::PushRequest req;
      std::vector<float> user(keys_.size() * 4), item(keys_.size() * 2), wide(keys_.size() * 128);
      for (size_t j = 0; j < user.size(); ++j) user[j] = 0.01f * static_cast<float>(j + step);
      for (size_t j = 0; j < item.size(); ++j) item[j] = -0.02f * static_cast<float>(j);
      for (size_t j = 0; j < wide.size(); ++j) wide[j] = 0.001f * static_cast<float>(j % 97);
      AddGradients(&req, "user", keys_, user);
      AddGradients(&req, "item", keys_, item);
      AddGradients(&req, "wide", keys_, wide);
      v1::PushResponse from_fields, from_pieces;
      ASSERT_OK(fields.Push(req, &from_fields));
      PushInPieces in(req, piece_bytes);
      ASSERT_OK(pieces.Push(in.message, &from_pieces, in.in_place));
      EXPECT_EQ(from_pieces.DebugString(), from_fields.DebugString());
    }
    for (const std::string table : {"user", "item", "wide"}) {
      v1::LookupRequest req;
      AddLookup(&req, table, keys_, /*read_only=*/true);
      v1::LookupResponse a, b;
      ASSERT_OK(fields.Lookup(req, &a));
      ASSERT_OK(pieces.Lookup(req, &b));
      EXPECT_EQ(Floats(b.tables(0).rows()), Floats(a.tables(0).rows()))
          << table << ", pieces of " << piece_bytes;
    }
  }
}

TEST_F(ShardTest, GradientPiecesAreJudgedAsTheFieldIsAndChangeNothing) {
  v1::PushRequest short_rows;
  AddGradients(&short_rows, "item", keys_, std::vector<float>(keys_.size() * 2, 1.0f));
  AddGradients(&short_rows, "user", keys_, std::vector<float>(keys_.size() * 4 - 1, 1.0f));
  PushInPieces short_in(short_rows, 7);
  v1::PushResponse resp;
  ExpectError(shard_.Push(short_in.message, &resp, short_in.in_place),
              absl::StatusCode::kInvalidArgument,
              {"table 'user'", "'gradients'", "expected 160 bytes", "received 156"});

  v1::PushRequest not_finite;
  std::vector<float> grads(keys_.size() * 2, 0.5f);
  grads[7] = std::numeric_limits<float>::infinity();
  AddGradients(&not_finite, "item", keys_, grads);
  PushInPieces not_finite_in(not_finite, 7);
  ExpectError(shard_.Push(not_finite_in.message, &resp, not_finite_in.in_place),
              absl::StatusCode::kInvalidArgument, {"table 'item'", "finite", "row 3"});

  ASSERT_OK(shard_.CreateTable(AdagradTable("wide", 128), &created_));
  v1::PushRequest wide_not_finite;
  std::vector<float> wide(keys_.size() * 128, 0.5f);
  wide[5 * 128 + 9] = std::numeric_limits<float>::quiet_NaN();
  AddGradients(&wide_not_finite, "wide", keys_, wide);
  PushInPieces wide_in(wide_not_finite, 1000);
  ExpectError(shard_.Push(wide_in.message, &resp, wide_in.in_place),
              absl::StatusCode::kInvalidArgument, {"table 'wide'", "finite", "row 5", "element 9"});
  EXPECT_EQ(StoredRows("wide"), 0u);

  PushInPieces wrong_count(short_rows, 7);
  wrong_count.in_place.pop_back();
  EXPECT_EQ(shard_.Push(wrong_count.message, &resp, wrong_count.in_place).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(StoredRows("item"), 0u);
  EXPECT_EQ(StoredRows("user"), 0u);
}

TEST_F(ShardTest, MisroutedKeysAreRejectedNamingTheOwnerShard) {
  std::vector<uint64_t> keys = keys_;
  keys.push_back(OwnedKeys(1, 2, 1)[0]);
  v1::LookupRequest req;
  v1::LookupResponse resp;
  AddLookup(&req, "user", keys);
  ExpectError(shard_.Lookup(req, &resp), absl::StatusCode::kInvalidArgument,
              {"table 'user'", "misrouted", "expected shard 1 of 2", "received by shard 0"});
  v1::PushRequest push;
  v1::PushResponse presp;
  AddGradients(&push, "user", keys, std::vector<float>(keys.size() * 4, 1.0f));
  ExpectError(shard_.Push(push, &presp), absl::StatusCode::kInvalidArgument, {"misrouted"});
  EXPECT_EQ(StoredRows("user"), 0u);
}

TEST_F(ShardTest, TooManyKeysIsResourceExhaustedNamingTheLimit) {
  v1::LookupRequest req;
  v1::LookupResponse resp;
  AddLookup(&req, "item", OwnedKeys(0, 2, 600));
  AddLookup(&req, "user", OwnedKeys(0, 2, 600));
  ExpectError(shard_.Lookup(req, &resp), absl::StatusCode::kResourceExhausted,
              {"1200 keys", "limit", "1000"});
}

TEST_F(ShardTest, PeekAnswersRowsAndAskedStateWithoutStoringAndRefusesABadMask) {
  v1::CreateTableResponse r;
  ASSERT_OK(shard_.CreateTable(AdagradTable("peeked", 4), &r));
  const std::vector<uint64_t> keys = OwnedKeys(0, 2, 3);
  v1::ExchangeRequest ex;
  AddLookup(ex.mutable_peek(), "peeked", keys);
  ex.mutable_peek()->mutable_tables(0)->set_with_state(std::string("\1\0\1", 3));
  v1::ExchangeResponse resp;
  ASSERT_OK(shard_.Exchange(ex, &resp));
  ASSERT_EQ(resp.peek().tables_size(), 1);
  const v1::TableRows& t = resp.peek().tables(0);
  EXPECT_TRUE(t.replayable());
  EXPECT_EQ(t.rows().size(), 3u * 4 * 4);
  EXPECT_EQ(t.state().size(), 2u * 4 * 4) << "Adagrad's accumulator of the two keys asked for";
  EXPECT_EQ(t.stored(), std::string(3, '\0'));
  EXPECT_EQ(resp.peek().other_workers(), 0u);
  EXPECT_EQ(StoredRows("peeked"), 0u) << "a peek stores nothing";
  // A capacity makes rows change without pushes: not replayable, no rows.
  v1::TableConfig bounded = AdagradTable("bounded", 4);
  bounded.set_capacity(100);
  bounded.set_eviction(v1::EVICTION_POLICY_LRU);
  ASSERT_OK(shard_.CreateTable(bounded, &r));
  v1::ExchangeRequest ex2;
  AddLookup(ex2.mutable_peek(), "bounded", keys);
  v1::ExchangeResponse resp2;
  ASSERT_OK(shard_.Exchange(ex2, &resp2));
  EXPECT_FALSE(resp2.peek().tables(0).replayable());
  EXPECT_TRUE(resp2.peek().tables(0).rows().empty());
  // A mask of the wrong length changes nothing and says what it expected.
  ex.mutable_peek()->mutable_tables(0)->set_with_state(std::string("\1", 1));
  ExpectError(shard_.Exchange(ex, &resp), absl::StatusCode::kInvalidArgument,
              {"'peeked'", "with_state", "expected 3 bytes", "received 1"});
  EXPECT_EQ(StoredRows("peeked"), 0u);
}

// A synchronous trainer peeks step t + 1's rows while t computes, then asks
// after the barrier only for the rows pushes of step t wrote since.
TEST_F(ShardTest, LookupOfChangedRowsAnswersOnlyRowsPushedSinceThePeekOrEveryRowIfItCannotTell) {
  v1::CreateTableResponse r;
  ASSERT_OK(shard_.CreateTable(AdagradTable("changed", 4), &r));
  v1::RegisterWorkerRequest reg;
  v1::RegisterWorkerResponse registered;
  for (uint32_t w : {1u, 2u}) {
    reg.set_worker_id(w);
    ASSERT_OK(shard_.RegisterWorker(reg, &registered));
  }
  const std::vector<uint64_t> keys = OwnedKeys(0, 2, 6);
  auto push = [&](uint32_t worker, int64_t step, std::vector<uint64_t> pushed) {
    v1::PushRequest p;
    p.set_worker_id(worker);
    p.set_step(step);
    AddGradients(&p, "changed", pushed, std::vector<float>(pushed.size() * 4, 0.5f));
    v1::PushResponse resp;
    ASSERT_OK(shard_.Push(p, &resp));
  };
  push(1, 0, keys);
  push(2, 0, keys);
  // Step 2's peek: every push of step 0 is in.
  v1::ExchangeRequest peek;
  AddLookup(peek.mutable_peek(), "changed", keys);
  peek.mutable_peek()->set_step(2);
  peek.mutable_peek()->set_staleness(1);
  peek.mutable_peek()->set_worker_id(1);
  v1::ExchangeResponse peeked;
  ASSERT_OK(shard_.Exchange(peek, &peeked));
  EXPECT_EQ(peeked.peek().other_workers(), 1u);
  const std::vector<float> before = Floats(peeked.peek().tables(0).rows());
  // Step 1: worker 2 writes keys 0 and 3, worker 1 key 5.
  push(2, 1, {keys[0], keys[3]});
  push(1, 1, {keys[5]});
  v1::LookupRequest ask;
  AddLookup(&ask, "changed", keys);
  ask.set_step(2);
  ask.set_staleness(0);
  ask.set_worker_id(1);
  ask.mutable_tables(0)->set_changed_since(1);
  ask.mutable_tables(0)->set_write_log(peeked.peek().write_log());
  v1::LookupResponse changed;
  ASSERT_OK(shard_.Lookup(ask, &changed));
  EXPECT_EQ(changed.tables(0).changed(), std::string("\1\0\0\1\0\1", 6));
  // The rows it holds are those of a plain lookup now; the others as peeked.
  v1::LookupRequest plain = ask;
  plain.mutable_tables(0)->clear_changed_since();
  v1::LookupResponse all;
  ASSERT_OK(shard_.Lookup(plain, &all));
  const std::vector<float> now = Floats(all.tables(0).rows());
  const std::vector<float> got = Floats(changed.tables(0).rows());
  ASSERT_EQ(got.size(), 3u * 4);
  size_t j = 0;
  for (size_t k = 0; k < keys.size(); ++k) {
    const bool in = changed.tables(0).changed()[k] != 0;
    for (size_t e = 0; e < 4; ++e) {
      if (in) {
        EXPECT_EQ(got[j * 4 + e], now[k * 4 + e]) << k;
      } else {
        EXPECT_EQ(before[k * 4 + e], now[k * 4 + e]) << "key " << k << " changed unrecorded";
      }
    }
    j += in;
  }
  // Cannot tell: a token from before an unrecorded change (a table created
  // since), or a table whose rows change without pushes: every row.
  ASSERT_OK(shard_.CreateTable(AdagradTable("other", 4), &r));
  v1::LookupResponse after_create;
  ASSERT_OK(shard_.Lookup(ask, &after_create));
  EXPECT_TRUE(after_create.tables(0).changed().empty());
  EXPECT_EQ(after_create.tables(0).rows().size(), keys.size() * 4 * 4);
  v1::ExchangeResponse peeked_again;
  ASSERT_OK(shard_.Exchange(peek, &peeked_again));
  push(9, 5, {keys[1]});  // a worker the clock does not track: not recorded
  ask.mutable_tables(0)->set_write_log(peeked_again.peek().write_log());
  v1::LookupResponse after_untracked;
  ASSERT_OK(shard_.Lookup(ask, &after_untracked));
  EXPECT_TRUE(after_untracked.tables(0).changed().empty());
  EXPECT_EQ(after_untracked.tables(0).rows().size(), keys.size() * 4 * 4);
  v1::TableConfig bounded = AdagradTable("bounded", 4);
  bounded.set_capacity(100);
  bounded.set_eviction(v1::EVICTION_POLICY_LRU);
  ASSERT_OK(shard_.CreateTable(bounded, &r));
  v1::LookupRequest ask_bounded;
  AddLookup(&ask_bounded, "bounded", keys);
  ask_bounded.mutable_tables(0)->set_changed_since(0);
  v1::LookupResponse bounded_rows;
  ASSERT_OK(shard_.Lookup(ask_bounded, &bounded_rows));
  EXPECT_TRUE(bounded_rows.tables(0).changed().empty());
  EXPECT_EQ(bounded_rows.tables(0).rows().size(), keys.size() * 4 * 4);
  // A negative step changes nothing and says what it expected.
  const uint64_t stored = StoredRows("bounded");
  ask_bounded.mutable_tables(0)->set_changed_since(-1);
  v1::LookupResponse refused;
  ExpectError(shard_.Lookup(ask_bounded, &refused), absl::StatusCode::kInvalidArgument,
              {"'bounded'", "changed_since", "expected >= 0", "received -1"});
  EXPECT_EQ(StoredRows("bounded"), stored);
}

TEST_F(ShardTest, OversizedResponseIsRefusedBeforeAnyWork) {
  v1::CreateTableResponse r;
  ASSERT_OK(shard_.CreateTable(AdagradTable("wide", 1024), &r));
  v1::LookupRequest req;
  v1::LookupResponse resp;
  AddLookup(&req, "wide", OwnedKeys(0, 2, 20));  // 20 x 4 KiB > 64 KiB
  ExpectError(shard_.Lookup(req, &resp), absl::StatusCode::kResourceExhausted,
              {"up to 81967 bytes", "limit", "65536"});
  EXPECT_EQ(StoredRows("wide"), 0u);
}

// Regression: only the rows were counted, so an answer over the limit by its
// framing alone passed the check, gRPC then refused to send it, and the
// missing keys had been inserted.
TEST(ShardMessageLimitTest, AnswersOverTheLimitByFramingAreRefusedBeforeAnyInsert) {
  ShardOptions o;
  o.max_message_bytes = 64 * 1024;
  Shard shard(o);
  v1::CreateTableResponse created;
  ASSERT_OK(shard.CreateTable(AdagradTable("t", 8), &created));
  auto stored = [&] {
    v1::ListTablesResponse list;
    shard.ListTables(&list);
    return list.tables(0).rows();
  };
  // 2048 keys x 32 bytes: the rows alone are exactly the limit.
  v1::LookupRequest exact;
  AddLookup(&exact, "t", OwnedKeys(0, 1, 2048));
  v1::LookupResponse resp;
  absl::Status s = shard.Lookup(exact, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("limit max_message_bytes is 65536"), std::string::npos) << s;
  v1::ExchangeRequest exchange;
  *exchange.mutable_lookup() = exact;
  v1::ExchangeResponse exchanged;
  EXPECT_EQ(shard.Exchange(exchange, &exchanged).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(stored(), 0u);
  // Answers that pass the check fit the limit, framing included.
  for (const size_t n : {1, 100, 1000, 2030}) {
    v1::LookupRequest req;
    AddLookup(&req, "t", OwnedKeys(0, 1, n, 1 + 10000 * n));
    v1::LookupResponse fits;
    ASSERT_OK(shard.Lookup(req, &fits)) << n;
    EXPECT_LE(fits.ByteSizeLong(), o.max_message_bytes) << n;
  }
}

TEST(ShardLimitsTest, MaxTablesRefusesTheNextTableNamingTheLimit) {
  ShardOptions o;
  o.max_tables = 2;
  Shard shard(o);
  v1::CreateTableResponse r;
  ASSERT_OK(shard.CreateTable(AdagradTable("a", 4), &r));
  ASSERT_OK(shard.CreateTable(AdagradTable("b", 4), &r));
  absl::Status s = shard.CreateTable(AdagradTable("c", 4), &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("table 'c': the shard holds 2 tables, limit max_tables is 2"),
            std::string::npos) << s;
  ASSERT_OK(shard.CreateTable(AdagradTable("a", 4), &r));  // an existing one: idempotent
  ASSERT_OK(shard.DropTable("b"));
  ASSERT_OK(shard.CreateTable(AdagradTable("c", 4), &r));
}

TEST(ShardLimitsTest, MaxRowsRefusesRequestsThatWouldInsertPastItAndChangesNothing) {
  ShardOptions o;
  o.max_rows = 10;
  Shard shard(o);
  v1::CreateTableResponse created;
  ASSERT_OK(shard.CreateTable(AdagradTable("a", 4), &created));
  ASSERT_OK(shard.CreateTable(AdagradTable("b", 4), &created));
  auto rows = [&] {
    v1::ListTablesResponse list;
    shard.ListTables(&list);
    uint64_t n = 0;
    for (const auto& t : list.tables()) n += t.rows();
    return n;
  };
  auto lookup = [&](const std::string& table, const std::vector<uint64_t>& keys,
                    bool read_only = false) {
    v1::LookupRequest req;
    AddLookup(&req, table, keys, read_only);
    v1::LookupResponse resp;
    return shard.Lookup(req, &resp);
  };
  ASSERT_OK(lookup("a", {1, 2, 3, 4, 5, 6}));
  ASSERT_OK(lookup("b", {1, 2}));
  ASSERT_EQ(rows(), 8u);
  absl::Status s = lookup("b", {3, 4, 5});  // 8 + 3 > 10
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("the shard holds 8 rows and the request would add 3, limit "
                             "max_rows is 10"), std::string::npos) << s;
  EXPECT_EQ(rows(), 8u);
  ASSERT_OK(lookup("b", {3, 4, 5}, /*read_only=*/true));  // inserts nothing
  ASSERT_OK(lookup("a", {1, 2, 3, 4, 5, 6, 7}));          // stored keys and one new: 9
  auto row_of_key_1 = [&] {
    v1::LookupRequest req;
    AddLookup(&req, "a", {1}, /*read_only=*/true);
    v1::LookupResponse resp;
    EXPECT_OK(shard.Lookup(req, &resp));
    return Floats(resp.tables(0).rows());
  };
  const std::vector<float> before = row_of_key_1();
  v1::PushRequest push;  // key 1 is stored; 20 and 21 are new: 9 + 2 > 10
  AddGradients(&push, "a", {1, 20, 21}, std::vector<float>(12, 0.5f));
  v1::PushResponse pushed;
  s = shard.Push(push, &pushed);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(rows(), 9u);
  EXPECT_EQ(row_of_key_1(), before) << "the refused push changed a stored row";
  v1::PushRequest fits;
  AddGradients(&fits, "a", {1, 20}, std::vector<float>(8, 0.5f));  // one new: 10
  ASSERT_OK(shard.Push(fits, &pushed));
  EXPECT_EQ(rows(), 10u);
}

TEST_F(ShardTest, ATableTwiceInOneRequestIsRejected) {
  v1::LookupRequest req;
  v1::LookupResponse resp;
  AddLookup(&req, "user", keys_);
  AddLookup(&req, "user", keys_);
  ExpectError(shard_.Lookup(req, &resp), absl::StatusCode::kInvalidArgument,
              {"table 'user'", "tables[1].table", "once"});
}

TEST_F(ShardTest, UnknownDtypeAndNegativeStepAreRejected) {
  v1::LookupRequest req;
  v1::LookupResponse resp;
  AddLookup(&req, "user", keys_);
  req.mutable_tables(0)->set_dtype(static_cast<v1::DType>(9));
  ExpectError(shard_.Lookup(req, &resp), absl::StatusCode::kInvalidArgument,
              {"table 'user'", "'dtype'", "received 9"});
  v1::PushRequest push;
  v1::PushResponse presp;
  push.set_step(-1);
  ExpectError(shard_.Push(push, &presp), absl::StatusCode::kInvalidArgument, {"'step'", "-1"});
}

TEST_F(ShardTest, ConcurrentTrafficWhileTablesAreCreatedAndDroppedNeverFails) {
  constexpr int kTrafficThreads = 3, kIterations = 100;
  std::atomic<int> running{kTrafficThreads}, unexpected{0}, admin_rounds{0};
  std::thread admin([&] {
    // Create and drop until the traffic is done (bounded in count).
    for (int i = 0; running > 0 && i < 100000; ++i) {
      v1::CreateTableResponse r;
      if (!shard_.CreateTable(AdagradTable("tmp", 4), &r).ok()) ++unexpected;
      if (!shard_.DropTable("tmp").ok()) ++unexpected;
      ++admin_rounds;
    }
  });
  std::vector<std::thread> traffic;
  for (int t = 0; t < kTrafficThreads; ++t) {
    traffic.emplace_back([&] {
      for (int i = 0; i < kIterations; ++i) {
        v1::PushRequest push;
        v1::PushResponse presp;
        AddGradients(&push, "user", keys_, std::vector<float>(keys_.size() * 4, 0.1f));
        if (!shard_.Push(push, &presp).ok()) ++unexpected;
        v1::LookupRequest req;
        v1::LookupResponse resp;
        AddLookup(&req, "tmp", keys_);
        absl::Status s = shard_.Lookup(req, &resp);
        if (!s.ok() && s.code() != absl::StatusCode::kNotFound) ++unexpected;
      }
      --running;
    });
  }
  for (auto& t : traffic) t.join();
  admin.join();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GT(admin_rounds.load(), 0);
  EXPECT_EQ(StoredRows("user"), keys_.size());
}

// Random, mostly malformed requests (fixed seed): none may crash the shard,
// and every rejected one must leave the stored rows exactly as they were.
TEST_F(ShardTest, RandomMalformedRequestsNeverCrashAndRejectedOnesChangeNothing) {
  std::mt19937_64 rng(20261202);
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  const std::vector<std::string> names = {"user", "item", "nope", ""};
  const std::vector<uint64_t> mine = OwnedKeys(0, 2, 50), theirs = OwnedKeys(1, 2, 5);
  auto random_keys = [&] {
    std::vector<uint64_t> keys;
    for (int i = pick(12); i > 0; --i) {
      keys.push_back(pick(10) == 0 ? theirs[pick(5)] : mine[pick(50)]);
    }
    std::string bytes = PackKeys(keys);
    if (pick(6) == 0) bytes.resize(pick(static_cast<int>(bytes.size()) + 9));
    return bytes;
  };
  auto random_floats = [&](size_t n) {
    std::vector<float> v(n);
    for (float& f : v) {
      const int r = pick(50);
      f = r == 0 ? std::numeric_limits<float>::quiet_NaN()
                 : r == 1 ? std::numeric_limits<float>::infinity() : 0.01f * (pick(200) - 100);
    }
    std::string bytes(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    if (pick(6) == 0) bytes.resize(pick(static_cast<int>(bytes.size()) + 5));
    return bytes;
  };
  int ok = 0, rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    const uint64_t user_before = StoredRows("user"), item_before = StoredRows("item");
    std::vector<float> rows_before = Rows("user", mine);
    absl::Status status;
    if (pick(2) == 0) {
      v1::LookupRequest req;
      v1::LookupResponse resp;
      for (int t = pick(3); t >= 0; --t) {
        v1::TableLookup* tl = req.add_tables();
        tl->set_table(names[pick(4)]);
        tl->set_keys(random_keys());
        tl->set_dtype(static_cast<v1::DType>(pick(5)));
        tl->set_read_only(pick(2) == 0);
      }
      status = shard_.Lookup(req, &resp);
    } else {
      v1::PushRequest req;
      v1::PushResponse resp;
      req.set_step(pick(10) == 0 ? -1 : pick(100));
      for (int t = pick(3); t >= 0; --t) {
        v1::TableGradients* tg = req.add_tables();
        tg->set_table(names[pick(4)]);
        tg->set_keys(random_keys());
        const size_t n = tg->keys().size() / 8 + (pick(8) == 0 ? 1 : 0);
        tg->set_gradients(random_floats(n * (tg->table() == "item" ? 2 : 4)));
      }
      status = shard_.Push(req, &resp);
    }
    if (status.ok()) {
      ++ok;
      continue;
    }
    ++rejected;
    ASSERT_TRUE(status.code() == absl::StatusCode::kInvalidArgument ||
                status.code() == absl::StatusCode::kNotFound ||
                status.code() == absl::StatusCode::kResourceExhausted)
        << status;
    ASSERT_EQ(StoredRows("user"), user_before) << status;
    ASSERT_EQ(StoredRows("item"), item_before) << status;
    ASSERT_EQ(Rows("user", mine), rows_before) << status;
  }
  // The generator produces both kinds, or the test proves little.
  EXPECT_GT(ok, 100);
  EXPECT_GT(rejected, 100);
}

TEST(ShardOptionsTest, InvalidOptionsAreRejected) {
  ShardOptions o;
  o.shard_count = 2;
  o.shard_index = 2;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.shard_count = 0;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ember::testing
