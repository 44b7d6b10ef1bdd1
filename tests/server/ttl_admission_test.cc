// TTL and admission through the shard: configuration, background expiry by
// steps and by seconds, and the counts a user sees in ListTables.
#include "shard/shard.h"

#include "gtest/gtest.h"
#include "tests/server/requests.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

ShardOptions OneShard() { return ShardOptions{}; }

v1::TableInfo Info(Shard& shard, const std::string& name) {
  v1::ListTablesResponse list;
  shard.ListTables(&list);
  for (const auto& t : list.tables()) {
    if (t.config().name() == name) return t;
  }
  ADD_FAILURE() << "no table " << name;
  return {};
}

absl::Status Push(Shard& shard, uint32_t worker, int64_t step, const std::vector<uint64_t>& keys) {
  v1::PushRequest req;
  req.set_worker_id(worker);
  req.set_step(step);
  AddGradients(&req, "t", keys, std::vector<float>(keys.size() * 2, 0.5f));
  v1::PushResponse resp;
  return shard.Push(req, &resp);
}

absl::Status Lookup(Shard& shard, const std::vector<uint64_t>& keys) {
  v1::LookupRequest req;
  AddLookup(&req, "t", keys);
  v1::LookupResponse resp;
  return shard.Lookup(req, &resp);
}

std::vector<uint64_t> Keys(uint64_t begin, uint64_t end) {
  std::vector<uint64_t> k;
  for (uint64_t i = begin; i < end; ++i) k.push_back(i);
  return k;
}

TEST(ShardTtlTest, RowsUntouchedForMoreThanTtlStepsExpireWithExactCounts) {
  Shard shard(OneShard());
  v1::TableConfig c = AdagradTable("t", 2);
  c.mutable_ttl()->set_steps(3);
  v1::CreateTableResponse created;
  ASSERT_OK(shard.CreateTable(c, &created));
  v1::RegisterWorkerRequest reg;
  v1::RegisterWorkerResponse registered;
  ASSERT_OK(shard.RegisterWorker(reg, &registered));
  // Step 0 touches 10 "old" keys; steps 1..8 touch 5 "live" keys each time.
  // The TTL time advances as the background tick would, after every step.
  ASSERT_OK(Push(shard, 0, 0, Keys(100, 110)));
  EXPECT_EQ(shard.ExpireRows(absl::ZeroDuration()), 0u);
  uint64_t expired = 0;
  for (int64_t step = 1; step <= 8; ++step) {
    ASSERT_OK(Push(shard, 0, step, Keys(0, 5)));
    expired += shard.ExpireRows(absl::ZeroDuration());
    // The old rows (stamped 0) go once the latest step exceeds 0 + 3.
    EXPECT_EQ(Info(shard, "t").rows(), step <= 3 ? 15u : 5u) << "after step " << step;
  }
  EXPECT_EQ(expired, 10u);
  EXPECT_EQ(Info(shard, "t").expired(), 10u);
}

TEST(ShardTtlTest, RowsUntouchedForMoreThanTtlSecondsExpire) {
  Shard shard(OneShard());
  v1::TableConfig c = AdagradTable("t", 2);
  c.mutable_ttl()->set_seconds(10);
  v1::CreateTableResponse created;
  ASSERT_OK(shard.CreateTable(c, &created));
  shard.ExpireRows(absl::Seconds(0));
  ASSERT_OK(Lookup(shard, Keys(0, 20)));
  shard.ExpireRows(absl::Seconds(6));
  ASSERT_OK(Lookup(shard, Keys(0, 4)));  // touched again at 6 s
  EXPECT_EQ(shard.ExpireRows(absl::Seconds(10)), 0u);
  EXPECT_EQ(shard.ExpireRows(absl::Seconds(11)), 16u);  // stamped 0 < 11 - 10
  EXPECT_EQ(shard.ExpireRows(absl::Seconds(16)), 0u);
  EXPECT_EQ(shard.ExpireRows(absl::Seconds(17)), 4u);
  EXPECT_EQ(Info(shard, "t").expired(), 20u);
  EXPECT_EQ(Info(shard, "t").rows(), 0u);
}

TEST(ShardAdmissionTest, CountsReachListTablesAndOffHasOneSpelling) {
  Shard shard(OneShard());
  v1::TableConfig c = AdagradTable("t", 2);
  c.mutable_admission()->set_min_count(2);
  v1::CreateTableResponse created;
  ASSERT_OK(shard.CreateTable(c, &created));
  EXPECT_EQ(created.table().config().admission().sketch_width(), 262144u);  // the default
  ASSERT_OK(Lookup(shard, Keys(0, 10)));
  ASSERT_OK(Push(shard, 0, 0, Keys(0, 10)));
  ASSERT_OK(Lookup(shard, Keys(0, 4)));
  v1::TableInfo info = Info(shard, "t");
  EXPECT_EQ(info.rows(), 4u);
  EXPECT_EQ(info.admission_rejected(), 10u);
  EXPECT_EQ(info.admission_dropped(), 10u);

  // min_count 1 is "off", the same table as no admission at all.
  v1::TableConfig off = AdagradTable("u", 2);
  off.mutable_admission()->set_min_count(1);
  ASSERT_OK(shard.CreateTable(off, &created));
  EXPECT_FALSE(created.table().config().has_admission());
  ASSERT_OK(shard.CreateTable(AdagradTable("u", 2), &created));
  EXPECT_FALSE(created.created());
}

TEST(ShardTtlTest, BadTtlAndAdmissionSettingsAreRefusedQuotingTheValues) {
  Shard shard(OneShard());
  v1::CreateTableResponse created;
  v1::TableConfig both = AdagradTable("t", 2);
  both.mutable_ttl()->set_seconds(5);
  both.mutable_ttl()->set_steps(5);
  absl::Status s = shard.CreateTable(both, &created);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("table 't' field 'ttl'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("received seconds 5 and steps 5"), std::string::npos) << s;
  v1::TableConfig width = AdagradTable("t", 2);
  width.mutable_admission()->set_min_count(3);
  width.mutable_admission()->set_sketch_width(1000);
  s = shard.CreateTable(width, &created);
  EXPECT_NE(s.message().find("field 'admission.sketch_width'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("received 1000"), std::string::npos) << s;
  v1::TableConfig count = AdagradTable("t", 2);
  count.mutable_admission()->set_min_count(70000);
  s = shard.CreateTable(count, &created);
  EXPECT_NE(s.message().find("received 70000"), std::string::npos) << s;
  // A different TTL is a different table.
  v1::TableConfig ttl = AdagradTable("t", 2);
  ttl.mutable_ttl()->set_steps(4);
  ASSERT_OK(shard.CreateTable(ttl, &created));
  ttl.mutable_ttl()->set_steps(5);
  s = shard.CreateTable(ttl, &created);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("ttl: existing steps: 4, requested steps: 5"), std::string::npos) << s;
}

TEST(ShardTtlTest, TtlOnTheCudaStoreIsRefusedAtCreation) {
  ShardOptions o;
  o.device.kind = StoreDevice::Kind::kCuda;
  Shard shard(o);
  v1::TableConfig c = AdagradTable("t", 2);
  c.mutable_ttl()->set_steps(3);
  v1::CreateTableResponse created;
  absl::Status s = shard.CreateTable(c, &created);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("field 'ttl'"), std::string::npos) << s;
}

}  // namespace
}  // namespace ember::testing
