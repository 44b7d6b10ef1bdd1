// ember-trainer: the reference trainer of WORKLOAD.md (item 3) against a
// running cluster. Several step pipelines (one per simulated GPU) in one
// process, each on its own thread, run prefetch / wait / compute / push on
// the 17-feature workload for a fixed time per configuration:
//   for every simulated compute time: no embeddings at all (the baseline),
//   Ember with prefetch off (prefetch(t) then wait(t)), Ember with prefetch on
//   (prefetch(t + depth) before computing t), and at staleness 0 also Ember
//   with early fetch (step t + 1's rows fetched while t computes, brought
//   forward through push t on the trainer; prefetch on is then plain s = 0).
// Prints steps/s, step time, the exposed embedding wait per step, the
// efficiency = baseline step time / step time, and the CPU per pipeline-step
// of the trainer, of the shards (from GetShardInfo) and of both. SIGTERM or
// SIGINT ends the running configuration at a step boundary, skips the rest
// and prints what was measured (exit 0).
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <limits>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/batch_source.h"
#include "bench/bench_util.h"
#include "bench/reference_workload.h"
#include "bench/workload_flags.h"
#include "common/abseil_mode.h"
#include "common/process_cpu.h"
#include "common/tls_flags.h"
#include "ember/client.h"
#include "ember/step_merger.h"
#include "ember/step_pipeline.h"
#include "ember/trainer_metrics.h"

ABSL_FLAG(std::string, shards, "127.0.0.1:50051",
          "Comma-separated shard addresses, in shard order; inproc:N: N shards in this process.");
ABSL_FLAG(std::string, inproc_device, "cpu",
          "With --shards=inproc:N: where the shards' tables live: cpu, cuda:N, or a "
          "comma-separated list, shard i on entry i mod its length (cuda:0,cuda:1: one per GPU).");
ABSL_FLAG(uint32_t, inproc_threads, ember::InProcessOptions().threads,
          "With --shards=inproc:N: T > 0 runs an exchange's shards at once on a pool keeping T "
          "threads; 0 runs each call's shards on the calling thread, one after another.");
ABSL_FLAG(std::string, pipelines, "4",
          "Step pipelines (simulated GPUs), one thread each; a comma-separated list runs each.");
ABSL_FLAG(int, dim, 8, "Embedding dimension of every table.");
ABSL_FLAG(std::string, compute_ms, "0,1,5", "Simulated compute per step, in ms, comma-separated.");
ABSL_FLAG(std::string, compute_mode, "sleep",
          "sleep: the host is free while the GPU computes; busy: CPU training (spins).");
ABSL_FLAG(double, seconds, 4, "Measured time per configuration.");
ABSL_FLAG(double, warmup_seconds, 2, "Untimed training first, so that tables hold the hot keys.");
ABSL_FLAG(std::string, trace, "",
          "If set, write the pipelines' timeline (Chrome trace JSON, for Perfetto or "
          "chrome://tracing) of the runs with embeddings to this file.");
ABSL_FLAG(int, metrics_port, -1,
          "Serve the trainer's Prometheus metrics (ember_trainer_*) on GET /metrics at this "
          "port; 0: a free one (printed); -1: off.");
ABSL_FLAG(int, staleness, 1, "SSP staleness s (prefetch depth follows it); -1: asynchronous.");
ABSL_FLAG(int, prefetch_depth, -1,
          "PipelineOptions::prefetch_depth of \"prefetch on\" and \"early fetch\" (-1: the "
          "pipeline's default).");
ABSL_FLAG(bool, early_fetch, true,
          "At staleness 0, also run Ember with early fetch (PipelineOptions::early_fetch); "
          "\"prefetch on\" is then plain s = 0.");
ABSL_FLAG(bool, merge_pipelines, true,
          "The pipelines share a StepMerger: one request per shard per node step for all of them "
          "(false: each pipeline sends its own).");
ABSL_FLAG(int, merger_copy_rows_below_bytes, -1,
          "StepMergerOptions::copy_rows_below_bytes: rows narrower than this are copied per "
          "pipeline before pooling, wider ones pooled where they arrived (-1: the default).");
ABSL_FLAG(bool, exchange_streams, ember::ClientOptions().exchange_streams,
          "Step exchanges travel on one long-lived ExchangeStream per shard (false: a unary "
          "Exchange call per step and shard).");
