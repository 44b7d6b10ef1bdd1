// The client library against real ember-server processes on 127.0.0.1 and
// against shards in the test's own process, one suite over both channels
// (ShardWay): training through StepPipeline matches a single-process
// reference, SSP holds, keys are deduplicated and routed, and the same
// errors come back either way. Over the servers only: a shard that is
// killed and restarted mid-run costs retries, not a hang or a crash.
#include <signal.h>
#if EMBER_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/internal/step_merger_impl.h"
#include "common/status_macros.h"
#include "ember/client.h"
#include "ember/device.h"
#include "ember/step_merger.h"
#include "ember/step_pipeline.h"
#include "ember/trainer_metrics.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "kernels/embedding_store.h"
#include "kernels/store_factory.h"
#include "kernels/table_config_proto.h"
#include "tests/client/shard_way.h"
#include "tests/server/requests.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

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

// Runs `steps` steps through a pipeline: prefetch ahead, wait, push. With
// `in_place`, the gradients are written over the view and the view itself
// is pushed (the pipeline's buffers, passed back to it).
absl::Status Train(StepPipeline& pipe, int64_t steps, uint64_t key_base, bool in_place = false) {
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
    if (in_place) {
      for (size_t f = 0; f < grads.size(); ++f) {
        std::copy(grads[f].begin(), grads[f].end(), view.pooled[f].begin());
      }
      EMBER_RETURN_IF_ERROR(pipe.Push(t, view.pooled));
      continue;
    }
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

class PipelineIntegrationTest : public ::testing::TestWithParam<ShardWay> {
 protected:
  void StartShards(int n) {
    ClientOptions options;
    if (GetParam() == ShardWay::kServers) {
      absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> shards = StartCluster(n);
      ASSERT_OK(shards);
      shards_ = std::move(*shards);
      options = OptionsFor(shards_);
    } else {
      options = InProcessOptionsFor(n, GetParam());
    }
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
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

  // Trains while shard 1 is SIGKILLed and restarted on its port: the
  // trainer's calls are retried, the run completes. Streams or unary calls.
  void KillAndRestartShardMidRun(bool streams) {
    // Tables come from a config file so that the restarted shard has them.
    const std::string config = TempPath("pipeline_tables.textproto");
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
    options.exchange_streams = streams;
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

  std::vector<std::unique_ptr<ServerProcess>> shards_;
  std::unique_ptr<Client> client_;
};

INSTANTIATE_TEST_SUITE_P(BothChannels, PipelineIntegrationTest, kEveryShardWay, ShardWayName);

// What only shard servers have: addresses, processes that die and restart.
class PipelineOnServersTest : public PipelineIntegrationTest {};
INSTANTIATE_TEST_SUITE_P(Servers, PipelineOnServersTest, ::testing::Values(ShardWay::kServers),
                         ShardWayName);

TEST_P(PipelineIntegrationTest, SynchronousTrainingOnThreeShardsMatchesASingleProcessReference) {
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

TEST_P(PipelineIntegrationTest, PushingTheWaitViewItselfBackAsGradientsMatchesTheReference) {
  // Gradients written over the view are pushed from where they are, without
  // a copy, and the buffers are reused by later steps: each step's push
  // must still carry its own gradients.
  ASSERT_NO_FATAL_FAILURE(StartShards(2));
  absl::StatusOr<std::unique_ptr<StepPipeline>> pipe = NewPipeline(0, 0);
  ASSERT_OK(pipe);
  constexpr int kSteps = 100;
  ASSERT_OK(Train(**pipe, kSteps, /*key_base=*/0, /*in_place=*/true));
  ASSERT_OK((*pipe)->Close());
  ReferenceModel reference;
  for (int64_t t = 0; t < kSteps; ++t) reference.Step(MakeBatch(t, 0));
  ExpectRowsMatch(*client_, reference, 0);
}

TEST_P(PipelineIntegrationTest,
       PrefetchFromAnInputThreadWhileAnotherWaitsAndPushesMatchesTheReference) {
  // The contract ember.tf relies on: an input pipeline's thread prefetches
  // while the training thread waits and pushes (the C ABI's blocking
  // prefetch, modelled here with two counters).
  ASSERT_NO_FATAL_FAILURE(StartShards(2));
  absl::StatusOr<std::unique_ptr<StepPipeline>> pipe = NewPipeline(0, 0);
  ASSERT_OK(pipe);
  constexpr int64_t kSteps = 200;
  const int64_t depth = (*pipe)->prefetch_depth();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::atomic<int64_t> prefetched{0};  // steps prefetched so far
  std::atomic<int64_t> pushed{0};      // steps pushed so far
  absl::Status input_status;
  std::thread input([&] {
    for (int64_t p = 0; p < kSteps; ++p) {
      while (p - pushed.load() > depth) {
        if (absl::Now() > deadline) {
          input_status = absl::DeadlineExceededError("input thread");
          return;
        }
        std::this_thread::yield();
      }
      input_status = (*pipe)->Prefetch(p, MakeBatch(p, 0));
      if (!input_status.ok()) return;
      prefetched.store(p + 1);
    }
  });
  absl::Status train_status;
  for (int64_t t = 0; t < kSteps && train_status.ok(); ++t) {
    while (prefetched.load() <= t && absl::Now() < deadline) std::this_thread::yield();
    absl::StatusOr<StepView> view = (*pipe)->Wait(t);
    if (!view.ok()) {
      train_status = view.status();
      break;
    }
    std::vector<std::vector<float>> grads;
    for (const auto& p : view->pooled) grads.push_back(LossGradient(p));
    std::vector<absl::Span<const float>> spans(grads.begin(), grads.end());
    train_status = (*pipe)->Push(t, spans);
    pushed.store(t + 1);
  }
  input.join();
  ASSERT_OK(input_status);
  ASSERT_OK(train_status);
  ASSERT_OK((*pipe)->Close());
  ReferenceModel reference;
  for (int64_t t = 0; t < kSteps; ++t) reference.Step(MakeBatch(t, 0));
  ExpectRowsMatch(*client_, reference, 0);
}

TEST_P(PipelineIntegrationTest, TwoSynchronousWorkersInParallelEachMatchTheirReference) {
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

TEST_P(PipelineIntegrationTest, StalenessBoundHoldsOverTheWireWithPrefetch) {
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

TEST_P(PipelineIntegrationTest, KeysAreDeduplicatedPerTableBeforeTheNetwork) {
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

TEST_P(PipelineIntegrationTest, PipelineRejectsOutOfOrderStepsAndBadGradientsChangingNothing) {
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

TEST_P(PipelineOnServersTest, UnknownTableAndMisorderedShardsAreRefusedWithClearErrors) {
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

TEST_P(PipelineOnServersTest, ShardKilledAndRestartedMidRunCostsRetriesNotAHang) {
  KillAndRestartShardMidRun(/*streams=*/false);
}

// The same on exchange streams: the streams of the killed shard break while
// exchanges are in flight, and are replaced.
TEST_P(PipelineOnServersTest, ShardKilledAndRestartedMidRunOnStreamsCostsRetriesNotAHang) {
  KillAndRestartShardMidRun(/*streams=*/true);
}

// ---- The timeline (PipelineOptions::trace).

// With metrics too, so that the sanitizer builds run the pipeline's
// metric updates (the exact values are checked in metrics_integration_test).
TEST_P(PipelineIntegrationTest, TimelineIsChromeTraceJsonWithEveryStepsSpans) {
  StartShards(2);
  TraceRecorder trace;
  TrainerMetrics metrics;
  PipelineOptions o;
  o.worker_id = 3;
  o.features = kFeatures;
  o.staleness = 1;
  o.trace = &trace;
  o.metrics = &metrics;
  auto pipe = StepPipeline::Create(client_.get(), o);
  ASSERT_OK(pipe);
  constexpr int64_t kSteps = 12;
  ASSERT_OK(Train(**pipe, kSteps, 0));
  ASSERT_OK((*pipe)->Close());
  const std::string path = TempPath("ember_trace.json");
  ASSERT_OK(trace.WriteJson(path));
  std::ifstream in(path);
  const std::string json((std::istreambuf_iterator<char>(in)), {});
  // Valid JSON with the trace-event structure (not inspected in sanitizer
  // builds, see kSanitizerBuild).
  if (!kSanitizerBuild) {
    google::protobuf::Struct parsed;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok())
        << json.substr(0, 500);
    ASSERT_TRUE(parsed.fields().contains("traceEvents"));
  }
  ASSERT_EQ(json.rfind("{\"traceEvents\":[", 0), 0u) << json.substr(0, 100);
  EXPECT_EQ(Count(json, "\"name\":\"Prefetch\""), size_t{kSteps});
  EXPECT_EQ(Count(json, "\"name\":\"Wait\""), size_t{kSteps});
  EXPECT_EQ(Count(json, "\"name\":\"Push\""), size_t{kSteps});
  EXPECT_EQ(Count(json, "\"name\":\"Pool\""), size_t{kSteps});
  EXPECT_EQ(Count(json, "\"name\":\"Backward\""), size_t{kSteps});
  for (int64_t t = 0; t < kSteps; ++t) {  // every fetch and push went out in some round trip
    EXPECT_EQ(Count(json, absl::StrCat("\"fetch_step\":", t, ",")), 1u) << t;
    EXPECT_EQ(Count(json, absl::StrCat("\"push_step\":", t, ",")), 1u) << t;
  }
  // One process for the worker (pid 4), with a trainer, a network and a
  // track per shard; each round trip is one RPC to each of the 2 shards
  // (pushes go to every shard, and every fetch here has keys on both).
  EXPECT_EQ(Count(json, "\"name\":\"worker 3\""), 1u);
  EXPECT_EQ(Count(json, "\"name\":\"trainer\""), 1u);
  EXPECT_EQ(Count(json, "\"name\":\"network\""), 1u);
  for (uint32_t sh = 0; sh < 2; ++sh) {
    EXPECT_EQ(Count(json, "\"name\":\"" + client_->ShardName(sh) + "\""), 1u);
    EXPECT_EQ(Count(json, absl::StrCat("\"tid\":", 2 + sh, ",")),
              1 + Count(json, "\"name\":\"Exchange\""))
        << "shard " << sh << ": its track name and one RPC per round trip";
  }
  EXPECT_EQ(Count(json, "\"name\":\"Exchange RPC\""), 2 * Count(json, "\"name\":\"Exchange\""));
  EXPECT_EQ(Count(json, "\"attempt\":0,\"code\":\"OK\""), Count(json, "\"name\":\"Exchange RPC\""));
  EXPECT_EQ(Count(json, "\"pid\":4,"), Count(json, "\"ph\":"));
  EXPECT_EQ(trace.dropped(), 0u);
  const TrainerMetrics::Pipeline& m = metrics.ForWorker(3);
  EXPECT_EQ(m.steps->Value(), kSteps);
  EXPECT_EQ(m.pushes->Value(), kSteps);
  EXPECT_EQ(m.exposed_wait->Snap().count, uint64_t{kSteps});
  EXPECT_EQ(m.keys->Value(), static_cast<double>((*pipe)->Stats().keys));
  EXPECT_EQ(m.failed->Value(), 0);
}

// ---- The node shuffle (PipelineOptions::node_transport).

// A node's batch: the ranks' batches side by side (rank 0's examples first).
Batch Concat(const std::vector<Batch>& parts) {
  Batch out;
  for (size_t f = 0; f < parts[0].features.size(); ++f) {
    FeatureBatch fb;
    fb.offsets = {0};
    for (const Batch& p : parts) {
      const FeatureBatch& src = p.features[f];
      for (size_t i = 1; i < src.offsets.size(); ++i) {
        fb.offsets.push_back(fb.offsets.back() + src.offsets[i] - src.offsets[i - 1]);
      }
      fb.keys.insert(fb.keys.end(), src.keys.begin(), src.keys.end());
      fb.weights.insert(fb.weights.end(), src.weights.begin(), src.weights.end());
    }
    out.features.push_back(std::move(fb));
  }
  return out;
}

// Trains `steps` steps, keeping each step's pooled rows.
absl::Status TrainRecording(StepPipeline& pipe, int64_t steps,
                            const std::function<Batch(int64_t)>& batch_of,
                            std::vector<std::vector<std::vector<float>>>* pooled) {
  int64_t prefetched = 0;
  for (int64_t t = 0; t < steps; ++t) {
    while (prefetched < steps && prefetched <= t + pipe.prefetch_depth()) {
      EMBER_RETURN_IF_ERROR(pipe.Prefetch(prefetched, batch_of(prefetched)));
      ++prefetched;
    }
    EMBER_ASSIGN_OR_RETURN(StepView view, pipe.Wait(t));
    std::vector<std::vector<float>> rows, grads;
    for (const auto& p : view.pooled) {
      rows.emplace_back(p.begin(), p.end());
      grads.push_back(LossGradient(p));
    }
    pooled->push_back(std::move(rows));
    std::vector<absl::Span<const float>> spans(grads.begin(), grads.end());
    EMBER_RETURN_IF_ERROR(pipe.Push(t, spans));
  }
  return pipe.Close();
}

// What a node of kNodeRanks pipelines did, and what one GPU training on the
// node's whole batch did, over kNodeSteps steps.
constexpr uint32_t kNodeRanks = 3;
constexpr int64_t kNodeSteps = 25;
struct NodeRun {
  std::vector<std::vector<std::vector<float>>> single_pooled;  // [step][feature]
  PipelineStats single_stats;
  std::vector<std::vector<std::vector<std::vector<float>>>> pooled;  // [rank][step][feature]
  std::vector<PipelineStats> stats;                                   // [rank]
  uint64_t node_rpcs = 0;  // the node's RPC attempts
};

// Trains the single GPU (tables "sa", "sb") and then the node, whose rank r
// pipeline gets `options_of(r)`; rank r's batch of step t is the r-th slice
// of the single GPU's. The ranks share many keys (ids from 40 per feature).
void TrainNodeBesideOneGpu(Client* client, const std::function<PipelineOptions(uint32_t)>& options_of,
                           NodeRun* run) {
  ASSERT_OK(client->CreateTable(SmallTable("sa", 1)));  // the single GPU's twins of a, b
  ASSERT_OK(client->CreateTable(SmallTable("sb", 2)));
  auto rank_batch = [](uint32_t r, int64_t t) { return MakeBatch(t * kNodeRanks + r, 0); };
  PipelineOptions single_options;
  single_options.worker_id = 10;
  single_options.staleness = 0;
  single_options.features = kFeatures;
  for (FeatureSpec& f : single_options.features) f.table = "s" + f.table;
  auto single = StepPipeline::Create(client, single_options);
  ASSERT_OK(single);
  ASSERT_OK(TrainRecording(**single, kNodeSteps,
                           [&](int64_t t) {
                             std::vector<Batch> parts;
                             for (uint32_t r = 0; r < kNodeRanks; ++r) parts.push_back(rank_batch(r, t));
                             return Concat(parts);
                           },
                           &run->single_pooled));
  run->single_stats = (*single)->Stats();

  std::vector<std::unique_ptr<StepPipeline>> pipes;
  for (uint32_t r = 0; r < kNodeRanks; ++r) {
    auto p = StepPipeline::Create(client, options_of(r));
    ASSERT_OK(p);
    pipes.push_back(std::move(*p));
  }
  const uint64_t rpcs_before = client->Stats().rpcs;
  run->pooled.assign(kNodeRanks, {});
  std::vector<absl::Status> results(kNodeRanks);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < kNodeRanks; ++r) {
    threads.emplace_back([&, r] {
      results[r] = TrainRecording(*pipes[r], kNodeSteps,
                                  [&](int64_t t) { return rank_batch(r, t); }, &run->pooled[r]);
    });
  }
  for (auto& t : threads) t.join();
  run->node_rpcs = client->Stats().rpcs - rpcs_before;
  for (uint32_t r = 0; r < kNodeRanks; ++r) {
    ASSERT_OK(results[r]);
    run->stats.push_back(pipes[r]->Stats());
  }
}

// Rank r's rows are the single GPU's rows of its examples: the same at the
// first step, and within float rounding after (the node sums a key's
// gradients rank by rank, the single GPU example by example).
void ExpectNodeTrainsLikeOneGpu(const NodeRun& run) {
  for (int64_t t = 0; t < kNodeSteps; ++t) {
    for (uint32_t r = 0; r < kNodeRanks; ++r) {
      for (size_t f = 0; f < kFeatures.size(); ++f) {
        const std::vector<float>& mine = run.pooled[r][t][f];
        ASSERT_EQ(mine.size(), size_t{kBatch} * kDim);
        for (size_t k = 0; k < mine.size(); ++k) {
          const float expected = run.single_pooled[t][f][r * kBatch * kDim + k];
          if (t == 0) {
            ASSERT_EQ(mine[k], expected) << "rank " << r << " feature " << f << " element " << k;
          } else {
            ASSERT_NEAR(mine[k], expected, 1e-5)
                << "step " << t << " rank " << r << " feature " << f << " element " << k;
          }
        }
      }
    }
  }
}

TEST_P(PipelineIntegrationTest, NodeShuffleFetchesEachKeyOncePerNodeAndTrainsLikeOneGpu) {
  StartShards(2);
  // One pipeline per rank, each its own SSP worker, exchanging.
  auto transports = NewInProcessTransports(kNodeRanks);
  NodeRun run;
  TrainNodeBesideOneGpu(client_.get(), [&](uint32_t r) {
    PipelineOptions o;
    o.worker_id = r;
    o.features = kFeatures;
    o.staleness = 0;
    o.node_transport = transports[r].get();
    return o;
  }, &run);
  if (HasFatalFailure()) return;
  // Each unique key of the node was fetched by exactly one rank.
  uint64_t fetched = 0, exchanged = 0;
  for (const PipelineStats& st : run.stats) {
    fetched += st.unique_keys;
    exchanged += st.exchange_bytes;
  }
  EXPECT_EQ(fetched, run.single_stats.unique_keys);
  EXPECT_GT(exchanged, 0u);
  ExpectNodeTrainsLikeOneGpu(run);
}

TEST_P(PipelineIntegrationTest, NodeShuffleWithStalenessOneTrainsEveryStep) {
  // With s = 1 a step's fetch goes out before the previous step's push: the
  // push must use its own step's routes, not the latest ones.
  StartShards(2);
  auto transports = NewInProcessTransports(kNodeRanks);
  std::vector<std::unique_ptr<StepPipeline>> pipes;
  for (uint32_t r = 0; r < kNodeRanks; ++r) {
    PipelineOptions o;
    o.worker_id = r;
    o.features = kFeatures;
    o.staleness = 1;
    o.node_transport = transports[r].get();
    auto p = StepPipeline::Create(client_.get(), o);
    ASSERT_OK(p);
    pipes.push_back(std::move(*p));
  }
  std::vector<absl::Status> results(kNodeRanks);
  std::vector<std::vector<std::vector<std::vector<float>>>> pooled(kNodeRanks);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < kNodeRanks; ++r) {
    threads.emplace_back([&, r] {
      results[r] = TrainRecording(*pipes[r], kNodeSteps,
                                  [&](int64_t t) { return MakeBatch(t * kNodeRanks + r, 0); },
                                  &pooled[r]);
    });
  }
  for (auto& t : threads) t.join();
  for (uint32_t r = 0; r < kNodeRanks; ++r) {
    ASSERT_OK(results[r]);
    EXPECT_EQ(pipes[r]->Stats().steps_pushed, kNodeSteps);
  }
}

// The node as one SSP worker (node_one_worker): rank r alone talks to the
// shards s with s % ranks == r, so each shard gets one push and one lookup
// per node step, whatever the rank count; rows as the single GPU's.
TEST_P(PipelineIntegrationTest, NodeShuffleAsOneWorkerSendsEachShardOneRequestPerNodeStep) {
  StartShards(2);
  auto transports = NewInProcessTransports(kNodeRanks);
  NodeRun run;
  TrainNodeBesideOneGpu(client_.get(), [&](uint32_t r) {
    PipelineOptions o;
    o.worker_id = 60;  // the node's, on every rank
    o.features = kFeatures;
    o.staleness = 0;
    o.node_transport = transports[r].get();
    o.node_one_worker = true;
    return o;
  }, &run);
  if (HasFatalFailure()) return;
  ExpectNodeTrainsLikeOneGpu(run);
  uint64_t fetched = 0;
  for (const PipelineStats& st : run.stats) fetched += st.unique_keys;
  EXPECT_EQ(fetched, run.single_stats.unique_keys);
  // At s = 0 without early fetch each step is a lookup, then a push: at
  // most 2 RPCs per shard per step (3 ranks each talking to every shard
  // would send 3x as many), and at least the pushes, which every step sends;
  // plus the one unregistration per shard at Close.
  EXPECT_LE(run.node_rpcs, 2u * 2 * kNodeSteps + 2);
  EXPECT_GE(run.node_rpcs, 2u * kNodeSteps + 2);
  // Rank 2 owns no shard of 2: it never sent anything itself.
  EXPECT_EQ(run.stats[2].unique_keys, 0u);
  // The node's one worker reached the last step on every shard, and was
  // unregistered at Close only after every rank's last push.
  auto infos = client_->ShardInfos();
  ASSERT_OK(infos);
  for (const auto& info : *infos) {
    for (const auto& w : info.workers()) {
      EXPECT_NE(w.worker_id(), 60u) << "Close unregisters the node's worker";
      EXPECT_FALSE(w.worker_id() < kNodeRanks) << "no rank registers a worker of its own";
    }
  }
}

TEST_P(PipelineIntegrationTest, NodeOneWorkerWithoutATransportIsRefused) {
  StartShards(2);
  PipelineOptions o;
  o.features = kFeatures;
  o.node_one_worker = true;
  auto p = StepPipeline::Create(client_.get(), o);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  EXPECT_NE(p.status().message().find("node_transport"), std::string::npos) << p.status();
}

// ---- The step merger (PipelineOptions::merger).

// Trains the node's ranks through one StepMerger with options `mo` (ranks,
// worker 50, staleness 0 set here) beside the single GPU; `*merger` is the
// merger, created after the single GPU has trained (a registered worker that
// never pushes would hold back that GPU's lookups).
void TrainMergedBesideOneGpu(Client* client, StepMergerOptions mo,
                             absl::StatusOr<std::unique_ptr<StepMerger>>* merger, NodeRun* run) {
  mo.ranks = kNodeRanks;
  mo.worker_id = 50;
  mo.staleness = 0;
  *merger = absl::UnknownError("not yet created");
  TrainNodeBesideOneGpu(client, [&](uint32_t r) {
    if (r == 0) {
      *merger = StepMerger::Create(client, mo);
      EXPECT_OK(*merger);
    }
    PipelineOptions o;
    o.worker_id = r;
    o.features = kFeatures;
    o.staleness = 0;
    o.merger = merger->ok() ? (*merger)->get() : nullptr;
    o.merger_rank = static_cast<int>(r);
    return o;
  }, run);
}

TEST_P(PipelineIntegrationTest, StepMergerSendsOneRequestPerShardPerNodeStepAndTrainsLikeOneGpu) {
  StartShards(2);
  absl::StatusOr<std::unique_ptr<StepMerger>> merger;
  NodeRun run;
  TrainMergedBesideOneGpu(client_.get(), StepMergerOptions(), &merger, &run);
  if (HasFatalFailure()) return;
  ExpectNodeTrainsLikeOneGpu(run);
  // The node fetched exactly the single GPU's keys: each key once per step.
  const StepMergerStats st = (*merger)->Stats();
  EXPECT_EQ(st.merged_keys, run.single_stats.unique_keys);
  uint64_t rank_keys = 0;
  for (const PipelineStats& p : run.stats) rank_keys += p.unique_keys;
  EXPECT_EQ(st.rank_keys, rank_keys);
  EXPECT_GT(st.rank_keys, st.merged_keys);  // the ranks share keys
  // One exchange per node step: the first two fetches alone (with early
  // fetch, the default at s = 0, step 1's goes before push 0), then each
  // push with the fetch of the step after next, then the last two pushes
  // alone; at most one RPC per shard each (no retries here).
  EXPECT_EQ(st.fetch_rounds, kNodeSteps);
  EXPECT_EQ(st.rounds, kNodeSteps + 2);
  EXPECT_LE(run.node_rpcs, static_cast<uint64_t>(st.rounds) * 2);
  // The node is one SSP worker: its clock reached the last step on every shard.
  auto infos = client_->ShardInfos();
  ASSERT_OK(infos);
  for (const auto& info : *infos) {
    bool found = false;
    for (const auto& w : info.workers()) {
      if (w.worker_id() == 50) {
        found = true;
        EXPECT_EQ(w.applied_step(), kNodeSteps - 1);
      }
      EXPECT_TRUE(w.worker_id() >= 10) << "rank pipelines must not register their own workers";
    }
    EXPECT_TRUE(found);
  }
}

// The test above pools from rows copied per rank (dim 4 is below
// copy_rows_below_bytes); here every row is pooled where it arrived in the
// shards' answers, as wide rows are.
TEST_P(PipelineIntegrationTest, StepMergerPoolingRowsInPlaceInTheAnswersTrainsLikeOneGpu) {
  StartShards(2);
  StepMergerOptions mo;
  mo.copy_rows_below_bytes = 0;
  absl::StatusOr<std::unique_ptr<StepMerger>> merger;
  NodeRun run;
  TrainMergedBesideOneGpu(client_.get(), mo, &merger, &run);
  if (HasFatalFailure()) return;
  ExpectNodeTrainsLikeOneGpu(run);
  EXPECT_EQ((*merger)->Stats().fetch_rounds, kNodeSteps);
}

TEST_P(PipelineIntegrationTest, StepMergerRefusesRanksOutOfStepAndTimesOutNamingTheMissingRank) {
  StartShards(2);
  StepMergerOptions mo;
  mo.ranks = 2;
  mo.staleness = -1;
  mo.timeout = absl::Milliseconds(200);
  auto merger = StepMerger::Create(client_.get(), mo);
  ASSERT_OK(merger);
  internal::StepMergerImpl* rounds = internal::MergerImpl(merger->get());
  ASSERT_OK(rounds->Join(0, {"a"}, {kDim}));
  ASSERT_OK(rounds->Join(1, {"a"}, {kDim}));
  EXPECT_EQ(rounds->Join(1, {"a"}, {kDim}).code(), absl::StatusCode::kFailedPrecondition);
  const std::vector<std::vector<uint64_t>> keys = {{1, 2, 3}};
  internal::StepMergerImpl::Part p0, p1;
  p0.fetch_step = 1;
  p0.keys = &keys;
  p1.fetch_step = 2;  // rank 1 is a step ahead
  p1.keys = &keys;
  absl::Status s1;
  std::thread t([&] { s1 = rounds->Merge(1, &p1); });
  const absl::Status s0 = rounds->Merge(0, &p0);
  t.join();
  EXPECT_EQ(s0.code(), absl::StatusCode::kFailedPrecondition) << s0;
  EXPECT_EQ(s0, s1);
  EXPECT_NE(s0.message().find("rank 0 pushes nothing and fetches step 1, rank 1 pushes nothing and fetches step 2"),
            std::string::npos) << s0;
  EXPECT_EQ(*client_->StoredRows("a"), 0u) << "a refused round changes nothing";
  // Rank 1 never comes: rank 0 gives up after the timeout, naming it.
  p0.fetch_step = 2;
  const absl::Status late = rounds->Merge(0, &p0);
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_NE(late.message().find("for rank(s) 1"), std::string::npos) << late;
  EXPECT_EQ(rounds->Merge(1, &p1), late) << "every later call fails the same way";
}

// Ranks that arrive while a push round waits for the others sum their
// gradients early, off the critical path, but never ahead of a lower rank:
// the sums have the bits of rank order whoever arrives when. The gradients
// (1e8, 1, -1e8, 1 per element) sum to 1 in rank order and to 0 in the
// arrival order used here (1, 0, 3, 2).
TEST_P(PipelineIntegrationTest, StepMergerSumsGradientsInRankOrderWhateverTheArrivalOrder) {
  StartShards(2);
  constexpr int kRanks = 4;
  StepMergerOptions mo;
  mo.ranks = kRanks;
  mo.staleness = -1;
  auto merger = StepMerger::Create(client_.get(), mo);
  ASSERT_OK(merger);
  internal::StepMergerImpl* rounds = internal::MergerImpl(merger->get());
  for (int r = 0; r < kRanks; ++r) ASSERT_OK(rounds->Join(r, {"a"}, {kDim}));
  constexpr uint64_t kKey = 7;
  const std::vector<std::vector<uint64_t>> keys = {{kKey}};
  // Each rank calls Merge in `order`, 150 ms after the one before.
  auto round = [&](const std::vector<int>& order,
                   std::vector<internal::StepMergerImpl::Part>& parts) {
    std::vector<absl::Status> status(kRanks);
    std::vector<std::thread> threads;
    for (int r : order) {
      threads.emplace_back([&, r] { status[r] = rounds->Merge(r, &parts[r]); });
      absl::SleepFor(absl::Milliseconds(150));
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r) EXPECT_OK(status[r]) << "rank " << r;
  };
  std::vector<internal::StepMergerImpl::Part> fetch(kRanks);
  for (auto& p : fetch) {
    p.fetch_step = 0;
    p.keys = &keys;
  }
  round({0, 1, 2, 3}, fetch);
  const float by_rank[kRanks] = {1e8f, 1.0f, -1e8f, 1.0f};
  std::vector<std::vector<float>> grads(kRanks);
  std::vector<internal::StepMergerImpl::Part> push(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    grads[r].assign(kDim, by_rank[r]);
    push[r].push_step = 0;
    push[r].grads = {grads[r].data()};
  }
  round({1, 0, 3, 2}, push);
  if (HasFailure()) return;
  // Rank 0 summed itself and rank 1 on arrival; rank 2, last, the rest.
  EXPECT_EQ((*merger)->Stats().ranks_summed_early, 2u);
  // The shard applied a summed gradient of exactly 1 per element.
  TableConfig config = *TableConfigFromProto(*NormalizeTableConfig(SmallTable("a", 1)));
  std::unique_ptr<EmbeddingStore> reference = *NewCpuStore(config);
  std::vector<float> expected(kDim), one(kDim, 1.0f);
  ASSERT_OK(reference->FindOrInsert({kKey}, DType::kFp32, MutableBytes(expected)));
  ASSERT_OK(reference->ApplyGradients({kKey}, DType::kFp32, Bytes(one)));
  ASSERT_OK(reference->Find({kKey}, DType::kFp32, MutableBytes(expected)));
  absl::StatusOr<std::vector<float>> served = client_->LookupRows("a", {kKey});
  ASSERT_OK(served);
  ASSERT_EQ(served->size(), expected.size());
  EXPECT_EQ(memcmp(served->data(), expected.data(), expected.size() * sizeof(float)), 0)
      << "served " << (*served)[0] << ", expected " << expected[0];
}

// ---- The device path (PipelineOptions::device). Its GPU cases skip here
// without a GPU and run in scripts/device_check.sh on one.

bool HaveGpu() { return CheckStoreDevice(StoreDevice{StoreDevice::Kind::kCuda, 0}).ok(); }

TEST_P(PipelineIntegrationTest, DevicePipelineNeedsAGpuAndItsOwnWaitAndPush) {
  StartShards(1);
  PipelineOptions o;
  o.features = kFeatures;
  o.staleness = -1;
  o.device = 0;
  auto dev = StepPipeline::Create(client_.get(), o);
  if (!HaveCudaPath() || !HaveGpu()) {
    ASSERT_FALSE(dev.ok());
    EXPECT_EQ(dev.status().code(), absl::StatusCode::kFailedPrecondition) << dev.status();
    EXPECT_NE(dev.status().message().find("cuda:0"), std::string::npos) << dev.status();
  } else {
    ASSERT_OK(dev);
    ASSERT_OK((*dev)->Prefetch(0, MakeBatch(0, 0)));
    auto w = (*dev)->Wait(0);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(w.status().message().find("use WaitOnDevice"), std::string::npos) << w.status();
  }
  auto host = NewPipeline(0, -1);
  ASSERT_OK(host);
  ASSERT_OK((*host)->Prefetch(0, MakeBatch(0, 0)));
  auto w = (*host)->WaitOnDevice(0, nullptr);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(w.status().message().find("use Wait / Push"), std::string::npos) << w.status();
}

#if EMBER_HAVE_CUDA
// The trainer's side of a device step in this test: pooled rows come back to
// the host only to be compared; gradients go up as a trainer's would be.
struct DeviceTrainer {
  explicit DeviceTrainer(StepPipeline* pipe) : pipe(pipe) { cudaStreamCreate(&stream); }
  ~DeviceTrainer() {
    for (float* p : d_grads) cudaFree(p);
    cudaStreamDestroy(stream);
  }
  // One step: returns the pooled rows it received (host copies).
  absl::StatusOr<std::vector<std::vector<float>>> Step(int64_t t) {
    EMBER_ASSIGN_OR_RETURN(DeviceStepView view, pipe->WaitOnDevice(t, stream));
    std::vector<std::vector<float>> pooled(view.pooled.size());
    d_grads.resize(view.pooled.size(), nullptr);
    std::vector<const float*> grads;
    for (size_t f = 0; f < view.pooled.size(); ++f) {
      const size_t n = view.batch_size * pipe->dim(f);
      pooled[f].resize(n);
      if (cudaMemcpyAsync(pooled[f].data(), view.pooled[f], n * 4, cudaMemcpyDeviceToHost,
                          stream) != cudaSuccess ||
          cudaStreamSynchronize(stream) != cudaSuccess) {
        return absl::InternalError("copying pooled rows back failed");
      }
      std::vector<float> g = LossGradient(pooled[f]);
      if (d_grads[f] == nullptr && cudaMalloc(&d_grads[f], 1 << 20) != cudaSuccess) {
        return absl::InternalError("cudaMalloc failed");
      }
      cudaMemcpyAsync(d_grads[f], g.data(), n * 4, cudaMemcpyHostToDevice, stream);
      grads.push_back(d_grads[f]);
    }
    EMBER_RETURN_IF_ERROR(pipe->PushFromDevice(t, grads, stream));
    cudaStreamSynchronize(stream);  // before d_grads is rewritten next step
    return pooled;
  }
  StepPipeline* pipe;
  cudaStream_t stream = nullptr;
  std::vector<float*> d_grads;
};

TEST_P(PipelineIntegrationTest, DevicePipelineRowsAndUpdatesMatchTheHostPipelineBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the device path runs on a GPU machine";
  StartShards(2);
  ASSERT_OK(client_->CreateTable(SmallTable("da", 1)));  // twins of a and b
  ASSERT_OK(client_->CreateTable(SmallTable("db", 2)));
  std::vector<FeatureSpec> dev_features = kFeatures;
  for (FeatureSpec& f : dev_features) f.table = "d" + f.table;
  PipelineOptions o;
  o.worker_id = 1;
  o.features = dev_features;
  o.staleness = -1;
  o.device = 0;
  auto dev = StepPipeline::Create(client_.get(), o);
  ASSERT_OK(dev);
  auto host = NewPipeline(0, -1);
  ASSERT_OK(host);
  constexpr int64_t kSteps = 40;
  DeviceTrainer trainer(dev->get());
  for (int64_t t = 0; t < kSteps; ++t) {
    ASSERT_OK((*host)->Prefetch(t, MakeBatch(t, 0)));
    ASSERT_OK((*dev)->Prefetch(t, MakeBatch(t, 0)));
    auto h = (*host)->Wait(t);
    ASSERT_OK(h);
    auto d = trainer.Step(t);
    ASSERT_OK(d);
    for (size_t f = 0; f < kFeatures.size(); ++f) {
      std::vector<float> hp(h->pooled[f].begin(), h->pooled[f].end());
      ASSERT_EQ(hp, (*d)[f]) << "step " << t << " feature " << f;
    }
    std::vector<std::vector<float>> grads;
    for (const auto& p : h->pooled) grads.push_back(LossGradient(p));
    std::vector<absl::Span<const float>> spans(grads.begin(), grads.end());
    ASSERT_OK((*host)->Push(t, spans));
    ASSERT_OK((*host)->Flush());  // both see step t's updates at step t + 1
    ASSERT_OK((*dev)->Flush());
  }
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 3000; ++k) keys.push_back(k);
  for (const char* t : {"a", "b"}) {
    auto hr = client_->LookupRows(t, keys);
    auto dr = client_->LookupRows(std::string("d") + t, keys);
    ASSERT_OK(hr);
    ASSERT_OK(dr);
    EXPECT_EQ(*hr, *dr) << "table " << t;
  }
  EXPECT_GT(*client_->StoredRows("da"), 0u);
  ASSERT_OK((*dev)->Close());
}

TEST(DeviceUniqueTest, UniqueAndInverseOnTheGpuRebuildTheKeys) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the device path runs on a GPU machine";
  std::mt19937_64 rng(3);
  std::vector<uint64_t> keys(100000);
  for (uint64_t& k : keys) k = rng() % 5000 == 0 ? ~uint64_t{0} : rng() % 20000;
  uint64_t* d_keys = nullptr;
  uint64_t* d_unique = nullptr;
  uint32_t* d_inverse = nullptr;
  ASSERT_EQ(cudaMalloc(&d_keys, keys.size() * 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_unique, keys.size() * 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_inverse, keys.size() * 4), cudaSuccess);
  cudaMemcpy(d_keys, keys.data(), keys.size() * 8, cudaMemcpyHostToDevice);
  auto u = DeviceUnique(d_keys, keys.size(), d_unique, d_inverse, nullptr);
  ASSERT_OK(u);
  std::vector<uint64_t> unique(*u);
  std::vector<uint32_t> inverse(keys.size());
  cudaMemcpy(unique.data(), d_unique, *u * 8, cudaMemcpyDeviceToHost);
  cudaMemcpy(inverse.data(), d_inverse, keys.size() * 4, cudaMemcpyDeviceToHost);
  std::vector<uint64_t> expected = keys;
  std::sort(expected.begin(), expected.end());
  expected.erase(std::unique(expected.begin(), expected.end()), expected.end());
  EXPECT_EQ(unique, expected);
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_EQ(unique[inverse[i]], keys[i]) << i;
  cudaFree(d_keys);
  cudaFree(d_unique);
  cudaFree(d_inverse);
}
#endif  // EMBER_HAVE_CUDA

}  // namespace
}  // namespace ember::testing
