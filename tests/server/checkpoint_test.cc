// Checkpoints of the shard core, without a network: the cut at a step,
// restore into a fresh shard, deltas, and every way a checkpoint on disk
// can be wrong (refused, naming the file and what is wrong).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "shard/checkpoint_format.h"
#include "shard/checkpointer.h"
#include "tests/server/requests.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

ShardOptions Options(uint32_t index = 0, uint32_t count = 2) {
  ShardOptions o;
  o.shard_index = index;
  o.shard_count = count;
  return o;
}

std::string BaseNameOf(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

std::string FreshDir(const std::string& name) {
  const std::string dir = JoinPath(::testing::TempDir(), name);
  EXPECT_OK(FileSystem::Posix()->RemoveAll(dir));
  return dir;
}

// One push of `worker` at `step`: every table gets the same keys, gradient
// values depending on (step, key, element).
absl::Status PushStep(Shard& shard, uint32_t worker, int64_t step,
                      const std::vector<std::string>& tables, const std::vector<uint64_t>& keys) {
  v1::PushRequest req;
  req.set_worker_id(worker);
  req.set_step(step);
  for (const std::string& t : tables) {
    std::vector<float> g(keys.size() * 5);
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = 0.01f * static_cast<float>(static_cast<int>((step * 31 + keys[i / 5] + i) % 17) - 8);
    }
    AddGradients(&req, t, keys, g);
  }
  v1::PushResponse resp;
  return shard.Push(req, &resp);
}

// A shard's tables as a full snapshot sees them: per table, per key, the
// values, state and step (scores are left out: lookups move them).
using Row = std::tuple<std::vector<float>, std::vector<float>, uint32_t>;
using Contents = std::map<std::string, std::map<uint64_t, Row>>;
// `as_is`: read without a cut (workers at different steps never reach one).
Contents ContentsOf(Shard& shard, bool as_is = false) {
  absl::StatusOr<ShardSnapshot> snap =
      shard.Snapshot(std::nullopt, false, absl::InfiniteFuture(), as_is);
  EXPECT_OK(snap);
  Contents out;
  if (!snap.ok()) return out;
  for (const auto& t : snap->tables) {
    auto& rows = out[t.config.name()];
    const size_t dim = t.config.dim();
    for (const SnapshotBatch& b : t.batches) {
      const size_t n = b.rows.keys.size();
      const size_t sf = n == 0 ? 0 : b.rows.state.size() / n;
      for (size_t i = 0; i < n; ++i) {
        rows[b.rows.keys[i]] = Row{
            {b.rows.values.begin() + i * dim, b.rows.values.begin() + (i + 1) * dim},
            {b.rows.state.begin() + i * sf, b.rows.state.begin() + (i + 1) * sf},
            b.rows.steps[i]};
      }
    }
  }
  return out;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto& c : EveryOptimizerAndDtype(5)) {
      v1::CreateTableResponse r;
      ASSERT_OK(shard_.CreateTable(c, &r));
      tables_.push_back(c.name());
    }
    v1::RegisterWorkerRequest reg;
    v1::RegisterWorkerResponse resp;
    for (uint32_t w : {0u, 1u}) {
      reg.set_worker_id(w);
      ASSERT_OK(shard_.RegisterWorker(reg, &resp));
    }
  }
  CheckpointerOptions Opts() {
    CheckpointerOptions o;
    o.directory = dir_;
    o.keep = 0;
    return o;
  }
  // Steps [begin, end) of both workers, each worker on its own keys.
  void Train(int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      for (uint32_t w : {0u, 1u}) ASSERT_OK(PushStep(shard_, w, s, tables_, KeysOf(w, s)));
    }
  }
  // Worker w's keys at step s: a sliding window, so rows keep being added.
  std::vector<uint64_t> KeysOf(uint32_t w, int64_t s) {
    std::vector<uint64_t> all = OwnedKeys(0, 2, 400, 1 + w * 100000);
    return {all.begin() + (s * 7) % 300, all.begin() + (s * 7) % 300 + 40};
  }
  absl::StatusOr<v1::CheckpointResponse> Take(Checkpointer& c, bool incremental = false,
                                              std::optional<int64_t> step = std::nullopt) {
    v1::CheckpointRequest req;
    req.set_incremental(incremental);
    if (step) req.set_step(*step);
    v1::CheckpointResponse resp;
    absl::Status s = c.Checkpoint(req, absl::Now() + absl::Seconds(10), &resp);
    if (!s.ok()) return s;
    return resp;
  }
  // Trains steps 0-2 and takes a full checkpoint, then 3-5 and a delta on it.
  void TakeFullAndDelta(Checkpointer& c, v1::CheckpointResponse* full,
                        v1::CheckpointResponse* delta) {
    Train(0, 3);
    absl::StatusOr<v1::CheckpointResponse> f = Take(c);
    ASSERT_OK(f);
    Train(3, 6);
    absl::StatusOr<v1::CheckpointResponse> d = Take(c, /*incremental=*/true);
    ASSERT_OK(d);
    ASSERT_EQ(d->manifest().kind(), v1::CHECKPOINT_KIND_DELTA);
    *full = *std::move(f);
    *delta = *std::move(d);
  }
  // A fresh shard restored from `what` by a checkpointer on the same directory.
  absl::StatusOr<std::unique_ptr<Shard>> Restored(const std::string& what,
                                                  ShardOptions options = Options()) {
    auto shard = std::make_unique<Shard>(options);
    Checkpointer c(shard.get(), Opts());
    absl::StatusOr<std::string> from = c.Restore(what);
    if (!from.ok()) return from.status();
    return shard;
  }

  const std::string dir_ = FreshDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  Shard shard_{Options()};
  std::vector<std::string> tables_;
};

