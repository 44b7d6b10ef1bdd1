// The client library against real ember-server processes on 127.0.0.1:
// training through StepPipeline matches a single-process reference, SSP
// holds over the wire, keys are deduplicated and routed, and a shard that is
// killed and restarted mid-run costs retries, not a hang or a crash.
#include <signal.h>

#include <atomic>
#include <cmath>
#include <random>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ember/client.h"
#include "ember/step_pipeline.h"
#include "common/status_macros.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "kernels/embedding_store.h"
#include "server/table_config_proto.h"
#include "tests/server/requests.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

// `n` shard processes of one cluster.
absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> StartCluster(
    int n, const std::vector<std::string>& extra = {}) {
  std::vector<std::unique_ptr<ServerProcess>> shards;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> args = {absl::StrCat("--shard_index=", i),
                                     absl::StrCat("--shard_count=", n), "--worker_threads=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    absl::StatusOr<std::unique_ptr<ServerProcess>> p = ServerProcess::Start(args);
    if (!p.ok()) return p.status();
    shards.push_back(std::move(*p));
  }
  return shards;
}

ClientOptions OptionsFor(const std::vector<std::unique_ptr<ServerProcess>>& shards) {
  ClientOptions o;
  for (const auto& s : shards) o.shards.push_back(s->address());
  o.rpc_timeout = absl::Seconds(20);
  return o;
}

// The small model: three features over two tables ("a" is shared).
const std::vector<FeatureSpec> kFeatures = {
    {"user", "a", Combiner::kSum}, {"tags", "b", Combiner::kMean}, {"topics", "a", Combiner::kSqrtN}};
constexpr uint32_t kDim = 4;
constexpr int kBatch = 16;

v1::TableConfig SmallTable(const std::string& name, uint64_t seed) {
  v1::TableConfig c = AdagradTable(name, kDim);
  c.mutable_initializer()->set_seed(seed);
  c.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.1f);
  return c;
}

// A deterministic batch of step `step`; keys come from `key_base` + small ids
// so that steps repeat keys and examples hold duplicates.
Batch MakeBatch(int64_t step, uint64_t key_base) {
  std::mt19937_64 rng(step * 7919 + key_base);
  Batch b;
  for (size_t f = 0; f < kFeatures.size(); ++f) {
    FeatureBatch fb;
    fb.offsets = {0};
    for (int i = 0; i < kBatch; ++i) {
      const int n = f == 0 ? 1 : static_cast<int>(rng() % 4);  // multi-hot, sometimes empty
      for (int j = 0; j < n; ++j) {
        fb.keys.push_back(key_base + f * 1000 + rng() % 40);
        if (f == 2) fb.weights.push_back(0.5f + static_cast<float>(rng() % 4));
      }
      fb.offsets.push_back(static_cast<int64_t>(fb.keys.size()));
    }
    b.features.push_back(std::move(fb));
  }
  return b;
}

// The trainer's loss gradient: d(pooled) = pooled - 0.25, elementwise.
std::vector<float> LossGradient(absl::Span<const float> pooled) {
  std::vector<float> g(pooled.begin(), pooled.end());
  for (float& x : g) x -= 0.25f;
  return g;
}

// Runs `steps` steps through a pipeline: prefetch ahead, wait, push.
absl::Status Train(StepPipeline& pipe, int64_t steps, uint64_t key_base) {
  const int depth = pipe.prefetch_depth();
  int64_t prefetched = 0;
  for (int64_t t = 0; t < steps; ++t) {
    while (prefetched < steps && prefetched <= t + depth) {
      EMBER_RETURN_IF_ERROR(pipe.Prefetch(prefetched, MakeBatch(prefetched, key_base)));
      ++prefetched;
    }
    EMBER_ASSIGN_OR_RETURN(StepView view, pipe.Wait(t));
    std::vector<std::vector<float>> grads;
    for (const auto& p : view.pooled) grads.push_back(LossGradient(p));
    std::vector<absl::Span<const float>> spans(grads.begin(), grads.end());
    EMBER_RETURN_IF_ERROR(pipe.Push(t, spans));
  }
  return pipe.Flush();
}

