// Training a real cluster from tests: two workers with their own keys (so
// that their pushes never touch one row in the same step, and a run is
// deterministic at s = 0), every optimizer and storage dtype, pipelines
// that start at any step. Shared by the checkpoint and move integration
// tests.
#pragma once

#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/file_system.h"
#include "common/key_hash.h"
#include "common/status_macros.h"
#include "ember/client.h"
#include "ember/step_pipeline.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "tests/server/requests.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace ember::testing {

inline constexpr uint32_t kDim = 4;
inline constexpr int kBatch = 8;
inline constexpr uint64_t kIdsPerFeature = 60;
inline const std::vector<v1::TableConfig> kTables = EveryOptimizerAndDtype(kDim);

// A cluster whose shard i keeps its checkpoints in dirs[i].
inline absl::StatusOr<Cluster> StartWithCheckpointDirs(int n, const std::vector<std::string>& dirs,
                                                       const std::vector<std::string>& extra) {
  return testing::StartCluster(n, extra, [&](int i) {
    return dirs.empty() ? std::vector<std::string>{}
                        : std::vector<std::string>{"--checkpoint_dir=" + dirs[i]};
  });
}

inline ClientOptions OptionsFor(const Cluster& shards,
                                absl::Duration retry_budget = absl::Seconds(30)) {
  ClientOptions o;
  for (const auto& s : shards) o.shards.push_back(s->address());
  o.rpc_timeout = absl::Seconds(30);
  o.retry_budget = retry_budget;
  return o;
}

inline absl::StatusOr<std::unique_ptr<Client>> Connect(
    const Cluster& shards, absl::Duration retry_budget = absl::Seconds(30)) {
  return Client::Connect(OptionsFor(shards, retry_budget));
}

// A --table_config_file of `tables`.
inline std::string TableConfigFile(const std::vector<v1::TableConfig>& tables = kTables,
                                   const std::string& name = "checkpoint_tables.textproto") {
  const std::string path = TempPath(name);
  v1::TableConfigList list;
  for (const auto& t : tables) *list.add_tables() = t;
  std::string text;
  google::protobuf::TextFormat::PrintToString(list, &text);
  std::ofstream(path) << text;
  return path;
}

inline std::string FreshDir(const std::string& name) {
  const std::string dir = JoinPath(::testing::TempDir(), name);
  EXPECT_OK(FileSystem::Posix()->RemoveAll(dir));
  return dir;
}

// Worker w's keys of feature f: its own ids, so that two workers never
// update one row in the same step (their order would change the floats).
inline uint64_t KeyOf(uint32_t worker, size_t feature, uint64_t id) {
  return Mix64(worker * 1000003ULL + feature * 10007ULL + id);
}

// Worker `worker`'s batch of `step`: the same for the same arguments.
inline Batch MakeBatch(uint32_t worker, int64_t step, size_t features = kTables.size()) {
  std::mt19937_64 rng(step * 7919 + worker);
  Batch b;
  for (size_t f = 0; f < features; ++f) {
    FeatureBatch fb;
    fb.offsets = {0};
    for (int i = 0; i < kBatch; ++i) {
      const int n = 1 + static_cast<int>(rng() % 2);
      for (int j = 0; j < n; ++j) fb.keys.push_back(KeyOf(worker, f, rng() % kIdsPerFeature));
      fb.offsets.push_back(static_cast<int64_t>(fb.keys.size()));
    }
    b.features.push_back(std::move(fb));
  }
  return b;
}

// A pipeline of one worker at `staleness` over `tables` (one feature each,
// mean and sum in turn), its first step `begin`.
inline absl::StatusOr<std::unique_ptr<StepPipeline>> NewPipeline(
    Client* client, uint32_t worker, int64_t begin, int staleness = 0,
    const std::vector<v1::TableConfig>& tables = kTables) {
  PipelineOptions p;
  p.worker_id = worker;
  p.staleness = staleness;
  p.first_step = begin;
  for (size_t f = 0; f < tables.size(); ++f) {
    p.features.push_back(
        {tables[f].name(), tables[f].name(), f % 2 == 0 ? Combiner::kMean : Combiner::kSum});
  }
  return StepPipeline::Create(client, p);
}

// Steps [begin, end) of `worker` on `pipe` (whose next step is begin), then
// Flush. The gradient of every pooled element is the element minus 0.25,
// or `constant` when given (what counting tables need: tests/server/requests.h).
inline absl::Status TrainOn(StepPipeline& pipe, uint32_t worker, int64_t begin, int64_t end,
                            std::optional<float> constant = std::nullopt) {
  int64_t prefetched = begin;
  for (int64_t t = begin; t < end; ++t) {
    while (prefetched < end && prefetched <= t + pipe.prefetch_depth()) {
      EMBER_RETURN_IF_ERROR(
          pipe.Prefetch(prefetched, MakeBatch(worker, prefetched, pipe.num_features())));
      ++prefetched;
    }
    EMBER_ASSIGN_OR_RETURN(StepView view, pipe.Wait(t));
    std::vector<std::vector<float>> grads;
    for (const auto& pooled : view.pooled) {
      std::vector<float> g(pooled.begin(), pooled.end());
      for (float& x : g) x = constant.has_value() ? *constant : x - 0.25f;
      grads.push_back(std::move(g));
    }
    EMBER_RETURN_IF_ERROR(pipe.Push(t, {grads.begin(), grads.end()}));
  }
  return pipe.Flush();
}

// Steps [begin, end) of one worker (synchronous, s = 0), then Flush.
inline absl::Status Train(Client* client, uint32_t worker, int64_t begin, int64_t end,
                          std::unique_ptr<StepPipeline>* out) {
  EMBER_ASSIGN_OR_RETURN(*out, NewPipeline(client, worker, begin));
  return TrainOn(**out, worker, begin, end);
}

// Both workers in parallel.
inline absl::Status TrainBoth(Client* client, int64_t begin, int64_t end,
                              std::vector<std::unique_ptr<StepPipeline>>* pipes) {
  pipes->resize(2);
  absl::Status status[2];
  std::thread t0([&] { status[0] = Train(client, 0, begin, end, &(*pipes)[0]); });
  status[1] = Train(client, 1, begin, end, &(*pipes)[1]);
  t0.join();
  EMBER_RETURN_IF_ERROR(status[0]);
  return status[1];
}

// Every row any worker can touch, per table of `tables`.
inline std::map<std::string, std::vector<float>> AllRows(
    Client* client, const std::vector<v1::TableConfig>& tables = kTables) {
  std::map<std::string, std::vector<float>> out;
  for (size_t f = 0; f < tables.size(); ++f) {
    std::vector<uint64_t> keys;
    for (uint32_t w : {0u, 1u}) {
      for (uint64_t id = 0; id < kIdsPerFeature; ++id) keys.push_back(KeyOf(w, f, id));
    }
    absl::StatusOr<std::vector<float>> rows = client->LookupRows(tables[f].name(), keys);
    EXPECT_OK(rows);
    if (rows.ok()) out[tables[f].name()] = *rows;
  }
  return out;
}

}  // namespace ember::testing
