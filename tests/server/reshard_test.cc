// Resharding a cluster checkpoint (shard/reshard.h), shards in process: the
// round trip 2 -> 3 -> 5 -> 2 keeps every row, optimizer state, score and
// the clock bit for bit; training after a resharded restore equals training
// that never resharded; mixed and incomplete cluster checkpoints are
// refused naming the part; a part of the same shard count keeps its routing.
#include "shard/reshard.h"

#include <map>
#include <memory>
#include <tuple>

#include "absl/strings/str_join.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "shard/checkpoint_format.h"
#include "shard/checkpointer.h"
#include "shard/shard_metrics.h"
#include "tests/server/requests.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

constexpr uint32_t kDim = 5;

// Every table kind: each optimizer and dtype, and one with LRU eviction and
// a TTL (its rows carry scores and TTL stamps).
std::vector<v1::TableConfig> Tables() {
  std::vector<v1::TableConfig> t = EveryOptimizerAndDtype(kDim);
  v1::TableConfig lru = t[1];
  lru.set_name("adagrad_lru_ttl");
  lru.set_capacity(100000);
  lru.set_eviction(v1::EVICTION_POLICY_LRU);
  lru.mutable_ttl()->set_steps(1000);
  t.push_back(lru);
  return t;
}

// Keys, values, state, step count and score of every row, by table.
using Row = std::tuple<std::vector<float>, std::vector<float>, uint32_t, uint32_t>;
using Contents = std::map<std::string, std::map<uint64_t, Row>>;

void AddRows(const std::string& table, const ExportedRows& r, uint32_t dim, Contents* out) {
  const size_t n = r.keys.size();
  const size_t sf = n == 0 ? 0 : r.state.size() / n;
  for (size_t i = 0; i < n; ++i) {
    const bool fresh =
        (*out)[table]
            .emplace(r.keys[i], Row{{r.values.begin() + i * dim, r.values.begin() + (i + 1) * dim},
                                    {r.state.begin() + i * sf, r.state.begin() + (i + 1) * sf},
                                    r.steps[i],
                                    r.scores[i]})
            .second;
    EXPECT_TRUE(fresh) << "key " << r.keys[i] << " of table " << table << " is in two parts";
  }
}