TEST_F(CheckpointTest, RestoreReproducesEveryTableRowStateAndClock) {
  Checkpointer checkpointer(&shard_, Opts());
  Train(0, 30);
  auto taken = Take(checkpointer);
  ASSERT_OK(taken);
  EXPECT_EQ(taken->manifest().step(), 29);
  EXPECT_EQ(taken->manifest().kind(), v1::CHECKPOINT_KIND_FULL);
  EXPECT_EQ(taken->manifest().tables_size(), static_cast<int>(EveryOptimizerAndDtype(5).size()));

  auto restored = Restored("latest");
  ASSERT_OK(restored);
  EXPECT_EQ(ContentsOf(**restored), ContentsOf(shard_));
  v1::GetShardInfoResponse info;
  (*restored)->GetShardInfo(&info);
  ASSERT_EQ(info.workers_size(), 2);
  EXPECT_EQ(info.workers(0).applied_step(), 29);
  EXPECT_EQ(info.workers(1).applied_step(), 29);
  EXPECT_EQ(info.restored_from(), taken->path());
  // Training continues on the restored shard exactly as on the original.
  Train(30, 40);
  for (int64_t s = 30; s < 40; ++s) {
    for (uint32_t w : {0u, 1u}) ASSERT_OK(PushStep(**restored, w, s, tables_, KeysOf(w, s)));
  }
  EXPECT_EQ(ContentsOf(**restored), ContentsOf(shard_));
}

TEST_F(CheckpointTest, CutHoldsExactlyThePushesUpToItsStepWhileWorkersRun) {
  Checkpointer checkpointer(&shard_, Opts());
  // Two workers push steps 0..59 concurrently; the checkpoint cuts at 20.
  std::atomic<bool> go{false};
  std::vector<std::thread> workers;
  for (uint32_t w : {0u, 1u}) {
    workers.emplace_back([&, w] {
      while (!go) std::this_thread::yield();
      for (int64_t s = 0; s < 60; ++s) EXPECT_OK(PushStep(shard_, w, s, tables_, KeysOf(w, s)));
    });
  }
  go = true;
  auto taken = Take(checkpointer, false, 20);
  for (auto& t : workers) t.join();
  ASSERT_OK(taken);
  EXPECT_EQ(taken->manifest().step(), 20);

  // The reference: a shard that only ever saw steps 0..20.
  Shard reference(Options());
  for (const auto& c : EveryOptimizerAndDtype(5)) {
    v1::CreateTableResponse r;
    ASSERT_OK(reference.CreateTable(c, &r));
  }
  for (int64_t s = 0; s <= 20; ++s) {
    for (uint32_t w : {0u, 1u}) ASSERT_OK(PushStep(reference, w, s, tables_, KeysOf(w, s)));
  }
  auto restored = Restored(taken->path());
  ASSERT_OK(restored);
  EXPECT_EQ(ContentsOf(**restored), ContentsOf(reference));
}

TEST_F(CheckpointTest, StepAWorkerAlreadyPassedIsRefusedAndWritesNothing) {
  Checkpointer checkpointer(&shard_, Opts());
  Train(0, 10);
  auto taken = Take(checkpointer, false, 5);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kFailedPrecondition) << taken.status();
  EXPECT_NE(taken.status().message().find("has already pushed step 9"), std::string::npos)
      << taken.status();
  EXPECT_TRUE(ListCheckpointDirectory(FileSystem::Posix(), dir_).valid.empty());
}