ABSL_FLAG(std::string, auth_token, "",
          "Bearer token for shards started with --auth_tokens_file (an admin token: the "
          "trainer creates its tables).");
ABSL_FLAG(uint32_t, worker_id_base, 0,
          "Added to every SSP worker id, so that several trainer processes can share a "
          "cluster (give each its own --seed too).");
ABSL_FLAG(std::string, modes, "no_embeddings,off,on,early",
          "Which rows to run, comma-separated: no_embeddings (and its lockstep row), off "
          "(prefetch off), on (prefetch on), early (early fetch, at staleness 0), early_refetch "
          "(early fetch with the rows the node's own push changes fetched after the push instead "
          "of brought forward on the trainer: PipelineOptions::early_fetch_patch = false).");
ABSL_FLAG(int, batches, 256,
          "Distinct batches per pipeline, drawn up front and cycled (unless --fresh_ids).");

namespace ember::bench {
namespace {

using Clock = std::chrono::steady_clock;

// SIGTERM or SIGINT (a container being stopped, ^C): every run ends at its
// next step boundary as if its time were up, the configurations not yet run
// are skipped, and what was measured is printed before a clean exit.
std::atomic<bool> stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

void RequestStop(int) { stop_requested.store(true); }

// Whether a run that started at `start` should end: its time is up, or a
// stop was requested.
bool TimeUp(Clock::time_point start, double seconds) {
  return stop_requested.load() ||
         std::chrono::duration<double>(Clock::now() - start).count() >= seconds;
}

void Compute(double ms, bool busy) {
  if (ms <= 0) return;
  if (!busy) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
    return;
  }
  const auto end = Clock::now() + std::chrono::duration<double, std::milli>(ms);
  while (Clock::now() < end) {
  }
}

struct RunResult {
  double seconds = 0;        // mean over pipelines of their measured time
  int64_t steps = 0;         // over all pipelines
  std::vector<double> wait_ms;  // one per step
  uint64_t keys = 0, unique_keys = 0, bytes = 0, rpcs = 0;
  // Early fetch (PipelineStats): summed over pipelines; with a merger each
  // pipeline counts the node's merged rows.
  uint64_t steps_patched = 0, rows_patched = 0, patch_bytes = 0, steps_refetched = 0;
  uint64_t rows_refetched = 0, keys_refetched = 0;  // of the refetched steps
  uint64_t merged_keys = 0;  // with a StepMerger: keys fetched after merging the pipelines'
  int64_t merged_steps = 0;  // and the node steps that fetched
  // Of this trainer process, all threads, less making batches and the
  // stand-in model's backward: the input pipeline and the model are not
  // Ember's cost (on a GPU trainer neither runs on these cores).
  double cpu_seconds = 0;
  double model_cpu_seconds = 0;   // the stand-in backward's, left out of cpu_seconds
  // Taking each batch from its source, left out too: a cycled batch is
  // copied there (2% of the trainer's samples at dim 8), where a real input
  // pipeline hands over a batch it made.
  double input_cpu_seconds = 0;
  double shard_cpu_seconds = -1;  // of every shard process; -1: unknown
  absl::Status status;