// A cluster of in-process shards, each with its checkpoint directory.
class Cluster {
 public:
  Cluster(const std::string& dir, uint32_t count, const std::string& routing = kDefaultRouting)
      : router_(*KeyRouter::Make(routing, count)) {
    for (uint32_t s = 0; s < count; ++s) {
      ShardOptions o;
      o.shard_index = s;
      o.shard_count = count;
      o.routing = routing;
      shards_.push_back(std::make_unique<Shard>(o));
      CheckpointerOptions co;
      co.directory = JoinPath(dir, absl::StrCat("shard-", s));
      co.keep = 0;
      checkpointers_.push_back(std::make_unique<Checkpointer>(shards_.back().get(), co));
    }
  }
  void CreateTablesAndWorker() {
    for (auto& shard : shards_) {
      for (const auto& c : Tables()) {
        v1::CreateTableResponse r;
        ASSERT_OK(shard->CreateTable(c, &r));
      }
      v1::RegisterWorkerRequest reg;
      reg.set_worker_id(7);
      v1::RegisterWorkerResponse resp;
      ASSERT_OK(shard->RegisterWorker(reg, &resp));
    }
  }
  absl::Status Restore(const std::string& what) {
    for (auto& c : checkpointers_) EMBER_RETURN_IF_ERROR(c->Restore(what).status());
    return absl::OkStatus();
  }
  // Shard s restores parts[s].
  absl::Status RestoreEach(const std::vector<std::string>& parts) {
    for (size_t s = 0; s < checkpointers_.size(); ++s) {
      EMBER_RETURN_IF_ERROR(checkpointers_[s]->Restore(parts[s]).status());
    }
    return absl::OkStatus();
  }
  // Step s of worker 7: a sliding window of 600 of 3,000 keys, each to its
  // owner, gradients depending on (step, key, element).
  void Push(int64_t step) {
    std::vector<std::vector<uint64_t>> keys(shards_.size());
    for (uint64_t i = 0; i < 600; ++i) {
      const uint64_t key = 1 + (step * 211 + i * 5) % 3000;
      keys[router_.ShardOf(key)].push_back(key);
    }
    for (size_t s = 0; s < shards_.size(); ++s) {
      v1::PushRequest req;
      req.set_worker_id(7);
      req.set_step(step);
      for (const auto& c : Tables()) {
        std::vector<float> g(keys[s].size() * kDim);
        for (size_t i = 0; i < g.size(); ++i) {
          g[i] = 0.01f * static_cast<float>(
                             static_cast<int>((step * 31 + keys[s][i / kDim] + i % kDim) % 17) - 8);
        }
        AddGradients(&req, c.name(), keys[s], g);
      }
      v1::PushResponse resp;
      ASSERT_OK(shards_[s]->Push(req, &resp));
    }
  }
  // Checkpoint `id` of every shard at the clock's step; returns the parts.
  std::vector<std::string> Checkpoint(const std::string& id, bool incremental = false) {
    std::vector<std::string> parts;
    for (auto& c : checkpointers_) {
      v1::CheckpointRequest req;
      req.set_id(id);
      req.set_incremental(incremental);
      v1::CheckpointResponse resp;
      EXPECT_OK(c->Checkpoint(req, absl::Now() + absl::Seconds(10), &resp));
      parts.push_back(resp.path());
    }
    return parts;
  }
  // `scores`: with eviction scores (an LRU clock counts a store's own
  // operations, so after more trained steps they differ between clusters
  // of different sizes; they are compared right after a reshard only).
  Contents Rows(bool scores = true) {
    Contents out;
    for (auto& shard : shards_) {
      auto snap = shard->Snapshot(std::nullopt, false, absl::InfiniteFuture(), /*as_is=*/true);
      EXPECT_OK(snap);
      if (!snap.ok()) continue;
      for (const auto& t : snap->tables) {
        for (const SnapshotBatch& b : t.batches) AddRows(t.config.name(), b.rows, kDim, &out);
      }
    }
    if (!scores) {
      for (auto& [table, rows] : out) {
        for (auto& [key, row] : rows) std::get<3>(row) = 0;
      }
    }
    return out;
  }
  Shard& shard(size_t s) { return *shards_[s]; }

 private:
  KeyRouter router_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<std::unique_ptr<Checkpointer>> checkpointers_;
};

// The rows of a cluster checkpoint's parts, each checked to be placed by
// the parts' routing; `manifests` receives each part's manifest.
Contents PartRows(const std::vector<std::string>& parts,
                  std::vector<v1::CheckpointManifest>* manifests = nullptr) {
  Contents out;
  for (const std::string& p : parts) {
    v1::CheckpointManifest m;
    auto tables = LoadCheckpointTables(FileSystem::Posix(), p, &m);
    EXPECT_OK(tables);
    if (!tables.ok()) continue;
    const KeyRouter router = *KeyRouter::Make(m.routing(), m.shard_count());
    for (const RestoredTable& t : *tables) {
      ExportCursor cursor;
      ExportedRows rows;
      while (!cursor.done) {
        EXPECT_OK(t.store->Export(&cursor, 1000, &rows));
        for (uint64_t k : rows.keys) {
          EXPECT_EQ(router.ShardOf(k), m.shard_index())
              << "key " << k << " in the part of shard " << m.shard_index() << " of "
              << m.shard_count();
        }
        AddRows(t.config.name(), rows, kDim, &out);
      }
    }
    if (manifests != nullptr) manifests->push_back(m);
  }
  return out;
}

