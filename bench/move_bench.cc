// What an online move costs a running trainer (issue 36): the reference
// workload's pipelines at staleness s (merged into one StepMerger, as
// ember-trainer runs them by default) train against a 2-shard cluster while
// it moves to 3 shards (a shard started with `ember-server --join`) and
// back to 2 (ember/cluster_move.h). Each pipeline follows the cluster as a
// trainer would: refused with ABORTED, the node connects again
// (Client::ConnectToCluster) and resumes at the step after the one every
// shard applied (Client::AppliedStep).
//
//   move_bench --shards=h:p0,h:p1 --join=h:p2 [--pipelines=4 --staleness=1
//              --compute_ms=1 --phase_seconds=3 --scale_down=1 --dim=8]
//
// Prints, for the phase before the moves and for each move: steps/s of all
// pipelines, the time pushes were held, the trainers' gap (from the move's
// start until every pipeline stepped again), and the steps/s over the
// second that starts with the move; and the moved rows and their share.
// That no push is lost or applied twice is what
// tests/server/move_integration_test.cc checks (row for row).
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/reference_workload.h"
#include "bench/workload_flags.h"
#include "common/status_macros.h"
#include "ember/client.h"
#include "ember/cluster_move.h"
#include "ember/step_merger.h"
#include "ember/step_pipeline.h"

ABSL_FLAG(std::string, shards, "", "The cluster's two shards, host:port,host:port.");
ABSL_FLAG(std::string, join, "", "A shard started with ember-server --join, host:port.");
ABSL_FLAG(int, pipelines, 4, "Step pipelines, one SSP worker and thread each.");
ABSL_FLAG(int, staleness, 1, "SSP staleness.");
ABSL_FLAG(double, compute_ms, 1, "Simulated compute per step (a sleep).");
ABSL_FLAG(double, phase_seconds, 3, "Training before, between and after the two moves.");
ABSL_FLAG(uint32_t, dim, 8, "Embedding dimension of every table.");
ABSL_FLAG(int, batches, 256, "Distinct batches per pipeline, cycled.");
ABSL_FLAG(bool, merge_pipelines, true,
          "The pipelines share a StepMerger (one SSP worker), as ember-trainer runs them by "
          "default; false: each is its own worker.");

namespace ember::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One pipeline's steps: when each completed (seconds since the start),
// how many it trained, how often a move refused it.
struct Worker {
  std::vector<double> step_done;
  int64_t steps = 0;
  int refusals = 0;
  absl::Status status;
};

// The node: a client and its pipelines (sharing a StepMerger, one SSP
// worker, as the reference trainer runs them by default; or each its own
// worker), rebuilt at the cut after every move.
class Node {
 public:
  Node(ClientOptions options, const std::vector<FeatureSpec>& specs, int pipelines, bool merge)
      : options_(std::move(options)), specs_(specs), pipelines_(pipelines), merge_(merge) {}

  static uint32_t WorkerId(int p) { return 500 + static_cast<uint32_t>(p); }
  static constexpr uint32_t kMergerId = 599;

  // Connects (following a move) and makes the pipelines; after a move,
  // each resumes at the step after the cut.
  absl::Status Build(bool after_move) {
    pipes_.clear();
    merger_.reset();
    client_.reset();
    EMBER_ASSIGN_OR_RETURN(client_, Client::ConnectToCluster(options_));
    options_.shards = client_->options().shards;
    next_.assign(pipelines_, 0);
    for (int p = 0; p < pipelines_ && after_move; ++p) {
      EMBER_ASSIGN_OR_RETURN(const int64_t applied,
                             client_->AppliedStep(merge_ ? kMergerId : WorkerId(p)));
      next_[p] = applied + 1;
    }
    if (merge_) {
      StepMergerOptions mo;
      mo.ranks = pipelines_;
      mo.worker_id = kMergerId;
      mo.staleness = absl::GetFlag(FLAGS_staleness);
      mo.first_step = next_[0];
      EMBER_ASSIGN_OR_RETURN(merger_, StepMerger::Create(client_.get(), mo));
    }
    for (int p = 0; p < pipelines_; ++p) {
      PipelineOptions o;
      o.worker_id = WorkerId(p);
      o.features = specs_;
      o.staleness = absl::GetFlag(FLAGS_staleness);
      o.first_step = next_[p];
      o.merger = merger_.get();
      o.merger_rank = p;
      EMBER_ASSIGN_OR_RETURN(std::unique_ptr<StepPipeline> pipe,
                             StepPipeline::Create(client_.get(), o));
      pipes_.push_back(std::move(pipe));
    }
    return absl::OkStatus();
  }
  // After a refusal: closes what is left (its unregistering is refused).
  void Abandon() {
    for (auto& pipe : pipes_) (void)pipe->Close();
  }

