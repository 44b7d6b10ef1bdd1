// The host's pooling passes on the reference workload, the way a merged
// trainer step runs them: per pipeline and feature, PoolForward over a dense
// block of the step's unique rows, PoolForwardAt over rows scattered in a
// larger buffer (as in gRPC's receive slices), PoolBackwardInto, and the
// merger's ScatterAddRows of the pipelines' gradients into per-key sums.
// Prints ns per id (pooling) and per row (scatter), the median over rounds,
// at each dim side by side.
//   build/bench/pooling_bench [--dims=8,32,128,256 --steps=64 --rounds=5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_util.h"
#include "bench/reference_workload.h"
#include "client/dedup.h"
#include "client/pooling.h"
#include "common/vector_dispatch.h"

ABSL_FLAG(std::string, dims, "8,32,128,256", "Row widths, side by side.");
ABSL_FLAG(int, batch, 128, "Examples per step per pipeline.");
ABSL_FLAG(int, pipelines, 4, "Pipelines per merged step.");
ABSL_FLAG(int, steps, 64, "Steps per round (batches drawn up front).");
ABSL_FLAG(int, rounds, 5, "Rounds; the median is printed.");
ABSL_FLAG(uint64_t, seed, 42, "Seed of the batches.");

namespace ember {
namespace {

// One pipeline's feature in one step: its ids numbered by unique row.
struct FeatureStep {
  const FeatureBatch* batch;
  std::vector<uint32_t> inverse;
  size_t unique = 0;
  std::vector<uint32_t> to_merged;  // each unique row's index among the pipelines' merged keys
};

struct Times {
  std::vector<double> forward, forward_at, backward, scatter;
};

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int Main() {
  const auto features = bench::ReferenceFeatures();
  const int pipelines = absl::GetFlag(FLAGS_pipelines);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int batch = absl::GetFlag(FLAGS_batch);
  const std::vector<std::vector<Batch>> batches =
      bench::DrawPipelineBatches(features, batch, absl::GetFlag(FLAGS_seed), pipelines, steps);
  // [step][pipeline][feature], and per [step][feature] the merged key count.
  std::vector<std::vector<std::vector<FeatureStep>>> fs(steps);
  std::vector<std::vector<size_t>> merged(steps, std::vector<size_t>(features.size()));
  size_t ids = 0, rank_rows = 0, max_unique = 0, max_merged = 0;
  KeyDeduplicator dedup, merge;
  for (int s = 0; s < steps; ++s) {
    fs[s].assign(pipelines, std::vector<FeatureStep>(features.size()));
    for (size_t f = 0; f < features.size(); ++f) {
      merge.Clear();
      for (int p = 0; p < pipelines; ++p) {
        FeatureStep& x = fs[s][p][f];
        x.batch = &batches[p][s].features[f];
        dedup.Clear();
        dedup.Add(x.batch->keys, &x.inverse);
        x.unique = dedup.unique().size();
        merge.Add(dedup.unique(), &x.to_merged);
        ids += x.inverse.size();
        rank_rows += x.unique;
        max_unique = std::max(max_unique, x.unique);
      }
      merged[s][f] = merge.unique().size();
      max_merged = std::max(max_merged, merged[s][f]);
    }
  }
  std::printf("pooling_bench: %d pipelines x %zu features x batch %d, %d steps (%.0f ids and "
              "%.0f unique rows per pipeline-step), %s clone, median of %d rounds\n",
              pipelines, features.size(), batch, steps, double(ids) / (steps * pipelines),
              double(rank_rows) / (steps * pipelines), VectorIsa(), absl::GetFlag(FLAGS_rounds));
  std::printf("| dim | forward ns/id | forward by address ns/id | backward ns/id | merger scatter-add "
              "ns/row |\n| --- | --- | --- | --- | --- |\n");

  std::mt19937_64 rng(7);
  for (double d : bench::ParseList(absl::GetFlag(FLAGS_dims))) {
    const uint32_t dim = static_cast<uint32_t>(d);
    const size_t row_bytes = size_t{dim} * sizeof(float);
    // Dense unique rows; and the same rows scattered, 4 bytes off alignment,
    // over a buffer 4 times their size (answers' slices hold every rank's rows).
    std::vector<float> rows(max_unique * dim);
    std::uniform_real_distribution<float> value(-1, 1);
    for (float& v : rows) v = value(rng);
    std::vector<char> scattered(4 * max_merged * row_bytes + 64);
    std::vector<const char*> rows_at(max_unique);
    std::vector<size_t> slot(4 * max_merged);
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), rng);
    for (size_t u = 0; u < max_unique; ++u) {
      char* at = scattered.data() + 4 + slot[u] * row_bytes;
      memcpy(at, rows.data() + u * dim, row_bytes);
      rows_at[u] = at;
    }
    std::vector<float> pooled(size_t(batch) * dim), d_rows(max_unique * dim);
    for (float& v : pooled) v = value(rng) * 0.01f;
    std::vector<float> sums(max_merged * dim);
    std::vector<float*> sum_at(max_merged);
    for (size_t u = 0; u < max_merged; ++u) sum_at[u] = sums.data() + u * dim;
    std::vector<uint8_t> fresh(max_merged);
    std::vector<std::vector<float>> grads(pipelines, std::vector<float>(max_unique * dim));
    for (auto& g : grads) for (float& v : g) v = value(rng);

