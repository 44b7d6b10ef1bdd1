// KeyDeduplicator on the reference workload, the way a trainer step uses it:
// per step, each table's keys (one feature each, 128 examples) deduplicated
// one table at a time, then the 4 pipelines' unique keys merged as the
// StepMerger does. Prints ns per key added, the median over rounds.
//   build/bench/dedup_bench [--steps=256 --rounds=7]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_util.h"
#include "bench/reference_workload.h"
#include "client/dedup.h"

ABSL_FLAG(int, batch, 128, "Examples per step per pipeline.");
ABSL_FLAG(int, pipelines, 4, "Pipelines whose unique keys are merged per step.");
ABSL_FLAG(int, steps, 256, "Steps per round (batches drawn up front).");
ABSL_FLAG(int, rounds, 7, "Rounds; the median is printed.");
ABSL_FLAG(uint64_t, seed, 42, "Seed of the batches.");

namespace ember {
namespace {

int Main() {
  const auto features = bench::ReferenceFeatures();
  const int pipelines = absl::GetFlag(FLAGS_pipelines);
  const int steps = absl::GetFlag(FLAGS_steps);
  const std::vector<std::vector<Batch>> batches = bench::DrawPipelineBatches(
      features, absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_seed), pipelines, steps);
  KeyDeduplicator pipeline_dedup, merge_dedup;
  std::vector<uint32_t> inverse, merge_inverse;
  std::vector<std::vector<std::vector<uint64_t>>> unique(
      pipelines, std::vector<std::vector<uint64_t>>(features.size()));
  std::vector<double> pipeline_ns, merge_ns;
  uint64_t checksum = 0;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    double pipeline_s = 0, merge_s = 0;
    uint64_t pipeline_keys = 0, merge_keys = 0;
    for (int s = 0; s < steps; ++s) {
      auto t0 = std::chrono::steady_clock::now();
      for (int p = 0; p < pipelines; ++p) {
        for (size_t f = 0; f < features.size(); ++f) {
          const auto& keys = batches[p][s].features[f].keys;
          pipeline_dedup.Clear();
          inverse.clear();
          pipeline_dedup.Add(keys, &inverse);
          unique[p][f] = pipeline_dedup.unique();
          pipeline_keys += keys.size();
        }
      }
      auto t1 = std::chrono::steady_clock::now();
      for (size_t f = 0; f < features.size(); ++f) {
        merge_dedup.Clear();
        merge_inverse.clear();
        for (int p = 0; p < pipelines; ++p) {
          merge_dedup.Add(unique[p][f], &merge_inverse);
          merge_keys += unique[p][f].size();
        }
        checksum += merge_dedup.unique().size() + merge_inverse.back();
      }
      auto t2 = std::chrono::steady_clock::now();
      pipeline_s += std::chrono::duration<double>(t1 - t0).count();
      merge_s += std::chrono::duration<double>(t2 - t1).count();
    }
    pipeline_ns.push_back(pipeline_s * 1e9 / pipeline_keys);
    merge_ns.push_back(merge_s * 1e9 / merge_keys);
  }
  std::printf("dedup_bench: %d pipelines x %zu features x batch %d, %d steps, median of %d rounds "
              "(checksum %llu)\n",
              pipelines, features.size(), absl::GetFlag(FLAGS_batch), steps,
              absl::GetFlag(FLAGS_rounds), static_cast<unsigned long long>(checksum));
  std::printf("per pipeline: %.2f ns/key; merging the pipelines' unique keys: %.2f ns/key\n",
              bench::Median(pipeline_ns), bench::Median(merge_ns));
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ember::Main();
}