  double StepsPerSecond() const { return seconds > 0 ? steps / seconds : 0; }
  // Mean time of one pipeline's step.
  double StepMs(int pipelines) const { return steps ? 1000.0 * seconds * pipelines / steps : 0; }
  double CpuMsPerStep(double cpu) const { return steps ? 1000.0 * cpu / steps : 0; }
  double WaitMs(double quantile) const { return Quantile(wait_ms, quantile); }
  double MeanWaitMs() const {
    double s = 0;
    for (double w : wait_ms) s += w;
    return wait_ms.empty() ? 0 : s / wait_ms.size();
  }
};

struct Config {
  int pipelines;
  double compute_ms;
  bool busy;
  double seconds;
};

// No embeddings: each pipeline's thread computes, step after step. In
// `lockstep` the threads also meet at a barrier after every step, as the
// ranks of a synchronous (s = 0) node must: the floor of any s = 0 step
// here, whatever the embeddings cost.
RunResult RunBaseline(const Config& c, bool lockstep = false) {
  RunResult r;
  std::vector<std::thread> threads;
  std::atomic<int64_t> steps{0};
  const auto start = Clock::now();
  bool stop = false;  // written by the barrier's completion only
  std::barrier meet(c.pipelines, [&]() noexcept { stop = TimeUp(start, c.seconds); });
  for (int p = 0; p < c.pipelines; ++p) {
    threads.emplace_back([&] {
      int64_t n = 0;
      for (;;) {
        if (lockstep) {
          meet.arrive_and_wait();
          if (stop) break;
        } else if (TimeUp(start, c.seconds)) {
          break;
        }
        Compute(c.compute_ms, c.busy);
        ++n;
      }
      steps += n;
    });
  }
  for (auto& t : threads) t.join();
  r.steps = steps;
  r.seconds = c.seconds;
  return r;
}

// The timeline of every run, when --trace asks for one (bounded: 1M spans).
TraceRecorder* Timeline() {
  static TraceRecorder* trace =
      absl::GetFlag(FLAGS_trace).empty() ? nullptr : new TraceRecorder();
  return trace;
}

// The trainer's metrics, when --metrics_port asks for them.
TrainerMetrics* Metrics() {
  static TrainerMetrics* metrics =
      absl::GetFlag(FLAGS_metrics_port) < 0 ? nullptr : new TrainerMetrics();
  return metrics;
}

// CPU seconds of every shard so far (GetShardInfo), or -1 if a shard does not say.
double ShardCpuSeconds(Client* client) {
  absl::StatusOr<std::vector<v1::GetShardInfoResponse>> infos = client->ShardInfos();
  if (!infos.ok()) return -1;
  double cpu = 0;
  for (const v1::GetShardInfoResponse& info : *infos) {
    if (info.process_cpu_seconds() <= 0) return -1;  // an older shard
    cpu += info.process_cpu_seconds();
  }
  return cpu;
}

// Pipeline p's batches for one run: its ring, or a fresh stream (run `run`).
std::unique_ptr<BatchSource> Batches(const WorkloadFlags& w, const std::vector<std::vector<Batch>>& rings,
                                     int p, int run) {
  if (w.fresh_ids) return std::make_unique<BatchSource>(w.Generator(p, run + 1), /*ahead=*/8);
  return std::make_unique<BatchSource>(rings[p]);
}

// How an Ember run fetches: after Prefetch(t) only (off), ahead (on), or
// ahead with the early fetch at s = 0, its own rows patched on the trainer
// or fetched after the push.
enum class Fetch { kOff, kOn, kEarly, kEarlyRefetch };

const char* FetchName(Fetch f) {
  switch (f) {
    case Fetch::kOff:
      return "prefetch off";
    case Fetch::kOn:
      return "prefetch on";
    case Fetch::kEarly:
      return "early fetch";
    case Fetch::kEarlyRefetch:
      return "early, refetched";
  }
  return "";
}

bool IsEarly(Fetch f) { return f == Fetch::kEarly || f == Fetch::kEarlyRefetch; }

RunResult RunEmber(Client* client, const Config& c, Fetch fetch, uint32_t worker_base,
                   const std::vector<FeatureSpec>& specs, const WorkloadFlags& workload,
                   const std::vector<std::vector<Batch>>& rings) {
  RunResult r;
  std::vector<std::unique_ptr<BatchSource>> sources;
  for (int p = 0; p < c.pipelines; ++p) {
    sources.push_back(Batches(workload, rings, p, static_cast<int>(worker_base / 100)));
  }
  std::mutex mu;
  std::unique_ptr<StepMerger> merger;
  if (absl::GetFlag(FLAGS_merge_pipelines)) {
    StepMergerOptions mo;
    mo.ranks = c.pipelines;
    mo.worker_id = worker_base + 99;  // the node's SSP worker
    mo.staleness = absl::GetFlag(FLAGS_staleness);
    mo.early_fetch = IsEarly(fetch);
    mo.early_fetch_patch = fetch == Fetch::kEarly;
    if (const int below = absl::GetFlag(FLAGS_merger_copy_rows_below_bytes); below >= 0) {
      mo.copy_rows_below_bytes = static_cast<size_t>(below);
    }
    absl::StatusOr<std::unique_ptr<StepMerger>> m = StepMerger::Create(client, mo);
    if (!m.ok()) {
      r.status = m.status();
      return r;
    }
    merger = std::move(*m);
  }
  std::vector<std::unique_ptr<StepPipeline>> pipes;
  for (int p = 0; p < c.pipelines; ++p) {
    PipelineOptions o;
    o.worker_id = worker_base + p;
    o.features = specs;
    o.staleness = absl::GetFlag(FLAGS_staleness);
    o.early_fetch = IsEarly(fetch);
    o.early_fetch_patch = fetch == Fetch::kEarly;
    o.prefetch_depth = absl::GetFlag(FLAGS_prefetch_depth);
    o.merger = merger.get();
    o.merger_rank = p;
    o.trace = Timeline();
    o.metrics = Metrics();
    absl::StatusOr<std::unique_ptr<StepPipeline>> pipe = StepPipeline::Create(client, o);
    if (!pipe.ok()) {
      r.status = pipe.status();
      return r;
    }
    pipes.push_back(std::move(*pipe));
  }
  std::vector<std::thread> threads;
  double seconds_sum = 0;
  // Every pipeline runs steps [0, stop_step); see the loop.
  constexpr int64_t kNoStopStep = std::numeric_limits<int64_t>::max();
  constexpr int64_t kStopMargin = 8;  // merged ranks are at most depth + 1 steps apart
  std::atomic<int64_t> stop_step{kNoStopStep};
  const uint64_t rpcs_before = client->Stats().rpcs;
  const double shard_cpu_before = ShardCpuSeconds(client);
  const double cpu_before = ProcessCpuSeconds();
  for (int p = 0; p < c.pipelines; ++p) {
    threads.emplace_back([&, p] {
      StepPipeline& pipe = *pipes[p];
      BatchSource& source = *sources[p];
      const int depth = fetch != Fetch::kOff ? pipe.prefetch_depth() : 0;
      std::vector<double> waits;
      absl::Status status;
      int64_t next = 0, t = 0;
      double model_cpu = 0;  // the stand-in backward's, this thread
      double input_cpu = 0;  // taking batches from the source, this thread
      const auto start = Clock::now();
      for (; t < stop_step.load(); ++t) {
        if (TimeUp(start, c.seconds)) {
          // Time is up: the first pipeline to see it sets the last step for
          // all (merged pipelines must make the same calls), a few steps
          // ahead of any of them.
          int64_t unset = kNoStopStep;
          stop_step.compare_exchange_strong(unset, t + kStopMargin);
          if (t >= stop_step.load()) break;
        }
        for (; next <= t + depth && next < stop_step.load() && status.ok(); ++next) {
          const double input_cpu_start = ThreadCpuSeconds();
          Batch batch = source.Next();
          input_cpu += ThreadCpuSeconds() - input_cpu_start;
          status = pipe.Prefetch(next, std::move(batch));
        }
        if (!status.ok()) break;
        const auto w0 = Clock::now();
        absl::StatusOr<StepView> view = pipe.Wait(t);
        waits.push_back(std::chrono::duration<double, std::milli>(Clock::now() - w0).count());
        if (!view.ok()) {
          status = view.status();
          break;
        }
        Compute(c.compute_ms, c.busy);
        const double model_cpu_start = ThreadCpuSeconds();
        // A stand-in backward pass, written in place over the rows, which
        // Push then takes without a copy.
        for (absl::Span<float> pooled : view->pooled) {
          for (float& x : pooled) x *= 0.01f;
        }
        model_cpu += ThreadCpuSeconds() - model_cpu_start;
        status = pipe.Push(t, view->pooled);
        if (!status.ok()) break;
      }
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      if (status.ok()) status = pipe.Close();
      const PipelineStats st = pipe.Stats();
      std::lock_guard<std::mutex> lock(mu);
      if (!status.ok() && r.status.ok()) r.status = status;
      r.steps += t;
      r.model_cpu_seconds += model_cpu;
      r.input_cpu_seconds += input_cpu;
      seconds_sum += elapsed;
      r.wait_ms.insert(r.wait_ms.end(), waits.begin(), waits.end());
      r.keys += st.keys;
      r.unique_keys += st.unique_keys;
      r.bytes += st.bytes_sent + st.bytes_received;
      r.steps_patched += st.steps_patched;
      r.rows_patched += st.rows_patched;
      r.patch_bytes += st.patch_bytes;
      r.steps_refetched += st.steps_refetched;
      r.rows_refetched += st.rows_refetched;
      r.keys_refetched += st.keys_refetched;
    });
  }
  for (auto& t : threads) t.join();
  r.seconds = seconds_sum / c.pipelines;
  r.rpcs = client->Stats().rpcs - rpcs_before;
  r.cpu_seconds = ProcessCpuSeconds() - cpu_before;
  if (merger) {
    const StepMergerStats ms = merger->Stats();
    r.merged_keys = ms.merged_keys;
    r.merged_steps = ms.fetch_rounds;
  }
  for (const auto& source : sources) r.cpu_seconds -= source->DrawCpuSeconds();
  r.cpu_seconds -= r.model_cpu_seconds + r.input_cpu_seconds;
  const double shard_cpu_after = ShardCpuSeconds(client);
  if (client->in_process()) {
    r.shard_cpu_seconds = 0;  // the shards' work is in the trainer's CPU
  } else if (shard_cpu_before >= 0 && shard_cpu_after >= 0) {
    r.shard_cpu_seconds = shard_cpu_after - shard_cpu_before;
  }
  return r;
}

int Run() {
  ClientOptions options;
  options.shards = absl::StrSplit(absl::GetFlag(FLAGS_shards), ',');
  options.in_process.threads = absl::GetFlag(FLAGS_inproc_threads);
  options.in_process.device = absl::GetFlag(FLAGS_inproc_device);
  options.metrics = Metrics();
  options.exchange_streams = absl::GetFlag(FLAGS_exchange_streams);
  options.tls = ClientTlsFromFlags();  // --tls, --tls_ca, ... (common/tls_flags.h)
  options.auth_token = absl::GetFlag(FLAGS_auth_token);
  std::unique_ptr<MetricsHttpServer> metrics_http;
  if (TrainerMetrics* metrics = Metrics()) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
        metrics->Serve("0.0.0.0", absl::GetFlag(FLAGS_metrics_port));
    if (!http.ok()) {
      std::fprintf(stderr, "ember-trainer: --metrics_port: %s\n", http.status().ToString().c_str());
      return 1;
    }
    metrics_http = std::move(*http);
    std::printf("metrics: http://127.0.0.1:%d/metrics\n", metrics_http->port());
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  const WorkloadFlags workload = ReadWorkloadFlags();
  const auto features = workload.Features();
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  if (absl::Status s = CreateReferenceTables(**client, features, dim); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  const std::vector<FeatureSpec> specs = ReferenceFeatureSpecs(features);
  std::vector<int> pipeline_counts;
  for (double n : ParseList(absl::GetFlag(FLAGS_pipelines))) {
    if (n < 1) return 1;
    pipeline_counts.push_back(static_cast<int>(n));
  }
  if (pipeline_counts.empty()) return 1;
  const int max_pipelines = *std::max_element(pipeline_counts.begin(), pipeline_counts.end());
  std::vector<std::vector<Batch>> batches(max_pipelines);
  for (int p = 0; p < max_pipelines && !workload.fresh_ids; ++p) {
    BatchGenerator gen = workload.Generator(p);
    for (int i = 0; i < absl::GetFlag(FLAGS_batches); ++i) batches[p].push_back(gen.Next());
  }
  const bool busy = absl::GetFlag(FLAGS_compute_mode) == "busy";
  const std::vector<double> computes = ParseList(absl::GetFlag(FLAGS_compute_ms));
  std::printf(
      "ember-trainer: %u shards%s, pipelines %s%s, %s, %s, dim %u, staleness %d, "
      "compute %s, %.0f s per run, %u cores\n",
      (*client)->shard_count(),
      (*client)->in_process() ? " in this process (their CPU is the trainer's)" : "",
      absl::GetFlag(FLAGS_pipelines).c_str(),
      absl::GetFlag(FLAGS_merge_pipelines) ? " (merged: one request per shard per step)"
                                           : " (each sends its own requests)",
      options.exchange_streams ? "exchange streams" : "unary exchanges",
      workload.Describe().c_str(), dim, absl::GetFlag(FLAGS_staleness),
      busy ? "busy-wait" : "sleep", absl::GetFlag(FLAGS_seconds),
      std::thread::hardware_concurrency());
  std::fflush(stdout);

  uint32_t worker_base = absl::GetFlag(FLAGS_worker_id_base);
  const std::vector<std::string> modes = absl::StrSplit(absl::GetFlag(FLAGS_modes), ',');
  auto mode = [&](absl::string_view m) {
    return std::find(modes.begin(), modes.end(), m) != modes.end();
  };
  if (absl::GetFlag(FLAGS_warmup_seconds) > 0) {
    Config warm{max_pipelines, 0, false, absl::GetFlag(FLAGS_warmup_seconds)};
    RunResult w =
        RunEmber(client->get(), warm, Fetch::kOn, worker_base, specs, workload, batches);
    worker_base += 100;
    if (!w.status.ok()) {
      std::fprintf(stderr, "warm-up: %s\n", w.status.ToString().c_str());
      return 1;
    }
    std::printf("warm-up: %lld steps in %.1f s\n", static_cast<long long>(w.steps), w.seconds);
  }

  struct Row {
    int pipelines;
    double compute;
    const char* mode;
    RunResult r;
    double baseline_ms;
  };
  std::vector<Row> rows;
  std::vector<Fetch> fetches;
  if (mode("off")) fetches.push_back(Fetch::kOff);
  if (mode("on")) fetches.push_back(Fetch::kOn);
  if (absl::GetFlag(FLAGS_staleness) == 0 && absl::GetFlag(FLAGS_early_fetch)) {
    if (mode("early")) fetches.push_back(Fetch::kEarly);
    if (mode("early_refetch")) fetches.push_back(Fetch::kEarlyRefetch);
  }
  const bool baselines = mode("no_embeddings");
  int total = 0;
  for (int pipelines : pipeline_counts) {
    const bool lockstep = absl::GetFlag(FLAGS_staleness) == 0 && pipelines > 1;
    total += static_cast<int>(computes.size() * (baselines * (1 + lockstep) + fetches.size()));
  }
  int done = 0;
  for (int pipelines : pipeline_counts) {
    for (double ms : computes) {
      if (stop_requested.load()) break;
      Config c{pipelines, ms, busy, absl::GetFlag(FLAGS_seconds)};
      // Without the baseline row, efficiency is against the compute alone.
      double base_ms = ms;
      if (baselines) {
        RunResult base = RunBaseline(c);
        base_ms = base.StepMs(pipelines);
        std::printf("[%d/%d] %d pipelines, compute %g ms, no embeddings: %.3f ms/step\n", ++done,
                    total, pipelines, ms, base_ms);
        std::fflush(stdout);
        rows.push_back({pipelines, ms, "no embeddings", base, base_ms});
      }
      if (baselines && absl::GetFlag(FLAGS_staleness) == 0 && pipelines > 1) {
        RunResult lockstep = RunBaseline(c, /*lockstep=*/true);
        std::printf("[%d/%d] %d pipelines, compute %g ms, no embeddings in lockstep: %.3f ms/step\n",
                    ++done, total, pipelines, ms, lockstep.StepMs(pipelines));
        rows.push_back({pipelines, ms, "no embeddings, lockstep", lockstep, base_ms});
      }
      for (Fetch fetch : fetches) {
        RunResult r = RunEmber(client->get(), c, fetch, worker_base, specs, workload, batches);
        worker_base += 100;
        if (!r.status.ok()) {
          std::fprintf(stderr, "compute %g ms %s: %s\n", ms, FetchName(fetch),
                       r.status.ToString().c_str());
          return 1;
        }
        std::printf("[%d/%d] %d pipelines, compute %g ms, %s: %.0f steps/s, %.3f ms/step\n",
                    ++done, total, pipelines, ms, FetchName(fetch), r.StepsPerSecond(),
                    r.StepMs(pipelines));
        if (r.merged_steps > 0 && r.steps > 0) {
          const double separate = double(r.unique_keys) / r.steps * pipelines;
          const double merged = double(r.merged_keys) / r.merged_steps;
          std::printf("      merged: %.0f unique keys per node step, where the %d pipelines alone "
                      "would fetch %.0f (%.2fx)\n",
                      merged, pipelines, separate, merged > 0 ? separate / merged : 0);
        }
        if (IsEarly(fetch)) {
          const double merged_step_keys =
              r.merged_steps > 0 ? double(r.merged_keys) / r.merged_steps
                                 : double(r.unique_keys) / std::max<int64_t>(1, r.steps);
          const double patched =
              r.steps_patched ? double(r.rows_patched) / r.steps_patched : 0;
          std::printf(
              "      early fetch: %llu steps brought forward on the trainer, %llu fetched "
              "after the push; %.0f rows patched per %s step of %.0f unique (%.1f%%), "
              "%.1f KB of rows and optimizer state per early fetch\n",
              static_cast<unsigned long long>(r.steps_patched),
              static_cast<unsigned long long>(r.steps_refetched), patched,
              r.merged_steps > 0 ? "node" : "pipeline", merged_step_keys,
              merged_step_keys > 0 ? 100 * patched / merged_step_keys : 0,
              r.steps_patched + r.steps_refetched
                  ? r.patch_bytes / 1024.0 / (r.steps_patched + r.steps_refetched)
                  : 0);
          if (r.steps_refetched > 0) {
            std::printf(
                "      fetched after the barrier: %.0f rows per refetched step of %.0f "
                "(%.1f%%: the rows pushes changed since the early fetch)\n",
                double(r.rows_refetched) / r.steps_refetched,
                double(r.keys_refetched) / r.steps_refetched,
                r.keys_refetched ? 100.0 * r.rows_refetched / r.keys_refetched : 0);
          }
        }
        std::printf("      stand-in model backward: %.3f ms CPU/step, taking batches from the source: "
                    "%.3f ms CPU/step, both left out of the trainer's CPU\n",
                    r.CpuMsPerStep(r.model_cpu_seconds), r.CpuMsPerStep(r.input_cpu_seconds));
        std::fflush(stdout);
        rows.push_back({pipelines, ms, FetchName(fetch), std::move(r), base_ms});
      }
    }
  }

  std::printf("\n| pipelines | compute | mode | steps/s (all pipelines) | step ms | exposed wait ms "
              "mean | wait p99 ms | efficiency | unique keys/step | KB/step | RPCs/step | trainer CPU "
              "ms/step | shards CPU ms/step | total CPU ms/step |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (Row& row : rows) {
    RunResult& r = row.r;
    const double step_ms = r.StepMs(row.pipelines);
    if (std::string(row.mode) == "no embeddings, lockstep") {
      std::printf("| %d | %g ms | %s | %.0f | %.3f | - | - | %.3f | - | - | - | - | - | - |\n",
                  row.pipelines, row.compute, row.mode, r.StepsPerSecond(), step_ms,
                  row.baseline_ms / step_ms);
      continue;
    }
    if (std::string(row.mode) == "no embeddings") {
      std::printf("| %d | %g ms | %s | %.0f | %.3f | - | - | 1 | - | - | - | - | - | - |\n", row.pipelines,
                  row.compute, row.mode, r.StepsPerSecond(), step_ms);
      continue;
    }
    // With no compute the baseline step is empty: efficiency means nothing.
    const std::string efficiency =
        row.compute > 0 ? absl::StrFormat("%.3f", row.baseline_ms / step_ms) : "-";
    const bool shards_known = r.shard_cpu_seconds >= 0;
    const std::string shard_cpu = (*client)->in_process() ? "in trainer"
                                  : shards_known
                                      ? absl::StrFormat("%.2f", r.CpuMsPerStep(r.shard_cpu_seconds))
                                      : "-";
    const std::string total_cpu =
        shards_known ? absl::StrFormat("%.2f", r.CpuMsPerStep(r.cpu_seconds + r.shard_cpu_seconds))
                     : "-";
    std::printf("| %d | %g ms | %s | %.0f | %.3f | %.3f | %.3f | %s | %.0f | %.1f | %.2f | %.2f | %s | "
                "%s |\n",
                row.pipelines, row.compute, row.mode, r.StepsPerSecond(), step_ms, r.MeanWaitMs(),
                r.WaitMs(0.99), efficiency.c_str(), r.steps ? double(r.unique_keys) / r.steps : 0,
                r.steps ? r.bytes / 1024.0 / r.steps : 0, r.steps ? double(r.rpcs) / r.steps : 0,
                r.CpuMsPerStep(r.cpu_seconds), shard_cpu.c_str(), total_cpu.c_str());
  }
  if (TraceRecorder* trace = Timeline()) {
    if (absl::Status w = trace->WriteJson(absl::GetFlag(FLAGS_trace)); !w.ok()) {
      std::fprintf(stderr, "ember-trainer: %s\n", w.ToString().c_str());
      return 1;
    }
    std::printf("timeline: %zu spans in %s (open in ui.perfetto.dev)\n", trace->events(),
                absl::GetFlag(FLAGS_trace).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace ember::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ember::DisableAbslDeadlockDetection();  // see common/abseil_mode.h
  // In a container the trainer is process 1, which the kernel sends no
  // default-fatal signal to: without handlers `docker stop` waits out its
  // grace period and kills it.
  std::signal(SIGTERM, ember::bench::RequestStop);
  std::signal(SIGINT, ember::bench::RequestStop);
  return ember::bench::Run();
}