    // Each pass timed over the whole round, so the clock is read rarely.
    auto for_each = [&](auto&& pass) {
      for (int s = 0; s < steps; ++s) {
        for (size_t f = 0; f < features.size(); ++f) pass(s, f);
      }
    };
    Times t;
    double checksum = 0;
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      auto t0 = std::chrono::steady_clock::now();
      for_each([&](int s, size_t f) {
        for (int p = 0; p < pipelines; ++p) {
          const FeatureStep& x = fs[s][p][f];
          PoolForward(x.batch->offsets, x.inverse, x.batch->weights, Combiner::kSum, rows.data(),
                      dim, pooled.data());
        }
      });
      auto t1 = std::chrono::steady_clock::now();
      for_each([&](int s, size_t f) {
        for (int p = 0; p < pipelines; ++p) {
          const FeatureStep& x = fs[s][p][f];
          PoolForwardAt(x.batch->offsets, x.inverse, x.batch->weights, Combiner::kSum,
                        rows_at.data(), dim, pooled.data());
        }
      });
      auto t2 = std::chrono::steady_clock::now();
      for_each([&](int s, size_t f) {
        for (int p = 0; p < pipelines; ++p) {
          const FeatureStep& x = fs[s][p][f];
          uint32_t written = 0;
          PoolBackwardInto(x.batch->offsets, x.inverse, x.batch->weights, Combiner::kSum,
                           pooled.data(), dim, d_rows.data(), &written);
        }
        checksum += d_rows[0];
      });
      auto t3 = std::chrono::steady_clock::now();
      for_each([&](int s, size_t f) {
        std::fill(fresh.begin(), fresh.begin() + merged[s][f], 1);
        for (int p = 0; p < pipelines; ++p) {
          ScatterAddRows(fs[s][p][f].to_merged, grads[p].data(), dim, sum_at.data(),
                         fresh.data());
        }
        checksum += sums[0];
      });
      auto t4 = std::chrono::steady_clock::now();
      checksum += pooled[0];
      t.forward.push_back(Seconds(t0, t1) * 1e9 / ids);
      t.forward_at.push_back(Seconds(t1, t2) * 1e9 / ids);
      t.backward.push_back(Seconds(t2, t3) * 1e9 / ids);
      t.scatter.push_back(Seconds(t3, t4) * 1e9 / rank_rows);
    }
    std::printf("| %u | %.2f | %.2f | %.2f | %.2f |\n", dim, bench::Median(t.forward),
                bench::Median(t.forward_at), bench::Median(t.backward), bench::Median(t.scatter));
    if (checksum == 12345.678) std::printf("(checksum)\n");  // keeps the passes' results live
  }
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ember::Main();
}
