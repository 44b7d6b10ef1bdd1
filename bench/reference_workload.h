// The reference workload of WORKLOAD.md ("the 17-feature trainer"): its
// features, their cardinalities and hotness, and a Zipf id sampler.
#pragma once

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/key_hash.h"
#include "ember/client.h"
#include "ember/batch.h"
#include "ember/step_pipeline.h"
#include "ember/v1/types.pb.h"

namespace ember::bench {

struct Feature {
  std::string table;
  uint64_t cardinality;
  int min_ids;  // ids per example: uniform in [min_ids, max_ids]
  int max_ids;
};

// The 17 features; `scale_down` divides every cardinality (100 gives the
// smaller variant tests use) and `scale` then multiplies it (benchmarks'
// --cardinality_scale).
inline std::vector<Feature> ReferenceFeatures(uint64_t scale_down = 1, double scale = 1.0) {
  const uint64_t cards[17] = {10'000'000, 5'000'000, 2'000'000, 1'000'000, 1'000'000, 500'000,
                              200'000,    100'000,   50'000,    20'000,    10'000,    5'000,
                              1'000,      500,       100,       50,        10};
  std::vector<Feature> f;
  for (int i = 0; i < 17; ++i) {
    const uint64_t c = std::max<uint64_t>(
        1, static_cast<uint64_t>(static_cast<double>(cards[i] / scale_down) * scale));
    f.push_back({"feature_" + std::to_string(i), c, 1, i < 12 ? 1 : 8});
  }
  return f;
}

// Zipf-like ids in [0, n) with exponent s (!= 1), by inverting the CDF of the
// continuous power law (rank 0 is the most frequent): close to the discrete
// Zipf for the head that matters here. The inverse CDF is tabled at 1,024
// quantiles (8 KB) and interpolated linearly between them, so a draw costs
// one random number and one table load instead of a pow(): benchmarks draw
// fresh batches every step without the drawing costing more CPU, or more
// cache, than the system under test.
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double s) : n_(n), bounds_(kBuckets + 1) {
    const double a = std::pow(double(n) + 1, 1 - s) - 1;
    for (size_t i = 0; i <= kBuckets; ++i) {
      const double u = static_cast<double>(i) / kBuckets;
      bounds_[i] = std::pow(a * u + 1, 1 / (1 - s)) - 1;
    }
  }
  template <typename Rng>
  uint64_t operator()(Rng& rng) const {
    const uint64_t r = rng();
    const size_t i = static_cast<size_t>(r >> 54);
    const double frac = static_cast<double>(r & ((uint64_t{1} << 54) - 1)) * 0x1p-54;
    const double x = bounds_[i] + frac * (bounds_[i + 1] - bounds_[i]);
    return std::min<uint64_t>(n_ - 1, static_cast<uint64_t>(x));
  }

 private:
  static constexpr size_t kBuckets = size_t{1} << 10;
  uint64_t n_;
  std::vector<double> bounds_;
};

// The uint64 key of id `id` of feature `feature` ("ids hashed to uint64 keys").
inline uint64_t FeatureKey(int feature, uint64_t id) {
  return Mix64((static_cast<uint64_t>(feature) << 56) ^ id);
}

// The table of one feature: Adagrad (learning rate 0.01, initial accumulator
// 0.1), fp32, truncated-normal initial rows.
inline v1::TableConfig ReferenceTableConfig(const Feature& f, uint32_t dim) {
  v1::TableConfig c;
  c.set_name(f.table);
  c.set_dim(dim);
  c.mutable_initializer()->mutable_truncated_normal()->set_stddev(0.05f);
  c.mutable_initializer()->set_seed(1);
  c.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.01f);
  c.mutable_optimizer()->mutable_adagrad()->set_initial_accumulator(0.1f);
  return c;
}