// The same training written independently, in one process: naive pooling
// over local stores, per-id gradients pushed in the order the ids occur.
class ReferenceModel {
 public:
  ReferenceModel() {
    for (auto [name, seed] : {std::pair{"a", 1}, std::pair{"b", 2}}) {
      TableConfig config = *TableConfigFromProto(*NormalizeTableConfig(SmallTable(name, seed)));
      stores_[name] = *NewCpuStore(config);
    }
  }
  void Step(const Batch& batch) {
    std::map<std::string, std::vector<uint64_t>> keys;
    std::map<std::string, std::vector<float>> grads;
    for (size_t f = 0; f < kFeatures.size(); ++f) {
      const FeatureBatch& fb = batch.features[f];
      EmbeddingStore& store = *stores_[kFeatures[f].table];
      std::vector<float> rows(fb.keys.size() * kDim);
      EXPECT_OK(store.FindOrInsert(fb.keys, DType::kFp32, MutableBytes(rows)));
      for (int i = 0; i < kBatch; ++i) {
        float scale = 1, wsum = 0, w2sum = 0;
        for (int64_t j = fb.offsets[i]; j < fb.offsets[i + 1]; ++j) {
          const float w = fb.weights.empty() ? 1.0f : fb.weights[j];
          wsum += w;
          w2sum += w * w;
        }
        if (kFeatures[f].combiner == Combiner::kMean) scale = wsum == 0 ? 0 : 1 / wsum;
        if (kFeatures[f].combiner == Combiner::kSqrtN) scale = w2sum == 0 ? 0 : 1 / std::sqrt(w2sum);
        float pooled[kDim] = {};
        for (int64_t j = fb.offsets[i]; j < fb.offsets[i + 1]; ++j) {
          const float w = fb.weights.empty() ? 1.0f : fb.weights[j];
          for (uint32_t d = 0; d < kDim; ++d) pooled[d] += w * rows[j * kDim + d];
        }
        for (uint32_t d = 0; d < kDim; ++d) pooled[d] = pooled[d] * scale - 0.25f;  // the loss gradient
        for (int64_t j = fb.offsets[i]; j < fb.offsets[i + 1]; ++j) {
          const float w = fb.weights.empty() ? 1.0f : fb.weights[j];
          keys[kFeatures[f].table].push_back(fb.keys[j]);
          for (uint32_t d = 0; d < kDim; ++d) grads[kFeatures[f].table].push_back(w * scale * pooled[d]);
        }
      }
    }
    for (auto& [table, k] : keys) EXPECT_OK(stores_[table]->ApplyGradients(k, DType::kFp32, Bytes(grads[table])));
  }
  std::vector<float> Rows(const std::string& table, const std::vector<uint64_t>& keys) {
    std::vector<float> rows(keys.size() * kDim);
    EXPECT_OK(stores_[table]->Find(keys, DType::kFp32, MutableBytes(rows)));
    return rows;
  }

 private:
  std::map<std::string, std::unique_ptr<EmbeddingStore>> stores_;
};

std::vector<uint64_t> AllKeys(int feature, uint64_t key_base) {
  std::vector<uint64_t> keys;
  for (uint64_t id = 0; id < 40; ++id) keys.push_back(key_base + feature * 1000 + id);
  return keys;
}

void ExpectRowsMatch(Client& client, ReferenceModel& reference, uint64_t key_base) {
  for (auto [table, features] : {std::pair{"a", std::vector<int>{0, 2}}, std::pair{"b", std::vector<int>{1}}}) {
    for (int f : features) {
      const std::vector<uint64_t> keys = AllKeys(f, key_base);
      absl::StatusOr<std::vector<float>> served = client.LookupRows(table, keys);
      ASSERT_OK(served);
      const std::vector<float> expected = reference.Rows(table, keys);
      ASSERT_EQ(served->size(), expected.size());
      for (size_t i = 0; i < expected.size(); ++i) {
        ASSERT_NEAR((*served)[i], expected[i], 1e-6f * (1 + std::abs(expected[i])))
            << "table " << table << " key " << keys[i / kDim] << " element " << i % kDim;
      }
    }
  }
}

class PipelineIntegrationTest : public ::testing::Test {
 protected:
  void StartShards(int n) {
    absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> shards = StartCluster(n);
    ASSERT_OK(shards);
    shards_ = std::move(*shards);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(OptionsFor(shards_));
    ASSERT_OK(client);
    client_ = std::move(*client);
    ASSERT_OK(client_->CreateTable(SmallTable("a", 1)));
    ASSERT_OK(client_->CreateTable(SmallTable("b", 2)));
  }
  absl::StatusOr<std::unique_ptr<StepPipeline>> NewPipeline(uint32_t worker, int staleness,
                                                            std::vector<FeatureSpec> features = kFeatures) {
    PipelineOptions o;
    o.worker_id = worker;
    o.features = std::move(features);
    o.staleness = staleness;
    return StepPipeline::Create(client_.get(), o);
  }

