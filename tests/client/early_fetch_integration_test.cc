// Early fetch at s = 0 (client/early_fetch.h) against real ember-server
// processes on 127.0.0.1 and against shards in the test's process (one
// suite over both channels, tests/client/shard_way.h): every step's rows are bit-identical to plain
// s = 0 (the same training with early_fetch off, and a lookup issued at the
// step's Wait), for every optimizer and storage dtype, one pipeline and a
// node of merged pipelines, over 300 steps; tables whose rows can change
// otherwise (capacity, TTL, admission) and a second worker make the
// pipeline fetch after the push instead, still exactly.
#include <barrier>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ember/client.h"
#include "ember/step_merger.h"
#include "ember/step_pipeline.h"
#include "ember/trace.h"
#include "gtest/gtest.h"
#include "tests/client/shard_way.h"
#include "tests/server/requests.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

constexpr uint32_t kDim = 8;
constexpr int kBatch = 48;
constexpr int64_t kSteps = 300;
constexpr uint64_t kOneHotIds = 160;  // ~30% of a step's keys were in the step before

// Steps fetched early, of kSteps: every one after the first with merged
// pipelines (their pairing is by call order); a lone pipeline pairs a push
// with a fetch when they come within its hold, so a few steps may be
// fetched after their push as plain lookups, which need no patch.
void ExpectMostStepsFetchedEarly(uint64_t early, int ranks) {
  if (ranks > 1) {
    EXPECT_EQ(early, static_cast<uint64_t>(kSteps - 1));
  } else {
    EXPECT_LE(early, static_cast<uint64_t>(kSteps - 1));
    EXPECT_GE(early, static_cast<uint64_t>(kSteps / 2));
  }
}

// Feature 0 is one-hot with sum: its pooled rows are the rows themselves,
// so a row off by one ulp shows in the step's output. Feature 1 is
// multi-hot with mean over the same table.
std::vector<FeatureSpec> Features(const std::string& table) {
  return {{"onehot", table, Combiner::kSum}, {"multihot", table, Combiner::kMean}};
}

Batch MakeBatch(int64_t step, int rank) {
  std::mt19937_64 rng(step * 104729 + rank * 7);
  Batch b;
  FeatureBatch one, multi;
  one.offsets = {0};
  multi.offsets = {0};
  for (int i = 0; i < kBatch; ++i) {
    one.keys.push_back(Mix64(rng() % kOneHotIds));
    one.offsets.push_back(static_cast<int64_t>(one.keys.size()));
    for (int j = 0, n = static_cast<int>(rng() % 4); j < n; ++j) {
      multi.keys.push_back(Mix64(1000 + rng() % 120));
    }
    multi.offsets.push_back(static_cast<int64_t>(multi.keys.size()));
  }
  b.features.push_back(std::move(one));
  b.features.push_back(std::move(multi));
  return b;
}

// What one rank saw: per step, every feature's pooled rows.
using Seen = std::vector<std::vector<std::vector<float>>>;

struct RunOptions {
  std::string table;
  bool early = true;
  bool patch = true;  // PipelineOptions::early_fetch_patch
  int ranks = 1;    // > 1: one StepMerger per worker (node) merges that many pipelines
  int workers = 1;  // > 1: that many independent SSP workers (nodes)
  uint32_t first_worker_id = 0;
  // At each Wait, check the one-hot rows against a lookup issued then
  // (bit for bit): the rows plain s = 0 would give at that moment.
  bool check_against_lookup = true;
  TraceRecorder* trace = nullptr;  // every pipeline's timeline, if set
};

class EarlyFetchTest : public ::testing::TestWithParam<ShardWay> {
 protected:
  // One cluster per channel for the whole suite: shard servers, or shards
  // in this process.
  void SetUp() override {
    if (GetParam() == ShardWay::kServers) {
      if (server_client_ == nullptr) {
        absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> shards = StartCluster(2);
        ASSERT_OK(shards);
        shards_ = new std::vector<std::unique_ptr<ServerProcess>>(std::move(*shards));
        ClientOptions o;
        for (const auto& s : *shards_) o.shards.push_back(s->address());
        o.rpc_timeout = absl::Seconds(30);
        absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(o);
        ASSERT_OK(client);
        server_client_ = client->release();
      }
      client_ = server_client_;
    } else {
      Client*& cached =
          GetParam() == ShardWay::kInProcess ? in_process_client_ : in_process_pool_client_;
      if (cached == nullptr) {
        ClientOptions o = InProcessOptionsFor(2, GetParam());
        o.rpc_timeout = absl::Seconds(30);
        absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(o);
        ASSERT_OK(client);
        cached = client->release();
      }
      client_ = cached;
    }
  }
  static void TearDownTestSuite() {
    delete server_client_;
    delete in_process_client_;
    delete in_process_pool_client_;
    delete shards_;
    server_client_ = in_process_client_ = in_process_pool_client_ = client_ = nullptr;
    shards_ = nullptr;
  }