  StepPipeline& pipe(int p) { return *pipes_[p]; }
  int64_t next(int p) const { return next_[p]; }
  bool merged() const { return merge_; }
  const ClientOptions& options() const { return options_; }

 private:
  ClientOptions options_;
  const std::vector<FeatureSpec>& specs_;
  const int pipelines_;
  const bool merge_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<StepMerger> merger_;
  std::vector<std::unique_ptr<StepPipeline>> pipes_;
  std::vector<int64_t> next_;
};

// Pipeline p's steps on `node` from node.next(p) until time is up (then
// every pipeline stops at one step, `stop_step`, as merged ranks must make
// the same calls): OK, or the refusal or error that ended them.
absl::Status TrainSteps(Node& node, int p, const std::vector<Batch>& ring, Clock::time_point start,
                        const std::atomic<bool>& time_up, std::atomic<int64_t>& stop_step,
                        Worker* w) {
  const auto compute = std::chrono::duration<double, std::milli>(absl::GetFlag(FLAGS_compute_ms));
  StepPipeline& pipe = node.pipe(p);
  int64_t prefetched = node.next(p);
  for (int64_t t = node.next(p);; ++t) {
    if (time_up.load()) {
      int64_t unset = std::numeric_limits<int64_t>::max();
      stop_step.compare_exchange_strong(unset, t + 8);
    }
    if (t >= stop_step.load()) {
      w->steps = t;
      return pipe.Close();
    }
    for (; prefetched <= t + pipe.prefetch_depth() && prefetched < stop_step.load(); ++prefetched) {
      EMBER_RETURN_IF_ERROR(pipe.Prefetch(prefetched, ring[prefetched % ring.size()]));
    }
    EMBER_ASSIGN_OR_RETURN(StepView view, pipe.Wait(t));
    std::this_thread::sleep_for(compute);
    for (absl::Span<float> pooled : view.pooled) {
      for (float& x : pooled) x *= 0.01f;
    }
    EMBER_RETURN_IF_ERROR(pipe.Push(t, view.pooled));
    w->step_done.push_back(Since(start));
  }
}

struct Move {
  double start = 0, end = 0;
  absl::StatusOr<MoveResult> result = absl::UnknownError("not run");
};