  std::vector<std::unique_ptr<ServerProcess>> shards_;
  std::unique_ptr<Client> client_;
};

TEST_F(PipelineIntegrationTest, SynchronousTrainingOnThreeShardsMatchesASingleProcessReference) {
  ASSERT_NO_FATAL_FAILURE(StartShards(3));
  absl::StatusOr<std::unique_ptr<StepPipeline>> pipe = NewPipeline(0, 0);
  ASSERT_OK(pipe);
  constexpr int kSteps = 300;
  ASSERT_OK(Train(**pipe, kSteps, /*key_base=*/0));
  ASSERT_OK((*pipe)->Close());
  ReferenceModel reference;
  for (int64_t t = 0; t < kSteps; ++t) reference.Step(MakeBatch(t, 0));
  ExpectRowsMatch(*client_, reference, 0);
}

TEST_F(PipelineIntegrationTest, TwoSynchronousWorkersInParallelEachMatchTheirReference) {
  ASSERT_NO_FATAL_FAILURE(StartShards(2));
  constexpr int kSteps = 150;
  const uint64_t bases[2] = {0, 1'000'000};  // disjoint keys: each worker's result is deterministic
  std::vector<std::unique_ptr<StepPipeline>> pipes;
  for (uint32_t w = 0; w < 2; ++w) {
    absl::StatusOr<std::unique_ptr<StepPipeline>> p = NewPipeline(w, 0);
    ASSERT_OK(p);
    pipes.push_back(std::move(*p));
  }
  absl::Status results[2];
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] { results[w] = Train(*pipes[w], kSteps, bases[w]); });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < 2; ++w) {
    ASSERT_OK(results[w]);
    ASSERT_OK(pipes[w]->Close());
    ReferenceModel reference;
    for (int64_t t = 0; t < kSteps; ++t) reference.Step(MakeBatch(t, bases[w]));
    ExpectRowsMatch(*client_, reference, bases[w]);
  }
}

// Each worker pushes gradient 1 for its own key every step into an SGD
// (learning rate 1) table of zeros, and reads every worker's key: the row is
// minus the number of that worker's pushes applied. With staleness s a
// lookup for step t must see at least t - s of them.
void RunStalenessCheck(Client* client, int staleness, int* stale_reads) {
  constexpr int kWorkers = 3, kSteps = 60;
  std::vector<std::unique_ptr<StepPipeline>> pipes;
  for (int w = 0; w < kWorkers; ++w) {
    PipelineOptions o;
    o.worker_id = w;
    o.features = {{"counter", absl::StrCat("counter", staleness), Combiner::kSum}};
    o.staleness = staleness;
    absl::StatusOr<std::unique_ptr<StepPipeline>> p = StepPipeline::Create(client, o);
    ASSERT_OK(p);
    pipes.push_back(std::move(*p));
  }
  std::atomic<int> violations{0}, stale{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      StepPipeline& pipe = *pipes[w];
      std::mt19937 rng(w);
      auto batch = [] {
        Batch b;
        b.features.push_back({{0, 1, 2, 3}, {100, 101, 102}, {}});  // example w reads worker w's key
        return b;
      };
      int64_t prefetched = 0;
      for (int64_t t = 0; t < kSteps; ++t) {
        while (prefetched <= t + pipe.prefetch_depth()) {
          ASSERT_OK(pipe.Prefetch(prefetched++, batch()));
        }
        absl::StatusOr<StepView> view = pipe.Wait(t);
        ASSERT_OK(view);
        for (int other = 0; other < kWorkers; ++other) {
          const int seen = static_cast<int>(-view->pooled[0][other]);
          if (seen < t - staleness) ++violations;
          if (seen < t) ++stale;
        }
        absl::SleepFor(absl::Microseconds(rng() % 2000));  // uneven compute
        std::vector<float> grad(kWorkers, 0.0f);
        grad[w] = 1.0f;
        ASSERT_OK(pipe.Push(t, {absl::MakeConstSpan(grad)}));
      }
    });
  }
  for (auto& t : threads) t.join();
  // The last prefetched steps wait for pushes that never come until the
  // workers unregister; closing all of them releases those lookups.
  for (auto& p : pipes) ASSERT_OK(p->Close());
  pipes.clear();
  EXPECT_EQ(violations.load(), 0) << "a lookup saw fewer than t - s pushes of some worker";
  *stale_reads = stale.load();
}

