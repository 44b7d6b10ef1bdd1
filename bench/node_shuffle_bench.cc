// What the node shuffle saves on the reference workload: G ranks (GPUs of
// one node), each with its own batch of the 17 Zipf features. Without the
// exchange every rank fetches and pushes its own unique keys; with it each
// unique key of the node is fetched and pushed once, by its owner. Prints,
// per G, the keys fetched per step both ways and their ratio, the bytes the
// ranks trade, and the exchange's time per step on the in-process transport
// (threads; no network, no GPU). Runs anywhere.
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_util.h"
#include "bench/reference_workload.h"
#include "client/dedup.h"
#include "ember/node_shuffle.h"

ABSL_FLAG(std::string, ranks, "2,4,8", "Ranks (GPUs per node) to measure.");
ABSL_FLAG(int, batch, 128, "Examples per step per rank.");
ABSL_FLAG(int, dim, 8, "Row width of every table.");
ABSL_FLAG(int, steps, 50, "Steps per configuration.");
ABSL_FLAG(uint64_t, seed, 42, "Seed of rank 0's batches (rank r: seed + r).");

namespace ember {
namespace {

int Main() {
  const auto features = bench::ReferenceFeatures();
  const size_t tables = features.size();
  const int steps = absl::GetFlag(FLAGS_steps);
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  std::printf("reference workload, batch %d per rank, dim %u, %d steps, seed %llu, %u cores\n",
              absl::GetFlag(FLAGS_batch), dim, steps,
              static_cast<unsigned long long>(absl::GetFlag(FLAGS_seed)),
              std::thread::hardware_concurrency());
  std::printf("| ranks | keys fetched/step without exchange | with exchange | ratio | "
              "KB traded/step/rank | exchange ms/step (median) |\n|---|---|---|---|---|---|\n");
  for (double g : bench::ParseList(absl::GetFlag(FLAGS_ranks))) {
    const uint32_t ranks = static_cast<uint32_t>(g);
    auto transports = NewInProcessTransports(ranks);
    std::vector<uint64_t> without(ranks, 0), with(ranks, 0), traded(ranks, 0);
    std::vector<std::vector<double>> ms(ranks);
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        bench::BatchGenerator gen(features, absl::GetFlag(FLAGS_batch),
                                  absl::GetFlag(FLAGS_seed) + r);
        NodeShuffle ex(transports[r].get(), std::vector<uint32_t>(tables, dim));
        for (int s = 0; s < steps; ++s) {
          const Batch b = gen.Next();
          std::vector<std::vector<uint64_t>> unique(tables);
          std::vector<uint32_t> inverse;
          for (size_t t = 0; t < tables; ++t) {
            KeyDeduplicator d;
            d.Add(b.features[t].keys, &inverse);
            unique[t] = d.unique();
            without[r] += unique[t].size();
          }
          const auto start = std::chrono::steady_clock::now();
          auto owned = ex.RouteKeys(unique);
          if (!owned.ok()) std::abort();
          std::vector<std::vector<float>> rows(tables), grads(tables);
          std::vector<absl::Span<const float>> row_views, grad_views;
          for (size_t t = 0; t < tables; ++t) {
            with[r] += (*owned)[t].size();
            rows[t].assign((*owned)[t].size() * dim, 1.0f);
            grads[t].assign(unique[t].size() * dim, 1.0f);
            row_views.emplace_back(rows[t]);
            grad_views.emplace_back(grads[t]);
          }
          if (!ex.ShareRows(row_views).ok() || !ex.ReduceGradients(grad_views).ok()) std::abort();
          ms[r].push_back(std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - start).count());
        }
        traded[r] = ex.bytes_sent() + ex.bytes_received();
      });
    }
    for (auto& t : threads) t.join();
    uint64_t total_without = 0, total_with = 0, total_traded = 0;
    std::vector<double> all_ms;
    for (uint32_t r = 0; r < ranks; ++r) {
      total_without += without[r];
      total_with += with[r];
      total_traded += traded[r];
      all_ms.insert(all_ms.end(), ms[r].begin(), ms[r].end());
    }
    std::printf("| %u | %.0f | %.0f | %.2fx | %.1f | %.3f |\n", ranks,
                static_cast<double>(total_without) / steps, static_cast<double>(total_with) / steps,
                static_cast<double>(total_without) / total_with,
                total_traded / 1024.0 / steps / ranks, bench::Median(all_ms));
  }
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ember::Main();
}