std::vector<std::string> Resharded(const std::vector<std::string>& parts, uint32_t to,
                                   const std::string& out_dir,
                                   const std::string& routing = kDefaultRouting) {
  auto cluster = OpenCheckpointParts(FileSystem::Posix(), parts);
  EXPECT_OK(cluster);
  if (!cluster.ok()) return {};
  ReshardOptions o;
  o.shard_count = to;
  o.routing = routing;
  o.out_dir = out_dir;
  auto result = Reshard(FileSystem::Posix(), *cluster, o);
  EXPECT_OK(result);
  if (!result.ok()) return {};
  EXPECT_EQ(result->paths.size(), to);
  return result->paths;
}

std::string FreshDir(const std::string& name) {
  const std::string dir = JoinPath(::testing::TempDir(), name);
  EXPECT_OK(FileSystem::Posix()->RemoveAll(dir));
  return dir;
}

TEST(ReshardTest, RoundTrip2To3To5To2KeepsEveryRowStateScoreAndTheClockBitForBit) {
  const std::string dir = FreshDir("reshard_round_trip");
  Cluster two(JoinPath(dir, "two"), 2);
  two.CreateTablesAndWorker();
  for (int64_t s = 0; s < 4; ++s) two.Push(s);
  two.Checkpoint("base");
  for (int64_t s = 4; s < 8; ++s) two.Push(s);
  // Each part is a delta on its base: the reshard reads the chains.
  const std::vector<std::string> parts = two.Checkpoint("cut", /*incremental=*/true);
  const Contents original = two.Rows();
  ASSERT_EQ(original.size(), Tables().size());
  ASSERT_GT(original.begin()->second.size(), 2000u);

  std::vector<v1::CheckpointManifest> m0;
  EXPECT_EQ(PartRows(parts, &m0), original);
  const std::vector<std::string> three = Resharded(parts, 3, JoinPath(dir, "three"));
  const std::vector<std::string> five = Resharded(three, 5, JoinPath(dir, "five"));
  const std::vector<std::string> back = Resharded(five, 2, JoinPath(dir, "back"));
  for (const auto* step : {&three, &five, &back}) {
    std::vector<v1::CheckpointManifest> m;
    EXPECT_EQ(PartRows(*step, &m), original) << absl::StrJoin(*step, ", ");
    for (const auto& manifest : m) {
      EXPECT_EQ(manifest.step(), m0[0].step());
      EXPECT_EQ(manifest.workers_size(), 1);
      EXPECT_EQ(manifest.workers(0).worker_id(), 7u);
      EXPECT_EQ(manifest.workers(0).applied_step(), 7);
      EXPECT_EQ(manifest.routing(), kDefaultRouting);
      EXPECT_EQ(manifest.kind(), v1::CHECKPOINT_KIND_FULL);
    }
  }
  // Going from 2 to 3 shards moved about a third of the keys.
  std::vector<v1::CheckpointManifest> m3;
  PartRows(three, &m3);
  const KeyRouter r2 = *KeyRouter::Make(kDefaultRouting, 2),
                  r3 = *KeyRouter::Make(kDefaultRouting, 3);
  size_t moved = 0, keys = 0;
  for (const auto& [key, row] : original.begin()->second) {
    ++keys;
    moved += r2.ShardOf(key) != r3.ShardOf(key);
  }
  EXPECT_NEAR(static_cast<double>(moved) / keys, 1.0 / 3, 0.04);
}