TEST_F(PipelineIntegrationTest, StalenessBoundHoldsOverTheWireWithPrefetch) {
  ASSERT_NO_FATAL_FAILURE(StartShards(2));
  for (int s : {0, 1}) {
    ASSERT_OK(client_->CreateTable(CountingTable(absl::StrCat("counter", s), 1)));
    int stale_reads = -1;
    RunStalenessCheck(client_.get(), s, &stale_reads);
    if (s == 0) {
      EXPECT_EQ(stale_reads, 0) << "s = 0 is synchronous";
    }
  }
}

TEST_F(PipelineIntegrationTest, KeysAreDeduplicatedPerTableBeforeTheNetwork) {
  ASSERT_NO_FATAL_FAILURE(StartShards(2));
  absl::StatusOr<std::unique_ptr<StepPipeline>> pipe = NewPipeline(0, -1);
  ASSERT_OK(pipe);
  // "user" and "topics" share table "a": key 5 appears in both and twice in one.
  Batch b;
  b.features.push_back({{0, 1, 2}, {5, 6}, {}});
  b.features.push_back({{0, 2, 2}, {5, 5}, {}});
  b.features.push_back({{0, 3, 3}, {5, 5, 7}, {1, 1, 1}});
  ASSERT_OK((*pipe)->Prefetch(0, b));
  ASSERT_OK((*pipe)->Wait(0));
  const PipelineStats st = (*pipe)->Stats();
  EXPECT_EQ(st.keys, 7u);
  EXPECT_EQ(st.unique_keys, 4u) << "a: {5, 6, 7}, b: {5}";
  EXPECT_EQ(st.bytes_sent, 4u * 8);
  EXPECT_EQ(st.bytes_received, 4u * kDim * 4);
  EXPECT_EQ(*client_->StoredRows("a"), 3u);
  EXPECT_EQ(*client_->StoredRows("b"), 1u);
}

TEST_F(PipelineIntegrationTest, PipelineRejectsOutOfOrderStepsAndBadGradientsChangingNothing) {
  ASSERT_NO_FATAL_FAILURE(StartShards(2));
  absl::StatusOr<std::unique_ptr<StepPipeline>> pipe = NewPipeline(0, -1);
  ASSERT_OK(pipe);
  StepPipeline& p = **pipe;
  EXPECT_EQ(p.Wait(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.Prefetch(1, MakeBatch(1, 0)).code(), absl::StatusCode::kFailedPrecondition);
  Batch bad = MakeBatch(0, 0);
  bad.features[1].keys.pop_back();
  absl::Status s = p.Prefetch(0, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("feature 'tags' field 'keys'"), std::string::npos) << s;
  ASSERT_OK(p.Prefetch(0, MakeBatch(0, 0)));
  ASSERT_OK(p.Prefetch(1, MakeBatch(1, 0)));
  EXPECT_EQ(p.Prefetch(2, MakeBatch(2, 0)).code(), absl::StatusCode::kFailedPrecondition)
      << "beyond prefetch depth 1";
  absl::StatusOr<StepView> view = p.Wait(0);
  ASSERT_OK(view);
  std::vector<float> short_grad(3);
  s = p.Push(0, {short_grad, view->pooled[1], view->pooled[2]});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("feature 'user' (table 'a') field 'd_pooled': expected 64 floats"),
            std::string::npos)
      << s;
  const std::vector<uint64_t> keys = AllKeys(0, 0);
  absl::StatusOr<std::vector<float>> before = client_->LookupRows("a", keys);
  ASSERT_OK(before);
  ASSERT_OK(p.Push(0, view->pooled));
  ASSERT_OK(p.Flush());
  absl::StatusOr<std::vector<float>> after = client_->LookupRows("a", keys);
  ASSERT_OK(after);
  EXPECT_NE(*before, *after) << "the valid push was applied";
  ASSERT_OK(p.Close());
  EXPECT_EQ(p.Wait(1).status().code(), absl::StatusCode::kFailedPrecondition) << "closed";
}