  // Trains kSteps steps; returns what each rank (or worker) saw, and fills
  // `stats` per rank.
  static absl::StatusOr<std::vector<Seen>> Run(const RunOptions& ro,
                                               std::vector<PipelineStats>* stats) {
    const int n =
        ro.ranks * ro.workers;  // pipelines; pipeline r is rank r % ranks of node r / ranks
    std::vector<std::unique_ptr<StepMerger>> mergers;
    for (int w = 0; w < ro.workers && ro.ranks > 1; ++w) {
      StepMergerOptions mo;
      mo.ranks = ro.ranks;
      mo.worker_id = ro.first_worker_id + w;
      mo.early_fetch = ro.early;
      mo.early_fetch_patch = ro.patch;
      EMBER_ASSIGN_OR_RETURN(std::unique_ptr<StepMerger> m, StepMerger::Create(client_, mo));
      mergers.push_back(std::move(m));
    }
    std::vector<std::unique_ptr<StepPipeline>> pipes;
    for (int r = 0; r < n; ++r) {
      PipelineOptions po;
      po.worker_id = ro.first_worker_id + r / ro.ranks;
      po.features = Features(ro.table);
      po.staleness = 0;
      po.early_fetch = ro.early;
      po.early_fetch_patch = ro.patch;
      po.merger = mergers.empty() ? nullptr : mergers[r / ro.ranks].get();
      po.merger_rank = r % ro.ranks;
      po.trace = ro.trace;
      EMBER_ASSIGN_OR_RETURN(std::unique_ptr<StepPipeline> p, StepPipeline::Create(client_, po));
      pipes.push_back(std::move(p));
    }
    std::vector<Seen> seen(n);
    std::vector<absl::Status> status(n);
    // Independent workers check and push in lockstep, so that no worker's
    // push of step t reaches the shards before another's check of step t.
    std::barrier checked(n);
    auto train = [&](int r) -> absl::Status {
      StepPipeline& pipe = *pipes[r];
      EMBER_RETURN_IF_ERROR(pipe.Prefetch(0, MakeBatch(0, r)));
      for (int64_t t = 0; t < kSteps; ++t) {
        if (t + 1 < kSteps) EMBER_RETURN_IF_ERROR(pipe.Prefetch(t + 1, MakeBatch(t + 1, r)));
        EMBER_ASSIGN_OR_RETURN(StepView view, pipe.Wait(t));
        std::vector<std::vector<float>> pooled;
        for (absl::Span<float> p : view.pooled) pooled.emplace_back(p.begin(), p.end());
        if (ro.check_against_lookup) {
          // With early fetch, Wait(t) returns before push t - 1 reaches the
          // shards; the lookup must come after it.
          EMBER_RETURN_IF_ERROR(pipe.Flush());
          const Batch batch = MakeBatch(t, r);
          EMBER_ASSIGN_OR_RETURN(std::vector<float> looked_up,
                                 client_->LookupRows(ro.table, batch.features[0].keys));
          for (size_t i = 0; i < looked_up.size(); ++i) {
            if (absl::bit_cast<uint32_t>(looked_up[i]) != absl::bit_cast<uint32_t>(pooled[0][i])) {
              return absl::InternalError(absl::StrCat(
                  "rank ", r, " step ", t, " key ", batch.features[0].keys[i / kDim], " element ",
                  i % kDim, ": delivered ", pooled[0][i], ", a lookup now gives ", looked_up[i]));
            }
          }
        }
        if (ro.workers > 1) checked.arrive_and_wait();
        std::vector<std::vector<float>> grads = pooled;
        for (auto& g : grads) {
          for (float& x : g) x = x - 0.25f + 0.01f * static_cast<float>(t % 7);
        }
        seen[r].push_back(std::move(pooled));
        EMBER_RETURN_IF_ERROR(
            pipe.Push(t, std::vector<absl::Span<const float>>(grads.begin(), grads.end())));
      }
      return pipe.Close();
    };
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        status[r] = train(r);
        // A worker that failed stops holding the others at the barrier.
        if (!status[r].ok() && ro.workers > 1) checked.arrive_and_drop();
      });
    }
    for (std::thread& t : threads) t.join();
    stats->clear();
    for (int r = 0; r < n; ++r) {
      EMBER_RETURN_IF_ERROR(status[r]);
      stats->push_back(pipes[r]->Stats());
    }
    return seen;
  }

  // Every row of the table's keys, as served now.
  static std::vector<float> AllRows(const std::string& table) {
    std::vector<uint64_t> keys;
    for (uint64_t id = 0; id < kOneHotIds; ++id) keys.push_back(Mix64(id));
    for (uint64_t id = 1000; id < 1120; ++id) keys.push_back(Mix64(id));
    absl::StatusOr<std::vector<float>> rows = client_->LookupRows(table, keys);
    EXPECT_OK(rows);
    return rows.ok() ? *rows : std::vector<float>{};
  }

  // Trains the same steps on a copy of `config` with early fetch off and
  // on (with `patch`, PipelineOptions::early_fetch_patch); expects every
  // step's rows, and the tables after, bit-identical. Returns the early
  // run's stats.
  static std::vector<PipelineStats> ExpectEarlyEqualsPlain(v1::TableConfig config, int ranks,
                                                           bool check_against_lookup,
                                                           bool patch = true) {
    const std::string name = config.name();
    std::vector<Seen> seen[2];
    std::vector<PipelineStats> stats[2];
    std::vector<float> rows[2];
    for (int early = 0; early < 2; ++early) {
      config.set_name(absl::StrCat(name, early ? "_early" : "_plain", ranks));
      EXPECT_OK(client_->CreateTable(config));
      RunOptions ro;
      ro.table = config.name();
      ro.early = early;
      ro.patch = patch;
      ro.ranks = ranks;
      ro.check_against_lookup = check_against_lookup;
      absl::StatusOr<std::vector<Seen>> s = Run(ro, &stats[early]);
      EXPECT_OK(s) << (early ? "early" : "plain");
      if (!s.ok()) return {};
      seen[early] = std::move(*s);
      rows[early] = AllRows(config.name());
    }
    for (int r = 0; r < ranks; ++r) {
      for (int64_t t = 0; t < kSteps; ++t) {
        for (size_t f = 0; f < seen[0][r][t].size(); ++f) {
          const std::vector<float>& plain = seen[0][r][t][f];
          const std::vector<float>& early = seen[1][r][t][f];
          EXPECT_EQ(plain.size(), early.size());
          if (plain.size() != early.size() ||
              memcmp(plain.data(), early.data(), plain.size() * sizeof(float)) != 0) {
            ADD_FAILURE() << name << ": rank " << r << " step " << t << " feature " << f
                          << " differs between plain s = 0 and early fetch";
            return stats[1];
          }
        }
      }
    }
    EXPECT_EQ(rows[0].size(), rows[1].size());
    EXPECT_EQ(0, memcmp(rows[0].data(), rows[1].data(), rows[0].size() * sizeof(float)))
        << name << ": the tables differ after training";
    for (const PipelineStats& s : stats[0]) EXPECT_EQ(s.steps_patched + s.steps_refetched, 0u);
    return stats[1];
  }

  static std::vector<std::unique_ptr<ServerProcess>>* shards_;
  static Client* server_client_;
  static Client* in_process_client_;
  static Client* in_process_pool_client_;
  static Client* client_;  // the running test's

 public:
  static absl::Status RunForTest(const RunOptions& ro, std::vector<PipelineStats>* stats) {
    return Run(ro, stats).status();
  }
};
std::vector<std::unique_ptr<ServerProcess>>* EarlyFetchTest::shards_ = nullptr;
Client* EarlyFetchTest::server_client_ = nullptr;
Client* EarlyFetchTest::in_process_client_ = nullptr;
Client* EarlyFetchTest::in_process_pool_client_ = nullptr;
Client* EarlyFetchTest::client_ = nullptr;