TEST_F(CheckpointTest, BadIdOrNegativeStepIsRefusedNamingTheField) {
  Checkpointer checkpointer(&shard_, Opts());
  v1::CheckpointRequest req;
  v1::CheckpointResponse resp;
  req.set_step(-3);
  absl::Status s = checkpointer.Checkpoint(req, absl::Now(), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("field 'step': expected >= 0, received -3"), std::string::npos) << s;
  const std::vector<std::string> bad_ids = {"../escape", ".hidden", "a/b", std::string(129, 'x')};
  for (const std::string& id : bad_ids) {
    v1::CheckpointRequest bad;
    bad.set_id(id);
    s = checkpointer.Checkpoint(bad, absl::Now(), &resp);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_NE(s.message().find("field 'id'"), std::string::npos) << s;
  }
  Train(0, 2);
  v1::CheckpointRequest named;
  named.set_id("mine");
  ASSERT_OK(checkpointer.Checkpoint(named, absl::Now() + absl::Seconds(5), &resp));
  s = checkpointer.Checkpoint(named, absl::Now() + absl::Seconds(5), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_TRUE(ListCheckpointDirectory(FileSystem::Posix(), dir_).valid.size() == 1);
}

TEST_F(CheckpointTest, CutNoWorkerReachesTimesOutAndReleasesHeldPushes) {
  Checkpointer checkpointer(&shard_, Opts());
  Train(0, 3);
  ASSERT_OK(PushStep(shard_, 0, 3, tables_, KeysOf(0, 3)));  // worker 1 stops at 2
  v1::CheckpointRequest req;
  req.set_step(3);
  v1::CheckpointResponse resp;
  absl::Status s = checkpointer.Checkpoint(req, absl::Now() + absl::Milliseconds(200), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("worker 1 is behind"), std::string::npos) << s;
  // Worker 0's next step is not held any longer.
  EXPECT_OK(PushStep(shard_, 0, 4, tables_, KeysOf(0, 4)));
}

TEST_F(CheckpointTest, BasePlusThreeDeltasRestoresTheSameStateAsAFullCheckpoint) {
  Checkpointer checkpointer(&shard_, Opts());
  Train(0, 10);
  auto base = Take(checkpointer, /*incremental=*/true);  // no parent yet: full
  ASSERT_OK(base);
  EXPECT_EQ(base->manifest().kind(), v1::CHECKPOINT_KIND_FULL);
  std::string parent = base->manifest().id();
  for (int d = 0; d < 3; ++d) {
    if (d == 1) {  // a dropped table and a new one between deltas
      ASSERT_OK(shard_.DropTable("sgd_bf16"));
      tables_.erase(std::find(tables_.begin(), tables_.end(), "sgd_bf16"));
      v1::CreateTableResponse r;
      ASSERT_OK(shard_.CreateTable(AdagradTable("added", 5), &r));
      tables_.push_back("added");
    }
    Train(10 + d * 2, 12 + d * 2);
    auto delta = Take(checkpointer, true);
    ASSERT_OK(delta);
    EXPECT_EQ(delta->manifest().kind(), v1::CHECKPOINT_KIND_DELTA);
    EXPECT_EQ(delta->manifest().parent_id(), parent);
    EXPECT_LT(delta->bytes(), base->bytes());
    for (const auto& t : delta->manifest().tables()) {
      EXPECT_EQ(t.full(), t.config().name() == "added" && d == 1) << t.config().name();
    }
    parent = delta->manifest().id();
  }
  auto from_deltas = Restored("latest");
  ASSERT_OK(from_deltas);
  auto full = Take(checkpointer);
  ASSERT_OK(full);
  auto from_full = Restored(full->path());
  ASSERT_OK(from_full);
  const Contents expected = ContentsOf(shard_);
  EXPECT_EQ(expected.count("sgd_bf16"), 0u);
  EXPECT_EQ(expected.count("added"), 1u);
  EXPECT_EQ(ContentsOf(**from_deltas), expected);
  EXPECT_EQ(ContentsOf(**from_full), expected);
}

TEST_F(CheckpointTest, CompactionRewritesBasePlusDeltasAsOneFullCheckpoint) {
  Checkpointer checkpointer(&shard_, Opts());
  Train(0, 5);
  ASSERT_OK(Take(checkpointer));
  for (int d = 0; d < 2; ++d) {
    Train(5 + d, 6 + d);
    auto delta = Take(checkpointer, true);
    ASSERT_OK(delta);
    ASSERT_EQ(delta->manifest().kind(), v1::CHECKPOINT_KIND_DELTA);
  }
  auto compacted = CompactCheckpoints(FileSystem::Posix(), dir_, "compacted");
  ASSERT_OK(compacted);
  EXPECT_EQ(compacted->manifest().kind(), v1::CHECKPOINT_KIND_FULL);
  EXPECT_EQ(compacted->manifest().sequence(), 4u);
  EXPECT_EQ(compacted->manifest().step(), 6);
  EXPECT_EQ(compacted->manifest().workers_size(), 2);
  // The new base alone (its own chain) restores the same state, and is now latest.
  auto restored = Restored("latest");
  ASSERT_OK(restored);
  v1::GetShardInfoResponse info;
  (*restored)->GetShardInfo(&info);
  EXPECT_EQ(info.restored_from(), compacted->path());
  EXPECT_EQ(ContentsOf(**restored), ContentsOf(shard_));
}

TEST_F(CheckpointTest, DeltaSizeIsProportionalToTheRowsChanged) {
  Shard shard(Options(0, 1));
  v1::CreateTableResponse r;
  ASSERT_OK(shard.CreateTable(AdagradTable("t", 8), &r));
  std::vector<uint64_t> keys(20000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919;
  v1::PushRequest push;
  AddGradients(&push, "t", keys, std::vector<float>(keys.size() * 8, 0.5f));
  v1::PushResponse pushed;
  ASSERT_OK(shard.Push(push, &pushed));
  Checkpointer checkpointer(&shard, Opts());
  auto full = Take(checkpointer);
  ASSERT_OK(full);
  for (size_t changed : {size_t{200}, size_t{2000}}) {
    std::vector<uint64_t> some(keys.begin(), keys.begin() + changed);
    v1::PushRequest p;
    AddGradients(&p, "t", some, std::vector<float>(some.size() * 8, 0.25f));
    ASSERT_OK(shard.Push(p, &pushed));
    auto delta = Take(checkpointer, true);
    ASSERT_OK(delta);
    EXPECT_EQ(delta->manifest().tables(0).rows(), changed);
    const double ratio = static_cast<double>(delta->bytes()) / static_cast<double>(full->bytes());
    const double share = static_cast<double>(changed) / static_cast<double>(keys.size());
    // Rows are the same size in both; only the fixed header and footer differ.
    EXPECT_NEAR(ratio, share, 0.005) << changed << " rows changed";
  }
}

// Damage done to files on disk.
void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x20);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}
void Truncate(const std::string& path, uint64_t size) {
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(size)), 0) << path;
}
void WriteU32(const std::string& path, uint64_t offset, uint32_t v) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(reinterpret_cast<const char*>(&v), 4);
}