// Creates every feature's table (ReferenceTableConfig) on every shard;
// idempotent, so every benchmark run may call it.
inline absl::Status CreateReferenceTables(Client& client, const std::vector<Feature>& features,
                                          uint32_t dim) {
  for (const Feature& f : features) {
    if (absl::Status s = client.CreateTable(ReferenceTableConfig(f, dim)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("create table ", f.table, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

// One pipeline feature per table; multi-hot features are pooled by mean.
inline std::vector<FeatureSpec> ReferenceFeatureSpecs(const std::vector<Feature>& features) {
  std::vector<FeatureSpec> specs;
  for (const Feature& f : features) {
    specs.push_back({f.table, f.table, f.max_ids > 1 ? Combiner::kMean : Combiner::kSum});
  }
  return specs;
}

// A small, fast 64-bit generator (splitmix64): drawing ids must cost far
// less than the system under test spends on them.
class SplitMix64 {
 public:
  using result_type = uint64_t;
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  static constexpr uint64_t min() { return 0; }
  static constexpr uint64_t max() { return ~uint64_t{0}; }
  uint64_t operator()() { return Mix64(state_ += 0x9e3779b97f4a7c15ULL); }

 private:
  uint64_t state_;
};

// The reference workload's Zipf exponent.
constexpr double kReferenceZipfExponent = 1.05;

// The samplers of `features` at `exponent`, built once per process and
// shared by every generator of the same workload (one table set in cache,
// not one per pipeline).
inline std::shared_ptr<const std::vector<ZipfSampler>> SharedSamplers(
    const std::vector<Feature>& features, double exponent) {
  static std::mutex mu;
  static std::map<std::pair<std::vector<uint64_t>, double>,
                  std::shared_ptr<const std::vector<ZipfSampler>>>
      cache;
  std::vector<uint64_t> cards;
  for (const Feature& f : features) cards.push_back(f.cardinality);
  std::lock_guard<std::mutex> lock(mu);
  auto& entry = cache[{cards, exponent}];
  if (!entry) {
    auto samplers = std::make_shared<std::vector<ZipfSampler>>();
    for (uint64_t c : cards) samplers->emplace_back(c, exponent);
    entry = std::move(samplers);
  }
  return entry;
}

// Draws the batches of one id stream: Zipf ids per feature, hashed to keys.
class BatchGenerator {
 public:
  BatchGenerator(std::vector<Feature> features, int batch_size, uint64_t seed,
                 double zipf_exponent = kReferenceZipfExponent)
      : features_(std::move(features)),
        batch_size_(batch_size),
        rng_(seed),
        zipf_(SharedSamplers(features_, zipf_exponent)) {}
  Batch Next() {
    Batch b;
    for (size_t fi = 0; fi < features_.size(); ++fi) {
      FeatureBatch fb;
      fb.offsets.reserve(batch_size_ + 1);
      fb.keys.reserve(static_cast<size_t>(batch_size_) * features_[fi].max_ids);
      fb.offsets.push_back(0);
      const Feature& f = features_[fi];
      const uint64_t spread = static_cast<uint64_t>(f.max_ids - f.min_ids + 1);
      for (int e = 0; e < batch_size_; ++e) {
        // Ids per example, uniform in [min_ids, max_ids] (fastrange).
        const int hot = f.min_ids + static_cast<int>((static_cast<unsigned __int128>(rng_()) * spread) >> 64);
        for (int k = hot; k > 0; --k) {
          fb.keys.push_back(FeatureKey(static_cast<int>(fi), (*zipf_)[fi](rng_)));
        }
        fb.offsets.push_back(static_cast<int64_t>(fb.keys.size()));
      }
      b.features.push_back(std::move(fb));
    }
    return b;
  }

 private:
  std::vector<Feature> features_;
  int batch_size_;
  SplitMix64 rng_;
  std::shared_ptr<const std::vector<ZipfSampler>> zipf_;
};

// `steps` batches of each of `pipelines` id streams, drawn up front;
// pipeline p's stream is seeded `seed + p`. Indexed [pipeline][step].
inline std::vector<std::vector<Batch>> DrawPipelineBatches(const std::vector<Feature>& features,
                                                           int batch, uint64_t seed, int pipelines,
                                                           int steps) {
  std::vector<std::vector<Batch>> batches(pipelines);
  for (int p = 0; p < pipelines; ++p) {
    BatchGenerator gen(features, batch, seed + static_cast<uint64_t>(p));
    for (int s = 0; s < steps; ++s) batches[p].push_back(gen.Next());
  }
  return batches;
}

}  // namespace ember::bench
