// What a synchronous (s = 0) step fetched early would have to patch, on the
// reference workload: for each worker (a trainer node whose --pipelines
// pipelines are merged, so one node step is pipelines x batch examples),
// the share of its step t+1 unique rows that a push of step t changes,
//   own:    rows this worker itself pushed at step t (it knows them when it
//           fetches t+1, and can bring them forward);
//   others: rows only other workers pushed at step t (they must be fetched
//           again after the barrier).
// Rows are (table, key) pairs; no shard is involved (the share is a
// property of the id streams). Worker w draws pipelines w*P .. w*P+P-1,
// each stream seeded seed + pipeline, as ember-trainer does.
//   build/bench/patch_share_bench [--workers=1,2,4 --pipelines=4 --steps=200]
#include <cstdio>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/workload_flags.h"

ABSL_FLAG(std::string, workers, "1,2,4", "Worker counts to measure, comma-separated.");
ABSL_FLAG(int, pipelines, 4, "Pipelines merged per worker (one node step).");
ABSL_FLAG(int, steps, 200, "Steps per worker count.");

namespace ember {
namespace {

using TableSets = std::vector<absl::flat_hash_set<uint64_t>>;  // [table]

// The unique rows of one node step: the union of its pipelines' batches.
TableSets NodeStep(std::vector<bench::BatchGenerator>& gens, size_t tables) {
  TableSets rows(tables);
  for (bench::BatchGenerator& g : gens) {
    const Batch batch = g.Next();
    for (size_t t = 0; t < tables; ++t) {
      rows[t].insert(batch.features[t].keys.begin(), batch.features[t].keys.end());
    }
  }
  return rows;
}

struct Share {
  double unique = 0;  // rows per node step
  double own = 0;     // of which this worker pushed at the step before
  double others = 0;  // of which only other workers pushed at the step before
};

Share Measure(const bench::WorkloadFlags& w, int workers, int pipelines, int steps) {
  const size_t tables = w.Features().size();
  std::vector<std::vector<bench::BatchGenerator>> gens(workers);
  for (int k = 0; k < workers; ++k) {
    for (int p = 0; p < pipelines; ++p) gens[k].push_back(w.Generator(k * pipelines + p));
  }
  std::vector<TableSets> before(workers);
  for (int k = 0; k < workers; ++k) before[k] = NodeStep(gens[k], tables);
  Share sum;
  for (int step = 0; step < steps; ++step) {
    std::vector<TableSets> now(workers);
    for (int k = 0; k < workers; ++k) now[k] = NodeStep(gens[k], tables);
    for (int k = 0; k < workers; ++k) {
      for (size_t t = 0; t < tables; ++t) {
        for (uint64_t key : now[k][t]) {
          sum.unique += 1;
          if (before[k][t].contains(key)) {
            sum.own += 1;
            continue;
          }
          for (int o = 0; o < workers; ++o) {
            if (o != k && before[o][t].contains(key)) {
              sum.others += 1;
              break;
            }
          }
        }
      }
    }
    before = std::move(now);
  }
  const double node_steps = static_cast<double>(steps) * workers;
  return {sum.unique / node_steps, sum.own / node_steps, sum.others / node_steps};
}

int Main() {
  const bench::WorkloadFlags w = bench::ReadWorkloadFlags();
  const int pipelines = absl::GetFlag(FLAGS_pipelines);
  const int steps = absl::GetFlag(FLAGS_steps);
  std::printf("# %s; here every step draws a new batch; %d pipelines merged per worker, %d "
              "steps\n", w.Describe().c_str(), pipelines, steps);
  std::printf("| workers | unique rows per node step | own pushed at t-1 | others' only | patched in all |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_workers), ',')) {
    int workers = 0;
    if (!absl::SimpleAtoi(item, &workers) || workers < 1) {
      std::fprintf(stderr, "--workers: expected positive integers, received '%s'\n",
                   std::string(item).c_str());
      return 2;
    }
    const Share s = Measure(w, workers, pipelines, steps);
    std::printf("| %d | %.0f | %.1f%% (%.0f) | %.1f%% (%.0f) | %.1f%% |\n", workers, s.unique,
                100 * s.own / s.unique, s.own, 100 * s.others / s.unique, s.others,
                100 * (s.own + s.others) / s.unique);
  }
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ember::Main();
}