// Two checkpoints, the second then damaged by `damage` (given its path):
// restoring it is refused with a message holding every `fragment`, and
// "latest" falls back to the first.
class DamagedCheckpointTest : public CheckpointTest {
 protected:
  void ExpectRefusedWithFallback(const std::function<void(const std::string&)>& damage,
                                 absl::StatusCode code, const std::vector<std::string>& fragments,
                                 ShardOptions restore_as = Options()) {
    Checkpointer checkpointer(&shard_, Opts());
    Train(0, 5);
    auto first = Take(checkpointer);
    ASSERT_OK(first);
    const Contents at_first = ContentsOf(shard_);
    Train(5, 10);
    auto second = Take(checkpointer);
    ASSERT_OK(second);
    damage(second->path());

    auto refused = Restored(second->path(), restore_as);
    EXPECT_EQ(refused.status().code(), code) << refused.status();
    for (const std::string& f : fragments) {
      EXPECT_NE(refused.status().message().find(f), std::string::npos)
          << "'" << f << "' not in: " << refused.status();
    }
    if (restore_as.shard_index != Options().shard_index ||
        restore_as.shard_count != Options().shard_count) {
      return;  // every checkpoint here is another shard's
    }
    // A listing that reads the data files (ListCheckpoints, ember-checkpoint
    // list) refuses the damaged one too, naming it; the manifests alone may
    // not show the damage.
    CheckpointListing listing =
        ListCheckpointDirectory(FileSystem::Posix(), dir_, ListCheck::kDataFiles);
    ASSERT_EQ(listing.valid.size(), 1u);
    EXPECT_EQ(listing.valid[0].id(), first->manifest().id());
    ASSERT_EQ(listing.invalid.size(), 1u);
    EXPECT_EQ(listing.invalid[0].rfind(second->manifest().id() + ": ", 0), 0u)
        << listing.invalid[0];
    EXPECT_FALSE(VerifyCheckpoint(FileSystem::Posix(), second->path()).ok());
    EXPECT_OK(VerifyCheckpoint(FileSystem::Posix(), first->path()).status());
    auto latest = Restored("latest");
    ASSERT_OK(latest);
    EXPECT_EQ(ContentsOf(**latest), at_first);
    v1::GetShardInfoResponse info;
    (*latest)->GetShardInfo(&info);
    EXPECT_EQ(info.restored_from(), first->path());
  }
  static std::string TableFile(const std::string& checkpoint) {
    return JoinPath(checkpoint, "table-adam_fp16.rows");
  }
};

TEST_F(DamagedCheckpointTest, FlippedByteInATableFileIsRefusedNamingTheFile) {
  ExpectRefusedWithFallback([](const std::string& p) { FlipByte(TableFile(p), 100); },
                            absl::StatusCode::kDataLoss,
                            {"table-adam_fp16.rows", "CRC32C mismatch"});
}

TEST_F(DamagedCheckpointTest, TruncatedTableFileIsRefusedNamingTheFile) {
  ExpectRefusedWithFallback(
      [](const std::string& p) { Truncate(TableFile(p), *FileSystem::Posix()->FileSize(TableFile(p)) - 10); },
      absl::StatusCode::kDataLoss, {"table-adam_fp16.rows", "truncated"});
}

TEST_F(DamagedCheckpointTest, MissingTableFileIsRefusedNamingTheFile) {
  ExpectRefusedWithFallback([](const std::string& p) { std::remove(TableFile(p).c_str()); },
                            absl::StatusCode::kNotFound, {"table-adam_fp16.rows"});
}

TEST_F(DamagedCheckpointTest, FlippedByteInTheManifestIsRefused) {
  ExpectRefusedWithFallback([](const std::string& p) { FlipByte(JoinPath(p, "MANIFEST"), 30); },
                            absl::StatusCode::kDataLoss, {"MANIFEST", "CRC32C mismatch"});
}

TEST_F(DamagedCheckpointTest, TruncatedManifestIsRefused) {
  ExpectRefusedWithFallback([](const std::string& p) { Truncate(JoinPath(p, "MANIFEST"), 40); },
                            absl::StatusCode::kDataLoss, {"MANIFEST", "truncated or corrupted"});
}

TEST_F(DamagedCheckpointTest, BlockCountBeyondTheFileIsRefusedBeforeAnyAllocation) {
  // The first block's row count, at offset 32 + 8, set to 2^32 rows.
  ExpectRefusedWithFallback([](const std::string& p) { WriteU32(TableFile(p), 44, 1); },
                            absl::StatusCode::kDataLoss,
                            {"table-adam_fp16.rows", "does not fit"});
}

// Found by tests/fuzz/checkpoint_fuzzer: the manifest's row count sized the
// restore's allocation (4 GiB of index here) before the file was read.
TEST_F(DamagedCheckpointTest, ManifestRowCountBeyondTheFileIsRefusedBeforeAnyAllocation) {
  ExpectRefusedWithFallback(
      [](const std::string& p) {
        auto m = ReadManifest(FileSystem::Posix(), p);
        ASSERT_OK(m);
        for (auto& table : *m->mutable_tables()) table.set_rows(uint64_t{1} << 31);
        ASSERT_OK(WriteManifest(FileSystem::Posix(), p, *m));
      },
      absl::StatusCode::kDataLoss, {".rows", "the manifest says 2147483648 rows", "holds at most"});
}

TEST_F(DamagedCheckpointTest, OtherFormatVersionOfTheManifestIsRefused) {
  ExpectRefusedWithFallback(
      [](const std::string& p) {
        auto m = ReadManifest(FileSystem::Posix(), p);
        ASSERT_OK(m);
        m->set_format_version(2);
        ASSERT_OK(WriteManifest(FileSystem::Posix(), p, *m));
      },
      absl::StatusCode::kFailedPrecondition, {"MANIFEST", "format version 2", "reads version 1"});
}

TEST_F(DamagedCheckpointTest, OtherFormatVersionOfATableFileIsRefused) {
  ExpectRefusedWithFallback([](const std::string& p) { WriteU32(TableFile(p), 8, 2); },
                            absl::StatusCode::kFailedPrecondition,
                            {"table-adam_fp16.rows", "format version 2"});
}