TEST_P(EarlyFetchTest, EveryOptimizerAndDtypeSeesExactlyThePlainRowsWithOnePipeline) {
  for (v1::TableConfig config : EveryOptimizerAndDtype(kDim)) {
    SCOPED_TRACE(config.name());
    const std::vector<PipelineStats> stats =
        ExpectEarlyEqualsPlain(config, /*ranks=*/1, /*check_against_lookup=*/true);
    ASSERT_EQ(stats.size(), 1u);
    // Steps fetched early were all brought forward.
    ExpectMostStepsFetchedEarly(stats[0].steps_patched, 1);
    EXPECT_EQ(stats[0].steps_refetched, 0u);
    EXPECT_GT(stats[0].rows_patched, 0u);
    EXPECT_GT(stats[0].patch_bytes, 0u);
  }
}

TEST_P(EarlyFetchTest, EveryOptimizerAndDtypeSeesExactlyThePlainRowsWithMergedPipelines) {
  for (v1::TableConfig config : EveryOptimizerAndDtype(kDim)) {
    SCOPED_TRACE(config.name());
    const std::vector<PipelineStats> stats =
        ExpectEarlyEqualsPlain(config, /*ranks=*/2, /*check_against_lookup=*/true);
    ASSERT_EQ(stats.size(), 2u);
    for (const PipelineStats& s : stats) {
      ExpectMostStepsFetchedEarly(s.steps_patched, 2);
      EXPECT_EQ(s.steps_refetched, 0u);
    }
  }
}

