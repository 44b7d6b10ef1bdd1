// The CPU that Ember's own row work costs per pipeline-step of the
// reference workload when nothing else runs: the floor under issue 34's
// in-process bars. One thread, no pipeline threads, no channel, no requests:
// per merged step of 4 pipelines it calls, in order, the very functions an
// in-process step runs,
//   dedup     each pipeline's keys per table (KeyDeduplicator), then the
//             pipelines' unique keys merged per table (the merger's dedup);
//   find      the CPU store's FindOrInsert of the merged keys, rows copied
//             out (what the shard's lookup does);
//   pool fwd  PoolForwardAt per pipeline and feature, from those rows;
//   pool bwd  PoolBackwardInto per pipeline and feature (the pooled rows
//             stand in for their gradient), then ScatterAddRows of the
//             pipelines' gradients into the merged sums;
//   apply     the store's ApplyGradients of the sums (Adagrad).
// The stores are one per table holding every shard's rows (2 shards split
// the same rows and work). The ids are those of ember-trainer's default run
// (a ring of --batches batches per pipeline, seeds 42 + pipeline), and
// --warmup_steps merged steps fill the tables first, as the trainer's
// warm-up does. Prints each pass's thread CPU per pipeline-step (median of
// rounds) per dim, and each dim's total against the first.
//
//   build/bench/inproc_floor_bench [--dims=8,32,128 --rounds=5 --steps=400]
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_util.h"
#include "bench/reference_workload.h"
#include "client/dedup.h"
#include "client/pooling.h"
#include "common/process_cpu.h"
#include "kernels/embedding_store.h"
#include "kernels/table_config_proto.h"

ABSL_FLAG(std::string, dims, "8,32,128", "Row widths, side by side; the first is the base.");
ABSL_FLAG(int, batch, 128, "Examples per step per pipeline.");
ABSL_FLAG(int, pipelines, 4, "Pipelines per merged step.");
ABSL_FLAG(int, batches, 256, "Distinct batches per pipeline, cycled (ember-trainer's default).");
ABSL_FLAG(int, warmup_steps, 1500, "Merged steps run before the rounds, per dim.");
ABSL_FLAG(int, steps, 400, "Merged steps per round.");
ABSL_FLAG(int, rounds, 5, "Rounds; each pass's median is printed.");
ABSL_FLAG(uint64_t, seed, 42, "Seed of pipeline 0's batches (pipeline p: seed + p).");

namespace ember {
namespace {

enum Pass { kDedup, kFind, kPoolFwd, kPoolBwd, kApply, kPasses };
constexpr const char* kPassNames[kPasses] = {"dedup", "find", "pool fwd", "pool bwd", "apply"};

void Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "inproc_floor_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

class Floor {
 public:
  Floor(const std::vector<bench::Feature>& features, uint32_t dim,
        const std::vector<std::vector<Batch>>& rings)
      : dim_(dim), rings_(rings), tables_(features.size()) {
    const size_t pipelines = rings_.size();
    for (const bench::Feature& f : features) {
      absl::StatusOr<v1::TableConfig> normal =
          NormalizeTableConfig(bench::ReferenceTableConfig(f, dim));
      Check(normal.status(), "table config");
      absl::StatusOr<TableConfig> config = TableConfigFromProto(*normal);
      Check(config.status(), "table config");
      absl::StatusOr<std::unique_ptr<EmbeddingStore>> store = NewCpuStore(*config);
      Check(store.status(), "store");
      stores_.push_back(std::move(*store));
      mean_.push_back(f.max_ids > 1);
    }
    dedup_.resize(pipelines, std::vector<KeyDeduplicator>(tables_));
    inverse_.resize(pipelines, std::vector<std::vector<uint32_t>>(tables_));
    to_.resize(pipelines, std::vector<std::vector<uint32_t>>(tables_));
    grads_.resize(pipelines, std::vector<std::vector<float>>(tables_));
    pooled_.resize(pipelines, std::vector<std::vector<float>>(tables_));
    merged_.resize(tables_);
    rows_.resize(tables_);
    sums_.resize(tables_);
  }

  // Runs `steps` merged steps, adding each pass's thread CPU seconds to `cpu`.
  void Run(int steps, std::vector<double>* cpu) {
    for (int i = 0; i < steps; ++i) Step(cpu);
  }