TEST_F(DamagedCheckpointTest, ManifestWithAShardIndexNotBelowItsCountIsRefused) {
  ExpectRefusedWithFallback(
      [](const std::string& p) {
        auto m = ReadManifest(FileSystem::Posix(), p);
        ASSERT_OK(m);
        m->set_shard_index(7);
        ASSERT_OK(WriteManifest(FileSystem::Posix(), p, *m));
      },
      absl::StatusCode::kDataLoss, {"MANIFEST", "shard_index 7 is not below shard_count 2"});
}

TEST_F(DamagedCheckpointTest, ManifestWithAnUnknownRoutingIsRefused) {
  ExpectRefusedWithFallback(
      [](const std::string& p) {
        auto m = ReadManifest(FileSystem::Posix(), p);
        ASSERT_OK(m);
        m->set_routing("modulo");
        ASSERT_OK(WriteManifest(FileSystem::Posix(), p, *m));
      },
      absl::StatusCode::kFailedPrecondition,
      {"MANIFEST", "this build cannot read its routing", "received 'modulo'"});
}

TEST_F(DamagedCheckpointTest, CheckpointOfAnotherShardIndexIsRefused) {
  ExpectRefusedWithFallback([](const std::string&) {}, absl::StatusCode::kFailedPrecondition,
                            {"written by shard 0 of 2, this is shard 1 of 2"}, Options(1, 2));
}

TEST_F(DamagedCheckpointTest, CheckpointOfAnotherShardCountIsRefused) {
  ExpectRefusedWithFallback([](const std::string&) {}, absl::StatusCode::kFailedPrecondition,
                            {"written by shard 0 of 2, this is shard 0 of 3"}, Options(0, 3));
}

// Found by tests/fuzz/checkpoint_fuzzer: the restore joined the manifest's id
// to find the table files, so a copy of a checkpoint read its original's.
TEST_F(CheckpointTest, ACopiedCheckpointRestoresFromItsOwnFiles) {
  Checkpointer checkpointer(&shard_, Opts());
  Train(0, 5);
  auto taken = Take(checkpointer);
  ASSERT_OK(taken);
  const std::string copy = taken->path() + "-copy";
  std::filesystem::copy(taken->path(), copy, std::filesystem::copy_options::recursive);
  // The original is damaged: only the copy's own files can restore.
  for (const auto& entry : std::filesystem::directory_iterator(taken->path())) {
    if (entry.path().filename() != "MANIFEST") FlipByte(entry.path().string(), 40);
  }
  auto restored = Restored(copy);
  ASSERT_OK(restored);
  EXPECT_EQ(ContentsOf(**restored), ContentsOf(shard_));
  v1::GetShardInfoResponse info;
  (*restored)->GetShardInfo(&info);
  EXPECT_EQ(info.restored_from(), copy);
}

// Found by tests/fuzz (checkpoint_fuzzer): a delta's parent_id was joined to
// the checkpoint directory as it stood, so "../elsewhere/ckpt" read a
// checkpoint outside it, and a missing parent's error named only the parent.
TEST_F(CheckpointTest, ADeltaWhoseParentIdLeavesTheDirectoryIsRefused) {
  Checkpointer checkpointer(&shard_, Opts());
  Train(0, 5);
  auto base = Take(checkpointer, /*incremental=*/true);
  ASSERT_OK(base);
  Train(5, 7);
  auto delta = Take(checkpointer, true);
  ASSERT_OK(delta);
  ASSERT_EQ(delta->manifest().kind(), v1::CHECKPOINT_KIND_DELTA);
  // The base moved out of the directory; the delta names it by a path.
  const std::string outside = dir_ + "-outside";
  ASSERT_OK(FileSystem::Posix()->RemoveAll(outside));
  std::filesystem::create_directories(outside);
  std::filesystem::rename(base->path(), JoinPath(outside, base->manifest().id()));
  auto m = ReadManifest(FileSystem::Posix(), delta->path());
  ASSERT_OK(m);
  const std::string escaping = "../" + BaseNameOf(outside) + "/" + base->manifest().id();
  m->set_parent_id(escaping);
  ASSERT_OK(WriteManifest(FileSystem::Posix(), delta->path(), *m));

  auto restored = Restored(delta->path());
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss) << restored.status();
  EXPECT_NE(restored.status().message().find("parent_id '" + escaping + "'"), std::string::npos)
      << restored.status();
  EXPECT_NE(restored.status().message().find(delta->path()), std::string::npos)
      << restored.status();

  // A plain name that is not there: the error names the delta asked for.
  m->set_parent_id("ckpt-missing");
  ASSERT_OK(WriteManifest(FileSystem::Posix(), delta->path(), *m));
  restored = Restored(delta->path());
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kNotFound) << restored.status();
  EXPECT_NE(restored.status().message().find("checkpoint '" + delta->path() + "': its parent "
                                             "'ckpt-missing'"),
            std::string::npos)
      << restored.status();
  ASSERT_OK(FileSystem::Posix()->RemoveAll(outside));
}

// Found by tests/fuzz (checkpoint_fuzzer): a manifest's table config that
// converts but that no store can hold (a capacity beyond a shard's) was
// refused without naming the checkpoint.
TEST_F(CheckpointTest, AManifestTableNoStoreCanHoldIsRefusedNamingTheFile) {
  Checkpointer checkpointer(&shard_, Opts());
  Train(0, 3);
  auto taken = Take(checkpointer);
  ASSERT_OK(taken);
  auto m = ReadManifest(FileSystem::Posix(), taken->path());
  ASSERT_OK(m);
  m->mutable_tables(0)->mutable_config()->set_capacity(4980696032u);
  ASSERT_OK(WriteManifest(FileSystem::Posix(), taken->path(), *m));
  auto restored = Restored(taken->path());
  ASSERT_FALSE(restored.ok());
  EXPECT_NE(restored.status().message().find(JoinPath(taken->path(), "MANIFEST")),
            std::string::npos)
      << restored.status();
  EXPECT_NE(restored.status().message().find("capacity"), std::string::npos) << restored.status();
}