TEST(ReshardTest, TrainingAfterAReshardedRestoreEqualsTrainingThatNeverResharded) {
  const std::string dir = FreshDir("reshard_training");
  Cluster two(JoinPath(dir, "two"), 2);
  two.CreateTablesAndWorker();
  for (int64_t s = 0; s < 6; ++s) two.Push(s);
  const std::vector<std::string> parts = two.Checkpoint("cut");
  // Three shards restore the two parts directly (--restore_from=P0,P1),
  // five from the tool's output.
  Cluster three(JoinPath(dir, "three"), 3);
  ASSERT_OK(three.Restore(absl::StrJoin(parts, ",")));
  Cluster five(JoinPath(dir, "five"), 5);
  const std::vector<std::string> five_parts = Resharded(parts, 5, JoinPath(dir, "five-out"));
  ASSERT_OK(five.Restore(absl::StrJoin(five_parts, ",")));
  for (int64_t s = 6; s < 12; ++s) {
    two.Push(s);
    three.Push(s);
    five.Push(s);
  }
  const Contents reference = two.Rows(/*scores=*/false);
  for (Cluster* c : {&three, &five}) {
    const Contents rows = c->Rows(/*scores=*/false);
    ASSERT_EQ(rows.size(), reference.size());
    for (const auto& [table, expected] : reference) {
      const auto& got = rows.at(table);
      EXPECT_EQ(got.size(), expected.size()) << "table " << table;
      for (const auto& [key, row] : expected) {
        auto it = got.find(key);
        if (it == got.end() || it->second != row) {
          ADD_FAILURE() << "table " << table << " key " << key << " differs"
                        << (it == got.end() ? " (missing)" : "");
          break;
        }
      }
    }
  }
  // A resharded restore is counted with every part it read.
  {
    metrics::Registry registry;
    ShardMetrics metrics(&registry);
    ShardOptions o;
    o.shard_index = 1;
    o.shard_count = 3;
    Shard shard(o);
    Checkpointer loader(&shard, CheckpointerOptions{}, FileSystem::Posix(), &metrics);
    ASSERT_OK(loader.Restore(absl::StrJoin(parts, ",")).status());
    const std::string text = registry.Expose();
    // Jump routing moves keys from 2 to 3 shards onto the new shard only:
    // shard 1 took none from shard 0's part.
    for (const std::string& line :
         {std::string("ember_restore_parts 2"), std::string("ember_restore_step 5"),
          std::string("ember_restore_moved_rows 0"),
          std::string("ember_restore_routing_info{routing=\"splitmix64-jump65536\"} 1")}) {
      EXPECT_NE(text.find(line + "\n"), std::string::npos) << line << " not in:\n" << text;
    }
    // The new shard 2 took every row it holds from the others' parts.
    metrics::Registry registry2;
    ShardMetrics metrics2(&registry2);
    o.shard_index = 2;
    Shard shard2(o);
    Checkpointer loader2(&shard2, CheckpointerOptions{}, FileSystem::Posix(), &metrics2);
    ASSERT_OK(loader2.Restore(absl::StrJoin(parts, ",")).status());
    uint64_t rows = 0;
    for (const Shard::TableStats& t : shard2.AllTableStats()) rows += t.stats.rows;
    ASSERT_GT(rows, 0u);
    const std::string line = absl::StrCat("ember_restore_moved_rows ", rows, "\n");
    EXPECT_NE(registry2.Expose().find(line), std::string::npos) << line << registry2.Expose();
  }
  v1::GetShardInfoResponse info;
  three.shard(2).GetShardInfo(&info);
  ASSERT_EQ(info.workers_size(), 1);
  EXPECT_EQ(info.workers(0).applied_step(), 11);
  EXPECT_EQ(info.restored_from(), absl::StrJoin(parts, ","));
}