 private:
  void Step(std::vector<double>* cpu) {
    const size_t pipelines = rings_.size();
    std::vector<const Batch*> batch(pipelines);
    for (size_t p = 0; p < pipelines; ++p) batch[p] = &rings_[p][next_ % rings_[p].size()];
    ++next_;
    double t = ThreadCpuSeconds();
    auto lap = [&](Pass pass) {
      const double now = ThreadCpuSeconds();
      (*cpu)[pass] += now - t;
      t = now;
    };

    for (size_t tb = 0; tb < tables_; ++tb) {
      merged_[tb].Clear();
      for (size_t p = 0; p < pipelines; ++p) {
        dedup_[p][tb].Clear();
        inverse_[p][tb].clear();
        dedup_[p][tb].Add(batch[p]->features[tb].keys, &inverse_[p][tb]);
        to_[p][tb].clear();
        merged_[tb].Add(dedup_[p][tb].unique(), &to_[p][tb]);
      }
    }
    lap(kDedup);

    for (size_t tb = 0; tb < tables_; ++tb) {
      const std::vector<uint64_t>& keys = merged_[tb].unique();
      rows_[tb].resize(keys.size() * dim_);
      Check(stores_[tb]
                ->FindOrInsert(keys, DType::kFp32,
                               absl::MakeSpan(reinterpret_cast<uint8_t*>(rows_[tb].data()),
                                              rows_[tb].size() * sizeof(float)))
                .status(),
            "find");
    }
    lap(kFind);

    std::vector<const char*> at;
    for (size_t p = 0; p < pipelines; ++p) {
      for (size_t tb = 0; tb < tables_; ++tb) {
        const FeatureBatch& fb = batch[p]->features[tb];
        at.resize(to_[p][tb].size());
        for (size_t u = 0; u < at.size(); ++u) {
          at[u] = reinterpret_cast<const char*>(rows_[tb].data() + size_t{to_[p][tb][u]} * dim_);
        }
        pooled_[p][tb].resize((fb.offsets.size() - 1) * dim_);
        PoolForwardAt(fb.offsets, inverse_[p][tb], fb.weights, Combine(tb), at.data(), dim_,
                      pooled_[p][tb].data());
      }
    }
    lap(kPoolFwd);

    for (size_t tb = 0; tb < tables_; ++tb) {
      sums_[tb].resize(merged_[tb].unique().size() * dim_);
      fresh_.assign(merged_[tb].unique().size(), 1);
      sum_at_.resize(merged_[tb].unique().size());
      for (size_t u = 0; u < sum_at_.size(); ++u) sum_at_[u] = sums_[tb].data() + u * dim_;
      for (size_t p = 0; p < pipelines; ++p) {
        const FeatureBatch& fb = batch[p]->features[tb];
        std::vector<float>& g = grads_[p][tb];
        g.resize(to_[p][tb].size() * dim_);
        uint32_t written = 0;
        PoolBackwardInto(fb.offsets, inverse_[p][tb], fb.weights, Combine(tb),
                         pooled_[p][tb].data(), dim_, g.data(), &written);
        ScatterAddRows(to_[p][tb], g.data(), dim_, sum_at_.data(), fresh_.data());
      }
    }
    lap(kPoolBwd);

    for (size_t tb = 0; tb < tables_; ++tb) {
      Check(stores_[tb]
                ->ApplyGradients(merged_[tb].unique(), DType::kFp32,
                                 absl::MakeSpan(reinterpret_cast<const uint8_t*>(sums_[tb].data()),
                                                sums_[tb].size() * sizeof(float)))
                .status(),
            "apply");
    }
    lap(kApply);
  }

  Combiner Combine(size_t tb) const { return mean_[tb] ? Combiner::kMean : Combiner::kSum; }

  const uint32_t dim_;
  const std::vector<std::vector<Batch>>& rings_;  // [pipeline][batch], the caller's
  const size_t tables_;
  size_t next_ = 0;
  std::vector<std::unique_ptr<EmbeddingStore>> stores_;
  std::vector<bool> mean_;
  std::vector<std::vector<KeyDeduplicator>> dedup_;               // [pipeline][table]
  std::vector<std::vector<std::vector<uint32_t>>> inverse_, to_;  // [pipeline][table]
  std::vector<std::vector<std::vector<float>>> grads_, pooled_;   // [pipeline][table]
  std::vector<KeyDeduplicator> merged_;                           // [table]
  std::vector<std::vector<float>> rows_, sums_;                   // [table]
  std::vector<uint8_t> fresh_;
  std::vector<float*> sum_at_;
};

int Main() {
  const std::vector<double> dims = bench::ParseList(absl::GetFlag(FLAGS_dims));
  const int pipelines = absl::GetFlag(FLAGS_pipelines);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const std::vector<bench::Feature> features = bench::ReferenceFeatures();
  std::vector<std::vector<Batch>> rings(pipelines);
  for (int p = 0; p < pipelines; ++p) {
    bench::BatchGenerator gen(features, absl::GetFlag(FLAGS_batch),
                              absl::GetFlag(FLAGS_seed) + static_cast<uint64_t>(p));
    for (int b = 0; b < absl::GetFlag(FLAGS_batches); ++b) rings[p].push_back(gen.Next());
  }
  std::printf(
      "inproc_floor_bench: reference workload, %d pipelines merged, %d batches each, one thread; "
      "%d warm-up steps, %d rounds of %d merged steps, medians; CPU us per pipeline-step\n",
      pipelines, absl::GetFlag(FLAGS_batches), absl::GetFlag(FLAGS_warmup_steps), rounds, steps);
  std::printf("%6s", "dim");
  for (const char* name : kPassNames) std::printf(" %10s", name);
  std::printf(" %10s %10s\n", "total", "vs first");
  double first_total = 0;
  for (double d : dims) {
    Floor floor(features, static_cast<uint32_t>(d), rings);
    std::vector<double> ignored(kPasses);
    floor.Run(absl::GetFlag(FLAGS_warmup_steps), &ignored);
    std::vector<std::vector<double>> per_pass(kPasses + 1);
    for (int r = 0; r < rounds; ++r) {
      std::vector<double> cpu(kPasses);
      floor.Run(steps, &cpu);
      double total = 0;
      for (int pass = 0; pass < kPasses; ++pass) {
        const double us = cpu[pass] * 1e6 / (static_cast<double>(steps) * pipelines);
        per_pass[pass].push_back(us);
        total += us;
      }
      per_pass[kPasses].push_back(total);
    }
    std::printf("%6.0f", d);
    for (int pass = 0; pass < kPasses; ++pass) std::printf(" %10.1f", bench::Median(per_pass[pass]));
    const double total = bench::Median(per_pass[kPasses]);
    if (first_total == 0) first_total = total;
    std::printf(" %10.1f %9.2fx\n", total, total / first_total);
  }
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ember::Main();
}