// Found by tests/soak (ember-soak): on SIGTERM the checkpoint on exit cut at
// the latest step any worker had pushed and waited for the others to reach
// it, which they never could with serving stopped: it timed out and every
// push since the previous checkpoint was lost on restart.
TEST_F(CheckpointTest, ExitCheckpointOfWorkersAtDifferentStepsKeepsEveryAppliedPush) {
  Checkpointer checkpointer(&shard_, Opts());
  for (int64_t s = 0; s < 10; ++s) ASSERT_OK(PushStep(shard_, 0, s, tables_, KeysOf(0, s)));
  for (int64_t s = 0; s < 5; ++s) ASSERT_OK(PushStep(shard_, 1, s, tables_, KeysOf(1, s)));
  ASSERT_OK(PushStep(shard_, 1, 6, tables_, KeysOf(1, 6)));  // out of order: 5 is missing
  // A cut at a common step is out of reach.
  v1::CheckpointResponse response;
  v1::CheckpointRequest request;
  EXPECT_EQ(checkpointer.Checkpoint(request, absl::Now() + absl::Milliseconds(100), &response).code(),
            absl::StatusCode::kDeadlineExceeded);

  const absl::Time start = absl::Now();
  ASSERT_OK(checkpointer.CheckpointOnExit(false, absl::Now() + absl::Seconds(10), &response));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "nothing to wait for";
  EXPECT_EQ(response.manifest().step(), 4);
  ASSERT_EQ(response.manifest().workers_size(), 2);
  EXPECT_EQ(response.manifest().workers(0).applied_step(), 9);
  EXPECT_EQ(response.manifest().workers(1).applied_step(), 4);
  ASSERT_EQ(response.manifest().workers(1).done_ahead_size(), 1);
  EXPECT_EQ(response.manifest().workers(1).done_ahead(0), 6);

  auto restored = Restored("latest");
  ASSERT_OK(restored);
  EXPECT_EQ(ContentsOf(**restored, true), ContentsOf(shard_, true));
  // Retries of what the checkpoint holds are duplicates; the missing step applies.
  auto push = [&](uint32_t worker, int64_t step) {
    v1::PushRequest req;
    req.set_worker_id(worker);
    req.set_step(step);
    v1::PushResponse resp;
    EXPECT_OK((*restored)->Push(req, &resp));
    return resp.duplicate();
  };
  EXPECT_TRUE(push(0, 9));
  EXPECT_TRUE(push(1, 6));
  EXPECT_TRUE(push(1, 4));
  EXPECT_FALSE(push(1, 5));
  v1::GetShardInfoResponse info;
  (*restored)->GetShardInfo(&info);
  ASSERT_EQ(info.workers_size(), 2);
  EXPECT_EQ(info.workers(0).applied_step(), 9);
  EXPECT_EQ(info.workers(1).applied_step(), 6);
}

TEST_F(CheckpointTest, LatestWithNothingValidFailsListingWhyEachWasRefused) {
  Checkpointer checkpointer(&shard_, Opts());
  Train(0, 3);
  auto taken = Take(checkpointer);
  ASSERT_OK(taken);
  FlipByte(JoinPath(taken->path(), "MANIFEST"), 25);
  auto restored = Restored("latest");
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss) << restored.status();
  EXPECT_NE(restored.status().message().find("no checkpoint in"), std::string::npos)
      << restored.status();
  EXPECT_NE(restored.status().message().find("CRC32C mismatch"), std::string::npos)
      << restored.status();
}

TEST_F(CheckpointTest, AVerifiedListingRefusesTheDeltasOfADamagedCheckpoint) {
  Checkpointer checkpointer(&shard_, Opts());
  v1::CheckpointResponse full_taken, delta_taken;
  ASSERT_NO_FATAL_FAILURE(TakeFullAndDelta(checkpointer, &full_taken, &delta_taken));
  const v1::CheckpointResponse* full = &full_taken;
  const v1::CheckpointResponse* delta = &delta_taken;
  const v1::CheckpointTable& table = full->manifest().tables(0);
  FlipByte(JoinPath(full->path(), table.file()), table.file_bytes() / 2);

  // The manifests are intact: only reading the data shows the damage.
  EXPECT_EQ(ListCheckpointDirectory(FileSystem::Posix(), dir_).valid.size(), 2u);
  CheckpointListing listing =
      ListCheckpointDirectory(FileSystem::Posix(), dir_, ListCheck::kDataFiles);
  EXPECT_TRUE(listing.valid.empty());
  ASSERT_EQ(listing.invalid.size(), 2u);
  EXPECT_NE(listing.invalid[0].find(table.file()), std::string::npos) << listing.invalid[0];
  EXPECT_NE(listing.invalid[0].find("CRC32C mismatch"), std::string::npos) << listing.invalid[0];
  EXPECT_EQ(listing.invalid[1], absl::StrCat(delta->manifest().id(), ": its parent '",
                                             full->manifest().id(), "' is refused or missing"));
  // ListCheckpoints answers the same.
  v1::ListCheckpointsResponse answered;
  checkpointer.List(&answered);
  EXPECT_EQ(answered.checkpoints_size(), 0);
  EXPECT_EQ(answered.invalid_size(), 2);
}