TEST(ReshardTest, MixedOrIncompleteClusterCheckpointsAreRefusedNamingThePartAndChangeNothing) {
  const std::string dir = FreshDir("reshard_refused");
  Cluster two(JoinPath(dir, "two"), 2);
  two.CreateTablesAndWorker();
  for (int64_t s = 0; s < 3; ++s) two.Push(s);
  const std::vector<std::string> early = two.Checkpoint("early");
  for (int64_t s = 3; s < 5; ++s) two.Push(s);
  const std::vector<std::string> late = two.Checkpoint("late");
  Cluster other(JoinPath(dir, "other"), 3);
  other.CreateTablesAndWorker();
  const std::vector<std::string> of_three = other.Checkpoint("three");

  struct Case {
    std::vector<std::string> parts;
    std::vector<std::string> expected;
  };
  const Case cases[] = {
      {{late[0]}, {"cluster checkpoint of 2 shards: no part of shard 1 among the 1 given"}},
      {{late[0], late[0]}, {"are both shard 0 of 2"}},
      {{early[0], late[1]}, {late[1], "cut at another point", "step 4 against 2"}},
      {{late[0], of_three[1]}, {of_three[1], "parts of different clusters"}},
  };
  for (const Case& c : cases) {
    auto opened = OpenCheckpointParts(FileSystem::Posix(), c.parts);
    ASSERT_FALSE(opened.ok()) << absl::StrJoin(c.parts, ",");
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
    for (const std::string& e : c.expected) {
      EXPECT_NE(opened.status().message().find(e), std::string::npos)
          << opened.status() << " lacks " << e;
    }
    // A shard asked to restore them is left as it was.
    Cluster target(JoinPath(dir, "target"), 3);
    target.CreateTablesAndWorker();
    target.Push(0);
    const Contents before = target.Rows();
    EXPECT_FALSE(target.Restore(absl::StrJoin(c.parts, ",")).ok());
    EXPECT_EQ(target.Rows(), before);
  }
  // One part of another shard count says how to reshard.
  Cluster target(JoinPath(dir, "target1"), 3);
  absl::Status s = target.Restore(late[0]);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("written by shard 0 of 2, this is shard 0 of 3 (to restore into "
                             "another shard count, pass every part"),
            std::string::npos)
      << s;
}

TEST(ReshardTest, ASharePastATablesCapacityIsRefusedInsteadOfEvicted) {
  const std::string dir = FreshDir("reshard_capacity");
  Cluster two(JoinPath(dir, "two"), 2);
  two.CreateTablesAndWorker();
  for (int64_t s = 0; s < 8; ++s) two.Push(s);  // ~1,500 rows per shard of each table
  const std::vector<std::string> parts = two.Checkpoint("cut");
  // The LRU table's capacity lowered to 2,000 rows per shard in the parts'
  // manifests: one shard cannot hold what the two held.
  const Contents rows = two.Rows();
  const uint64_t lru_rows = rows.at("adagrad_lru_ttl").size();
  ASSERT_GT(lru_rows, 2000u);
  for (const std::string& part : parts) {
    auto m = ReadManifest(FileSystem::Posix(), part);
    ASSERT_OK(m);
    for (auto& t : *m->mutable_tables()) {
      if (t.config().name() == "adagrad_lru_ttl") t.mutable_config()->set_capacity(2000);
    }
    ASSERT_OK(WriteManifest(FileSystem::Posix(), part, *m));
  }
  auto cluster = OpenCheckpointParts(FileSystem::Posix(), parts);
  ASSERT_OK(cluster);
  ReshardOptions o;
  o.shard_count = 1;
  o.out_dir = JoinPath(dir, "one");
  auto refused = Reshard(FileSystem::Posix(), *cluster, o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find(
                absl::StrCat("table 'adagrad_lru_ttl': shard 0 of 1 would hold ", lru_rows,
                             " rows, more than its capacity of 2000 per shard")),
            std::string::npos)
      << refused.status();
  EXPECT_FALSE(FileSystem::Posix()->IsDirectory(JoinPath(dir, "one/shard-0/cut")));
  // Restored directly, the store would evict: refused, the shard unchanged.
  Cluster one(JoinPath(dir, "restored"), 1);
  absl::Status s = one.Restore(absl::StrJoin(parts, ","));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("table 'adagrad_lru_ttl': shard 0 of 1 owns"), std::string::npos) << s;
  EXPECT_TRUE(one.Rows().empty());
}