// The alternative to the patch: the rows the node's own push changes are
// fetched after the push, only those, and the rest kept as peeked.
TEST_P(EarlyFetchTest, WithoutThePatchOnlyTheOwnChangedRowsComeAfterThePushExactly) {
  std::vector<v1::TableConfig> configs = {AdagradTable("refetch", kDim)};
  for (v1::TableConfig c : EveryOptimizerAndDtype(kDim)) {
    if (c.name() != "adam_bf16") continue;
    c.set_name("refetch_adam_bf16");
    configs.push_back(c);
  }
  for (const v1::TableConfig& config : configs) {
    for (int ranks : {1, 2}) {
      SCOPED_TRACE(absl::StrCat(config.name(), ", ranks ", ranks));
      const std::vector<PipelineStats> stats =
          ExpectEarlyEqualsPlain(config, ranks, /*check_against_lookup=*/true, /*patch=*/false);
      ASSERT_EQ(stats.size(), static_cast<size_t>(ranks));
      for (const PipelineStats& s : stats) {
        EXPECT_EQ(s.steps_patched, 0u);
        EXPECT_EQ(s.rows_patched, 0u);
        ExpectMostStepsFetchedEarly(s.steps_refetched, ranks);
        EXPECT_GT(s.rows_refetched, 0u);
        EXPECT_LT(s.rows_refetched, s.keys_refetched * 6 / 10)
            << "only the rows the push changed (~30% here) should come after it";
      }
    }
  }
}

TEST_P(EarlyFetchTest, TablesWithCapacityOrAdmissionAreFetchedAfterThePushAndStayExact) {
  // The lookups at Wait would count as accesses (eviction scores,
  // admission counts) at other moments in the two runs: compare the runs.
  v1::TableConfig capacity = AdagradTable("lru", kDim);
  capacity.set_capacity(96);  // far fewer rows than keys: evictions every step
  capacity.set_eviction(v1::EVICTION_POLICY_LRU);
  v1::TableConfig admission = AdagradTable("admit", kDim);
  admission.mutable_admission()->set_min_count(3);
  for (const v1::TableConfig& config : {capacity, admission}) {
    SCOPED_TRACE(config.name());
    for (int ranks : {1, 2}) {
      const std::vector<PipelineStats> stats =
          ExpectEarlyEqualsPlain(config, ranks, /*check_against_lookup=*/false);
      for (const PipelineStats& s : stats) {
        EXPECT_EQ(s.steps_patched, 0u);
        ExpectMostStepsFetchedEarly(s.steps_refetched, ranks);
      }
    }
  }
  // The LRU table evicted (the case the refetch exists for).
  absl::StatusOr<std::vector<v1::TableInfo>> tables = client_->ListTables();
  ASSERT_OK(tables);
  for (const v1::TableInfo& t : *tables) {
    if (t.config().name() == "lru_early1") {
      EXPECT_GT(t.evictions(), 0u);
    }
  }
}