TEST_F(PipelineIntegrationTest, UnknownTableAndMisorderedShardsAreRefusedWithClearErrors) {
  ASSERT_NO_FATAL_FAILURE(StartShards(3));
  absl::StatusOr<std::unique_ptr<StepPipeline>> pipe =
      NewPipeline(0, 0, {{"user", "nope", Combiner::kSum}});
  EXPECT_EQ(pipe.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(pipe.status().message().find("feature 'user': table 'nope'"), std::string::npos);

  ClientOptions swapped = OptionsFor(shards_);
  std::swap(swapped.shards[0], swapped.shards[1]);
  absl::StatusOr<std::unique_ptr<Client>> bad = Client::Connect(swapped);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(bad.status().message().find(absl::StrCat("shard 0 (", shards_[1]->address(),
                                                     "): expected shard 0 of 3, received shard 1 of 3")),
            std::string::npos)
      << bad.status();
  // A key sent to a shard that does not own it is refused by the shard, and
  // the client's error names that shard.
  std::vector<v1::LookupRequest> requests(3);
  const uint64_t key = OwnedKeys(0, 3, 1)[0];
  AddLookup(&requests[2], "a", {key});
  std::vector<v1::LookupResponse> responses;
  absl::Status s = client_->Lookup(requests, &responses);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(absl::StrCat("shard 2 (", shards_[2]->address(), ") Lookup: table 'a'")),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("misrouted: expected shard 0 of 3"), std::string::npos) << s;
}

TEST_F(PipelineIntegrationTest, ShardKilledAndRestartedMidRunCostsRetriesNotAHang) {
  // Tables come from a config file so that the restarted shard has them.
  const std::string config = ::testing::TempDir() + "/pipeline_tables.textproto";
  {
    v1::TableConfigList list;
    *list.add_tables() = SmallTable("a", 1);
    *list.add_tables() = SmallTable("b", 2);
    std::string text;
    ASSERT_TRUE(google::protobuf::TextFormat::PrintToString(list, &text));
    std::ofstream(config) << text;
  }
  absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> shards =
      StartCluster(2, {"--table_config_file=" + config});
  ASSERT_OK(shards);
  shards_ = std::move(*shards);
  ClientOptions options = OptionsFor(shards_);
  options.retry_budget = absl::Seconds(60);
  options.max_backoff = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_OK(client);
  client_ = std::move(*client);
  ClientOptions impatient = options;
  impatient.retry_budget = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<Client>> quick = Client::Connect(impatient);
  ASSERT_OK(quick);

  absl::StatusOr<std::unique_ptr<StepPipeline>> pipe = NewPipeline(0, 0);
  ASSERT_OK(pipe);
  constexpr int kSteps = 2000;  // far more than run before the kill below
  absl::Status trained;
  std::atomic<bool> done{false};
  std::thread trainer([&] {
    trained = Train(**pipe, kSteps, 0);
    done = true;
  });
  for (int i = 0; i < 1000 && (*pipe)->Stats().steps_pushed < 20; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GE((*pipe)->Stats().steps_pushed, 20);
  const int port = shards_[1]->port();
  absl::StatusOr<int> killed = shards_[1]->Stop(SIGKILL, absl::Seconds(10));
  ASSERT_OK(killed);
  // While it is down, a client with a short retry budget gets UNAVAILABLE
  // naming the shard.
  const std::vector<uint64_t> keys = OwnedKeys(1, 2, 4);
  absl::StatusOr<std::vector<float>> down = (*quick)->LookupRows("a", keys);
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(down.status().message().find(absl::StrCat("shard 1 (127.0.0.1:", port, ") Lookup")),
            std::string::npos)
      << down.status();
  EXPECT_FALSE(done.load()) << "the trainer cannot finish while a shard is down";
  absl::SleepFor(absl::Milliseconds(500));
  absl::StatusOr<std::unique_ptr<ServerProcess>> restarted = ServerProcess::Start(
      {"--shard_index=1", "--shard_count=2", absl::StrCat("--port=", port),
       "--table_config_file=" + config});
  ASSERT_OK(restarted);
  shards_[1] = std::move(*restarted);
  trainer.join();  // bounded: the retry budget is 60 s, the test timeout 300 s
  ASSERT_OK(trained);
  EXPECT_GT(client_->Stats().retries, 0u);
  EXPECT_EQ((*pipe)->Stats().steps_pushed, kSteps);
  ASSERT_OK((*pipe)->Close());
}

}  // namespace
}  // namespace ember::testing