int Run() {
  const std::vector<std::string> two = absl::StrSplit(absl::GetFlag(FLAGS_shards), ',');
  const std::string joining = absl::GetFlag(FLAGS_join);
  if (two.size() != 2 || joining.empty()) {
    std::fprintf(stderr, "move_bench: --shards=<2 addresses> and --join=<address> are needed\n");
    return 2;
  }
  const WorkloadFlags workload = ReadWorkloadFlags();
  ClientOptions options;
  options.shards = two;
  options.retry_budget = absl::Seconds(60);
  {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    if (!client.ok()) {
      std::fprintf(stderr, "move_bench: %s\n", client.status().ToString().c_str());
      return 1;
    }
    if (absl::Status s =
            CreateReferenceTables(**client, workload.Features(), absl::GetFlag(FLAGS_dim));
        !s.ok()) {
      std::fprintf(stderr, "move_bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  const int n = absl::GetFlag(FLAGS_pipelines);
  const std::vector<FeatureSpec> specs = ReferenceFeatureSpecs(workload.Features());
  std::vector<std::vector<Batch>> rings(n);
  for (int p = 0; p < n; ++p) {
    BatchGenerator gen = workload.Generator(p);
    for (int b = 0; b < absl::GetFlag(FLAGS_batches); ++b) rings[p].push_back(gen.Next());
  }
  std::printf("move_bench: %u cores, %d pipelines%s at s = %d, %.1f ms compute, dim %u; %s\n",
              std::thread::hardware_concurrency(), n,
              absl::GetFlag(FLAGS_merge_pipelines) ? " (merged)" : "",
              absl::GetFlag(FLAGS_staleness), absl::GetFlag(FLAGS_compute_ms),
              absl::GetFlag(FLAGS_dim), workload.Describe().c_str());

  const Clock::time_point start = Clock::now();
  std::atomic<bool> time_up{false};
  std::atomic<int64_t> stop_step{std::numeric_limits<int64_t>::max()};
  std::vector<Worker> workers(n);
  Node node(options, specs, n, absl::GetFlag(FLAGS_merge_pipelines));
  if (absl::Status s = node.Build(/*after_move=*/false); !s.ok()) {
    std::fprintf(stderr, "move_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  // A refused pipeline waits for the others here; the last to arrive
  // rebuilds the node at the cut, and all go on from there.
  absl::Status rebuilt;
  std::barrier follow(n, [&]() noexcept {
    node.Abandon();
    rebuilt = node.Build(/*after_move=*/true);
  });
  std::vector<std::thread> threads;
  for (int p = 0; p < n; ++p) {
    threads.emplace_back([&, p] {
      Worker& w = workers[p];
      for (;;) {
        absl::Status s = TrainSteps(node, p, rings[p], start, time_up, stop_step, &w);
        if (!absl::IsAborted(s)) {
          w.status = s;
          return;
        }
        ++w.refusals;
        follow.arrive_and_wait();
        if (!rebuilt.ok()) {
          w.status = rebuilt;
          return;
        }
      }
    });
  }
  const auto phase = std::chrono::duration<double>(absl::GetFlag(FLAGS_phase_seconds));
  Move moves[2];
  const std::vector<std::string> three = {two[0], two[1], joining};
  std::this_thread::sleep_for(phase);
  for (int m = 0; m < 2; ++m) {
    MoveOptions mo;
    mo.from = m == 0 ? two : three;
    mo.to = m == 0 ? three : two;
    moves[m].start = Since(start);
    moves[m].result = MoveCluster(mo);
    moves[m].end = Since(start);
    std::this_thread::sleep_for(phase);
  }
  time_up = true;
  for (auto& t : threads) t.join();

  std::vector<double> done;
  for (const Worker& w : workers) {
    if (!w.status.ok()) {
      std::fprintf(stderr, "move_bench: a pipeline: %s\n", w.status.ToString().c_str());
      return 1;
    }
    done.insert(done.end(), w.step_done.begin(), w.step_done.end());
  }
  std::sort(done.begin(), done.end());
  auto steps_between = [&](double a, double b) {
    return static_cast<double>(std::lower_bound(done.begin(), done.end(), b) -
                               std::lower_bound(done.begin(), done.end(), a));
  };
  const double before = steps_between(moves[0].start - 2.0, moves[0].start) / 2.0;
  std::printf(
      "\n| phase | steps/s (all pipelines) | of before | pushes held s (cut, commit) | trainer "
      "gap s |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");
  std::printf("| before (2 s) | %.0f | 1.00 | - | - |\n", before);
  for (int m = 0; m < 2; ++m) {
    if (!moves[m].result.ok()) {
      std::fprintf(stderr, "move_bench: move %d: %s\n", m,
                   moves[m].result.status().ToString().c_str());
      return 1;
    }
    // The gap: until every pipeline completed a step after the move.
    double gap = 0;
    for (const Worker& w : workers) {
      auto it = std::lower_bound(w.step_done.begin(), w.step_done.end(), moves[m].end);
      if (it != w.step_done.end()) gap = std::max(gap, *it - moves[m].start);
    }
    const double second = steps_between(moves[m].start, moves[m].start + 1.0);
    std::printf("| move %s, the second from its start | %.0f | %.2f | %.3f (%.3f, %.3f) | %.3f |\n",
                m == 0 ? "2 -> 3" : "3 -> 2", second, second / before,
                moves[m].result->held_seconds, moves[m].result->cut_seconds,
                moves[m].result->commit_seconds, gap);
  }
  // After: from a second past the last move to the end.
  const double last = done.empty() ? 0 : done.back();
  const double after_seconds = std::max(0.1, last - (moves[1].end + 1.0));
  const double after = steps_between(moves[1].end + 1.0, last) / after_seconds;
  std::printf("| after (%.1f s) | %.0f | %.2f | - | - |\n\n", after_seconds, after, after / before);
  for (int m = 0; m < 2; ++m) {
    const MoveResult& r = *moves[m].result;
    std::printf("move %s at step %lld: %llu rows, %llu moved (%.1f%%; jump routing moves 1/3)\n",
                m == 0 ? "2 -> 3" : "3 -> 2", static_cast<long long>(r.step),
                static_cast<unsigned long long>(r.rows),
                static_cast<unsigned long long>(r.moved_rows),
                100.0 * static_cast<double>(r.moved_rows) / static_cast<double>(r.rows));
  }
  bool exact = true;
  for (int p = 0; p < n; ++p) {
    std::printf("pipeline %d: %lld steps, refused by %d moves\n", p,
                static_cast<long long>(workers[p].steps), workers[p].refusals);
    exact = exact && workers[p].refusals == 2;
  }
  std::printf("%s\n", exact ? "every pipeline followed both moves"
                            : "a pipeline was not refused by both moves");
  return exact ? 0 : 1;
}

}  // namespace
}  // namespace ember::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ember::bench::Run();
}