TEST_P(EarlyFetchTest, TablesWithTtlAreFetchedAfterThePush) {
  // Expiry runs on the shard's timer, so two runs cannot be compared step
  // for step; the rows come from the lookup after the push, as plain s = 0.
  v1::TableConfig ttl = AdagradTable("ttl", kDim);
  ttl.mutable_ttl()->set_steps(2);
  ASSERT_OK(client_->CreateTable(ttl));
  RunOptions ro;
  ro.table = "ttl";
  ro.check_against_lookup = false;
  std::vector<PipelineStats> stats;
  ASSERT_OK(Run(ro, &stats).status());
  EXPECT_EQ(stats[0].steps_patched, 0u);
  ExpectMostStepsFetchedEarly(stats[0].steps_refetched, 1);
}

// Two SSP workers (nodes of `ranks` merged pipelines) at s = 0: every
// step is checked against a lookup then (RunOptions::check_against_lookup);
// the other worker's pushes may change any row, so each step is fetched
// after the push, but only the rows some push changed since the early fetch.
void ExpectTwoWorkersFetchOnlyChangedRows(const std::string& table, int ranks,
                                          uint32_t first_worker_id) {
  RunOptions ro;
  ro.table = table;
  ro.workers = 2;
  ro.ranks = ranks;
  ro.first_worker_id = first_worker_id;
  std::vector<PipelineStats> stats;
  ASSERT_OK(EarlyFetchTest::RunForTest(ro, &stats));
  ASSERT_EQ(stats.size(), static_cast<size_t>(2 * ranks));
  for (const PipelineStats& s : stats) {
    EXPECT_EQ(s.steps_patched, 0u);
    ExpectMostStepsFetchedEarly(s.steps_refetched, ranks);
    EXPECT_GT(s.rows_refetched, 0u);
    EXPECT_LT(s.rows_refetched, s.keys_refetched * 9 / 10)
        << "the fetch after the barrier should carry the changed rows, not the whole step";
  }
}

TEST_P(EarlyFetchTest, TwoWorkersFetchOnlyTheChangedRowsAfterTheBarrierAndSeeExactlyALookupThen) {
  ASSERT_OK(client_->CreateTable(AdagradTable("two_workers", kDim)));
  ExpectTwoWorkersFetchOnlyChangedRows("two_workers", /*ranks=*/1, /*first_worker_id=*/10);
}

TEST_P(EarlyFetchTest,
       TwoMergedNodesFetchOnlyTheChangedRowsAfterTheBarrierAndSeeExactlyALookupThen) {
  ASSERT_OK(client_->CreateTable(AdagradTable("two_nodes", kDim)));
  ExpectTwoWorkersFetchOnlyChangedRows("two_nodes", /*ranks=*/2, /*first_worker_id=*/20);
}

// The timeline shows the synchronous critical path (bench/critical_path.py
// reads it): every rank's Backward per push, the leading rank's Sum per
// merged push, its Update per step brought forward, and each rank's Patch.
TEST_P(EarlyFetchTest, MergedTimelineHasTheCriticalPathsBackwardSumUpdateAndPatchSpans) {
  ASSERT_OK(client_->CreateTable(AdagradTable("timeline", kDim)));
  TraceRecorder trace;
  RunOptions ro;
  ro.table = "timeline";
  ro.ranks = 2;
  ro.first_worker_id = 30;
  ro.check_against_lookup = false;
  ro.trace = &trace;
  std::vector<PipelineStats> stats;
  ASSERT_OK(RunForTest(ro, &stats));
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].steps_patched, stats[1].steps_patched);
  ExpectMostStepsFetchedEarly(stats[0].steps_patched, 2);
  const std::string path = TempPath("ember_early_trace.json");
  ASSERT_OK(trace.WriteJson(path));
  std::ifstream in(path);
  const std::string json((std::istreambuf_iterator<char>(in)), {});
  auto spans = [&](const std::string& name) {
    return Count(json, absl::StrCat("\"name\":\"", name, "\""));
  };
  EXPECT_EQ(spans("Backward"), size_t{2 * kSteps});
  EXPECT_EQ(spans("Sum"), size_t{kSteps});
  EXPECT_EQ(spans("Update"), stats[0].steps_patched);
  EXPECT_EQ(spans("Patch"), 2 * stats[0].steps_patched);
  EXPECT_EQ(trace.dropped(), 0u);
}

INSTANTIATE_TEST_SUITE_P(BothChannels, EarlyFetchTest, kEveryShardWay, ShardWayName);

}  // namespace
}  // namespace ember::testing