TEST_F(CheckpointTest, AFlippedByteInAnyFileOfAChainIsListedInvalidNamingItAndFailsVerify) {
  Checkpointer checkpointer(&shard_, Opts());
  v1::CheckpointResponse full_taken, delta_taken;
  ASSERT_NO_FATAL_FAILURE(TakeFullAndDelta(checkpointer, &full_taken, &delta_taken));
  const v1::CheckpointResponse* full = &full_taken;
  const v1::CheckpointResponse* delta = &delta_taken;
  auto chain = VerifyCheckpoint(FileSystem::Posix(), delta->path());
  ASSERT_OK(chain);
  ASSERT_EQ(chain->size(), 2u);
  int files = 0;
  for (const auto& dir : {full->path(), delta->path()}) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      SCOPED_TRACE(entry.path().string());
      const uint64_t offset = std::filesystem::file_size(entry.path()) / 2;
      FlipByte(entry.path().string(), offset);
      CheckpointListing listing =
          ListCheckpointDirectory(FileSystem::Posix(), dir_, ListCheck::kDataFiles);
      ASSERT_FALSE(listing.invalid.empty());
      EXPECT_NE(listing.invalid[0].find(entry.path().filename().string()), std::string::npos)
          << listing.invalid[0];
      absl::StatusOr<std::vector<v1::CheckpointManifest>> verified =
          VerifyCheckpoint(FileSystem::Posix(), delta->path());
      EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss) << verified.status();
      EXPECT_NE(verified.status().message().find(entry.path().filename().string()),
                std::string::npos)
          << verified.status();
      FlipByte(entry.path().string(), offset);  // the same flip again restores it
      ++files;
    }
  }
  // Every file: each manifest and each table's data file.
  EXPECT_EQ(files, 2 + full->manifest().tables_size() + delta->manifest().tables_size());
  EXPECT_OK(VerifyCheckpoint(FileSystem::Posix(), delta->path()).status());
}

// docs/checkpoints.md describes the format well enough to read it: a reader
// written from the doc alone (tests/checks/checkpoint_doc_reader.py, no
// Ember code) reads a full checkpoint and a delta with removed keys, of every
// optimizer and dtype, block by block.
TEST_F(CheckpointTest, TheReaderWrittenFromTheDocReadsAFullCheckpointAndADelta) {
  v1::TableConfig evicting = AdagradTable("evicting", 3);
  evicting.set_capacity(8);
  evicting.set_eviction(v1::EVICTION_POLICY_LRU);
  v1::CreateTableResponse created;
  ASSERT_OK(shard_.CreateTable(evicting, &created));
  const std::vector<uint64_t> keys = OwnedKeys(0, 2, 16);
  auto insert = [&](size_t begin) {
    v1::LookupRequest req;
    AddLookup(&req, "evicting",
              std::vector<uint64_t>(keys.begin() + begin, keys.begin() + begin + 8));
    v1::LookupResponse resp;
    ASSERT_OK(shard_.Lookup(req, &resp));
  };
  Checkpointer checkpointer(&shard_, Opts());
  insert(0);
  Train(0, 3);
  auto full = Take(checkpointer);
  ASSERT_OK(full);
  insert(8);  // evicts the first 8: the delta removes them
  Train(3, 5);
  auto delta = Take(checkpointer, /*incremental=*/true);
  ASSERT_OK(delta);
  ASSERT_EQ(delta->manifest().kind(), v1::CHECKPOINT_KIND_DELTA);
  uint64_t removed = 0;
  for (const auto& t : delta->manifest().tables()) removed += t.removed_keys();
  ASSERT_GT(removed, 0u);

  std::string out;
  const int rc = RunCommand({"python3", EMBER_DOC_READER, dir_}, "", &out);
  ASSERT_EQ(rc, 0) << out;
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << out;
  uint64_t full_rows = 0;
  for (const auto& t : full->manifest().tables()) full_rows += t.rows();
  EXPECT_NE(lines[0].find(absl::StrCat(full->manifest().id(), ": ")), std::string::npos) << out;
  EXPECT_NE(lines[0].find(absl::StrCat(" ", full_rows, " rows, 0 removed keys in 0 blocks")),
            std::string::npos)
      << out;
  EXPECT_NE(lines[1].find(absl::StrCat(" ", removed, " removed keys in ")), std::string::npos)
      << out;
}

TEST_F(CheckpointTest, LatestInAnEmptyDirectoryStartsEmpty) {
  Shard shard(Options());
  Checkpointer c(&shard, Opts());
  auto from = c.Restore("latest");
  ASSERT_OK(from);
  EXPECT_EQ(*from, "");
}

// Fails the n-th file operation that writes (create, append, sync, close,
// mkdir, rename, directory sync), as a full disk or an I/O error would.
class FailingFileSystem final : public FileSystem {
 public:
  explicit FailingFileSystem(int fail_at) : fail_at_(fail_at) {}
  int operations() const { return count_; }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    EMBER_RETURN_IF_ERROR(Tick("create", path));
    EMBER_ASSIGN_OR_RETURN(auto file, base_->NewWritableFile(path));
    return std::unique_ptr<WritableFile>(new File(this, path, std::move(file)));
  }
  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& p) override {
    return base_->NewSequentialFile(p);
  }
  absl::StatusOr<uint64_t> FileSize(const std::string& p) override { return base_->FileSize(p); }
  absl::Status CreateDirs(const std::string& p) override {
    EMBER_RETURN_IF_ERROR(Tick("mkdir", p));
    return base_->CreateDirs(p);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    EMBER_RETURN_IF_ERROR(Tick("rename", from));
    return base_->Rename(from, to);
  }
  absl::Status SyncDir(const std::string& p) override {
    EMBER_RETURN_IF_ERROR(Tick("sync dir", p));
    return base_->SyncDir(p);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& p) override {
    return base_->ListDir(p);
  }
  bool IsDirectory(const std::string& p) override { return base_->IsDirectory(p); }
  absl::Status RemoveAll(const std::string& p) override { return base_->RemoveAll(p); }

 private:
  class File final : public WritableFile {
   public:
    File(FailingFileSystem* fs, std::string path, std::unique_ptr<WritableFile> base)
        : fs_(fs), path_(std::move(path)), base_(std::move(base)) {}
    absl::Status Append(absl::string_view d) override {
      EMBER_RETURN_IF_ERROR(fs_->Tick("append", path_));
      return base_->Append(d);
    }
    absl::Status Sync() override {
      EMBER_RETURN_IF_ERROR(fs_->Tick("sync", path_));
      return base_->Sync();
    }
    absl::Status Close() override {
      EMBER_RETURN_IF_ERROR(fs_->Tick("close", path_));
      return base_->Close();
    }

   private:
    FailingFileSystem* fs_;
    std::string path_;
    std::unique_ptr<WritableFile> base_;
  };
  absl::Status Tick(absl::string_view op, const std::string& path) {
    if (++count_ == fail_at_) {
      return absl::ResourceExhaustedError(absl::StrCat("injected failure of ", op, " '", path, "'"));
    }
    return absl::OkStatus();
  }
  FileSystem* base_ = FileSystem::Posix();
  const int fail_at_;
  int count_ = 0;
};

