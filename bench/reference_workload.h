// The reference workload of WORKLOAD.md ("the 17-feature trainer"): its
// features, their cardinalities and hotness, and a Zipf id sampler.
#pragma once

#include <cmath>
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
// smaller variant tests use).
inline std::vector<Feature> ReferenceFeatures(uint64_t scale_down = 1) {
  const uint64_t cards[17] = {10'000'000, 5'000'000, 2'000'000, 1'000'000, 1'000'000, 500'000,
                              200'000,    100'000,   50'000,    20'000,    10'000,    5'000,
                              1'000,      500,       100,       50,        10};
  std::vector<Feature> f;
  for (int i = 0; i < 17; ++i) {
    const uint64_t c = std::max<uint64_t>(1, cards[i] / scale_down);
    f.push_back({"feature_" + std::to_string(i), c, 1, i < 12 ? 1 : 8});
  }
  return f;
}

// Zipf-like ids in [0, n) with exponent s (!= 1), by inverting the CDF of the
// continuous power law: rank 0 is the most frequent. Cheap and stateless
// beyond n and s; close to the discrete Zipf for the head that matters here.
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double s) : n_(n), s_(s), a_(std::pow(double(n) + 1, 1 - s) - 1) {}
  template <typename Rng>
  uint64_t operator()(Rng& rng) const {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    const double x = std::pow(a_ * u + 1, 1 / (1 - s_)) - 1;
    return std::min<uint64_t>(n_ - 1, static_cast<uint64_t>(x));
  }

 private:
  uint64_t n_;
  double s_;
  double a_;
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

// Draws the batches of one id stream: Zipf ids per feature, hashed to keys.
class BatchGenerator {
 public:
  BatchGenerator(std::vector<Feature> features, int batch_size, uint64_t seed)
      : features_(std::move(features)), batch_size_(batch_size), rng_(seed) {
    for (const Feature& f : features_) zipf_.emplace_back(f.cardinality, 1.05);
  }
  Batch Next() {
    Batch b;
    for (size_t fi = 0; fi < features_.size(); ++fi) {
      FeatureBatch fb;
      fb.offsets.reserve(batch_size_ + 1);
      fb.offsets.push_back(0);
      std::uniform_int_distribution<int> hot(features_[fi].min_ids, features_[fi].max_ids);
      for (int e = 0; e < batch_size_; ++e) {
        for (int k = hot(rng_); k > 0; --k) {
          fb.keys.push_back(FeatureKey(static_cast<int>(fi), zipf_[fi](rng_)));
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
  std::mt19937_64 rng_;
  std::vector<ZipfSampler> zipf_;
};

}  // namespace ember::bench