TEST(ReshardTest, APartOfTheSameShardCountKeepsItsRoutingAndAReshardConvertsIt) {
  const std::string dir = FreshDir("reshard_routing");
  Cluster old(JoinPath(dir, "old"), 2, kRoutingFastrange);
  old.CreateTablesAndWorker();
  for (int64_t s = 0; s < 3; ++s) old.Push(s);
  const std::vector<std::string> parts = old.Checkpoint("old");
  // Shards started with the default routing restore their own parts and
  // route as the checkpoint did.
  Cluster restored(JoinPath(dir, "restored"), 2);
  ASSERT_OK(restored.RestoreEach(parts));
  EXPECT_EQ(restored.Rows(), old.Rows());
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(restored.shard(i).placement()->router.routing(), kRoutingFastrange);
    v1::GetShardInfoResponse info;
    restored.shard(i).GetShardInfo(&info);
    EXPECT_EQ(info.routing(), kRoutingFastrange);
  }
  // The reshard tool converts the routing at the same shard count.
  const std::vector<std::string> converted = Resharded(parts, 2, JoinPath(dir, "jump"));
  std::vector<v1::CheckpointManifest> m;
  EXPECT_EQ(PartRows(converted, &m), old.Rows());
  EXPECT_EQ(m[0].routing(), kRoutingJump);
}

TEST(ReshardTest, EveryReshardIsTheNextRoutingEpochAndARestoreOfItsOwnPartKeepsIt) {
  const std::string dir = FreshDir("reshard_epoch");
  Cluster two(JoinPath(dir, "two"), 2);
  two.CreateTablesAndWorker();
  two.Push(0);
  EXPECT_EQ(two.shard(0).routing_epoch(), 1u);  // a cluster that started empty
  const std::vector<std::string> parts = two.Checkpoint("cut");
  std::vector<v1::CheckpointManifest> m;
  PartRows(parts, &m);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].routing_epoch(), 1u);
  // The tool's parts are epoch 2, and a second reshard of them epoch 3.
  const std::vector<std::string> three = Resharded(parts, 3, JoinPath(dir, "three"));
  m.clear();
  PartRows(three, &m);
  for (const auto& manifest : m) EXPECT_EQ(manifest.routing_epoch(), 2u);
  const std::vector<std::string> back = Resharded(three, 2, JoinPath(dir, "back"));
  m.clear();
  PartRows(back, &m);
  for (const auto& manifest : m) EXPECT_EQ(manifest.routing_epoch(), 3u);
  // Restoring its own part keeps the part's epoch; restoring every part
  // (a reshard) takes the next one, as the tool does; a checkpoint of it
  // records it.
  Cluster own(JoinPath(dir, "own"), 3);
  ASSERT_OK(own.RestoreEach(three));
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(own.shard(i).routing_epoch(), 2u);
    v1::GetShardInfoResponse info;
    own.shard(i).GetShardInfo(&info);
    EXPECT_EQ(info.routing_epoch(), 2u);
  }
  Cluster direct(JoinPath(dir, "direct"), 3);
  ASSERT_OK(direct.Restore(absl::StrJoin(parts, ",")));
  EXPECT_EQ(direct.shard(2).routing_epoch(), 2u);
  m.clear();
  PartRows(direct.Checkpoint("again"), &m);
  for (const auto& manifest : m) EXPECT_EQ(manifest.routing_epoch(), 2u);
  // Parts of two epochs are not one cluster checkpoint.
  auto mixed = OpenCheckpointParts(FileSystem::Posix(), {back[0], parts[1]});
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mixed.status().message().find("at routing epoch 1, part '"), std::string::npos)
      << mixed.status();
  EXPECT_NE(mixed.status().message().find("at routing epoch 3: parts of different clusters"),
            std::string::npos)
      << mixed.status();
}

TEST(ReshardTest, ACallOfAnotherRoutingEpochIsRefusedNamingBothAndNoEpochIsNotChecked) {
  ShardOptions o;
  o.shard_index = 1;
  o.shard_count = 2;
  Shard shard(o);
  EXPECT_OK(shard.CheckRoutingEpoch(0, "Lookup"));
  EXPECT_OK(shard.CheckRoutingEpoch(1, "Lookup"));
  absl::Status s = shard.CheckRoutingEpoch(4, "Push");
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_NE(s.message().find("Push: routed by routing epoch 4, but shard 1 of 2 is at routing "
                             "epoch 1 (routing '" +
                             std::string(kDefaultRouting) + "')"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("Nothing was read or applied; connect again"), std::string::npos) << s;
}

}  // namespace
}  // namespace ember::testing