TEST_F(CheckpointTest, FailureOfAnyWriteLeavesThePreviousCheckpointLatestAndNextIsFull) {
  {
    Checkpointer good(&shard_, Opts());
    Train(0, 5);
    ASSERT_OK(Take(good));
  }
  const Contents at_first = ContentsOf(shard_);
  Train(5, 8);
  int operations = 0;
  for (int fail_at = 1;; ++fail_at) {
    ASSERT_LT(fail_at, 500) << "the checkpoint never succeeded";
    FailingFileSystem fs(fail_at);
    Checkpointer checkpointer(&shard_, Opts(), &fs);
    auto taken = Take(checkpointer, /*incremental=*/true);
    if (taken.ok()) {
      operations = fail_at - 1;
      break;
    }
    EXPECT_NE(taken.status().message().find("injected failure"), std::string::npos)
        << taken.status();
    // Nothing half-written is visible: only the first checkpoint lists.
    CheckpointListing listing = ListCheckpointDirectory(FileSystem::Posix(), dir_);
    ASSERT_EQ(listing.valid.size(), 1u) << "after failing operation " << fail_at;
    EXPECT_TRUE(listing.invalid.empty()) << listing.invalid[0];
    auto latest = Restored("latest");
    ASSERT_OK(latest);
    EXPECT_EQ(ContentsOf(**latest), at_first) << "after failing operation " << fail_at;
    // The failed checkpoint's snapshot marked rows clean: the next one of
    // this checkpointer must be full, or it would miss them.
    auto next = Take(checkpointer, /*incremental=*/true);
    if (next.ok()) {
      EXPECT_EQ(next->manifest().kind(), v1::CHECKPOINT_KIND_FULL);
      ASSERT_OK(FileSystem::Posix()->RemoveAll(next->path()));
    }
  }
  EXPECT_GT(operations, 20);  // every file's create, appends, sync, close; dirs; rename
}

TEST_F(CheckpointTest, CheckpointsAndTheRestoreAreCountedInTheShardMetrics) {
  metrics::Registry registry;
  ShardMetrics metrics(&registry);
  Checkpointer checkpointer(&shard_, Opts(), FileSystem::Posix(), &metrics);
  Train(0, 4);
  auto taken = Take(checkpointer);
  ASSERT_OK(taken);
  EXPECT_EQ(Take(checkpointer, false, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string text = registry.Expose();
  for (const std::string& line :
       {std::string("ember_checkpoints_total{kind=\"full\",result=\"ok\"} 1"),
        std::string("ember_checkpoints_total{kind=\"full\",result=\"FAILED_PRECONDITION\"} 1"),
        absl::StrCat("ember_checkpoint_last_bytes ", taken->bytes()),
        std::string("ember_checkpoint_last_step 3")}) {
    EXPECT_NE(text.find(line + "\n"), std::string::npos) << line << " not in:\n" << text;
  }
  Shard fresh(Options());
  Checkpointer loader(&fresh, Opts(), FileSystem::Posix(), &metrics);
  ASSERT_OK(loader.Restore("latest"));
  const std::string restored = registry.Expose();
  for (const std::string& line :
       {std::string("ember_restore_step 3"), std::string("ember_restore_parts 1"),
        std::string("ember_restore_moved_rows 0"),
        std::string("ember_restore_routing_info{routing=\"splitmix64-jump65536\"} 1")}) {
    EXPECT_NE(restored.find(line + "\n"), std::string::npos) << line << " not in:\n" << restored;
  }
  EXPECT_EQ(restored.find("ember_restore_bytes 0\n"), std::string::npos) << restored;
}

TEST_F(CheckpointTest, OldCheckpointsBeyondKeepAreDeletedWithTheirDeltas) {
  CheckpointerOptions o = Opts();
  o.keep = 2;
  Checkpointer checkpointer(&shard_, o);
  std::vector<std::string> ids;
  // full, delta, full, delta, full: keeping 2 fulls keeps the last three.
  for (int i = 0; i < 5; ++i) {
    Train(i, i + 1);
    auto taken = Take(checkpointer, i % 2 == 1);
    ASSERT_OK(taken);
    ids.push_back(taken->manifest().id());
  }
  CheckpointListing listing = ListCheckpointDirectory(FileSystem::Posix(), dir_);
  std::vector<std::string> kept;
  for (const auto& m : listing.valid) kept.push_back(m.id());
  EXPECT_EQ(kept, (std::vector<std::string>{ids[2], ids[3], ids[4]}));
}

}  // namespace
}  // namespace ember::testing
