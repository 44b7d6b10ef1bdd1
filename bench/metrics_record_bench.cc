// What recording one RPC's metrics costs a shard, in ns: the two clock reads
// and RecordCall of EmbeddingServiceImpl::Measured, plus the four per-table
// counters a one-table Lookup adds (Shard::Lookup). Run on 1 and 2 threads
// (contended atomics). Divide by the shard CPU per RPC that
// bench/metrics_overhead.sh prints for the share of a shard's CPU. CPU
// time, not wall time, so a busy machine inflates it less.
#include <time.h>

#include <cstdio>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "common/metrics.h"
#include "shard/shard_metrics.h"

ABSL_FLAG(int, calls, 5'000'000, "RPCs recorded per thread.");

namespace {

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// ns of CPU per recorded RPC, averaged over `threads` threads.
double NsPerCall(ember::ShardMetrics& m, int threads, int calls) {
  std::vector<double> cpu(threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      ember::ShardMetrics::TableSeries* table = m.Table("clicks");
      const double start = ThreadCpuSeconds();
      for (int i = 0; i < calls; ++i) {
        const absl::Time begin = absl::Now();
        table->lookup_requests->Add();
        table->lookup_keys->Add(4096);
        table->lookup_bytes->Add(4096 * 32);
        table->lookup_missing->Add(12);
        m.RecordCall(ember::ShardMetrics::Rpc::kLookup, absl::StatusCode::kOk,
                     absl::ToDoubleSeconds(absl::Now() - begin));
      }
      cpu[t] = ThreadCpuSeconds() - start;
    });
  }
  for (auto& t : ts) t.join();
  double sum = 0;
  for (double c : cpu) sum += c;
  return 1e9 * sum / (static_cast<double>(threads) * calls);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ember::metrics::Registry registry;
  ember::ShardMetrics metrics(&registry);
  const int calls = absl::GetFlag(FLAGS_calls);
  std::printf("| threads | CPU ns per recorded RPC |\n| --- | --- |\n");
  for (int threads : {1, 2}) {
    std::printf("| %d | %.1f |\n", threads, NsPerCall(metrics, threads, calls));
  }
  return 0;
}
