// Baselines the store benchmark runs beside Ember's CpuStore:
// - PlainArray: rows in one dense array indexed by row number, no hashing at
//   all: a random gather from it is the memory limit of the machine.
// - NaiveMap: absl::flat_hash_map<key, std::vector<float>> behind one mutex,
//   what a first implementation of a parameter server looks like.
// Both implement Adagrad so push costs compare like for like: the plain
// array with the store's own vectorised row update (the limit), the naive
// map with a scalar loop (a first implementation's).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "kernels/optimizer_rows.h"
#include "kernels/table_config.h"

namespace ember::bench {

class PlainArray {
 public:
  PlainArray(size_t rows, uint32_t dim) : dim_(dim), rows_(rows * dim, 0.01f), acc_(rows * dim, 0.1f) {}
  // `rows` are row numbers.
  void Gather(absl::Span<const uint64_t> rows, float* out) const {
    for (size_t i = 0; i < rows.size(); ++i) {
      CopyRowBytes(out + i * dim_, &rows_[rows[i] * dim_], dim_ * sizeof(float));
    }
  }
  // The limit of an update, like the gather's: the store's own vectorised
  // row update (opt::UpdateRow), with no hashing or locking around it.
  void Adagrad(absl::Span<const uint64_t> rows, const float* grads, float lr) {
    OptimizerConfig c;
    c.kind = OptimizerKind::kAdagrad;
    c.learning_rate = lr;
    for (size_t i = 0; i < rows.size(); ++i) {
      opt::UpdateRow(c, 0.0f, grads + i * dim_, &rows_[rows[i] * dim_], &acc_[rows[i] * dim_], dim_);
    }
  }

 private:
  uint32_t dim_;
  std::vector<float> rows_;
  std::vector<float> acc_;
};

class NaiveMap {
 public:
  explicit NaiveMap(uint32_t dim) : dim_(dim) {}
  // Missing keys read as zeros.
  void Find(absl::Span<const uint64_t> keys, float* out) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = map_.find(keys[i]);
      if (it == map_.end()) {
        std::fill(out + i * dim_, out + (i + 1) * dim_, 0.0f);
      } else {
        CopyRowBytes(out + i * dim_, it->second.data(), dim_ * sizeof(float));
      }
    }
  }
  void FindOrInsert(absl::Span<const uint64_t> keys, float* out) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto [it, inserted] = map_.try_emplace(keys[i]);
      if (inserted) {
        it->second.assign(2 * dim_, 0.01f);
        std::fill(it->second.begin() + dim_, it->second.end(), 0.1f);
      }
      memcpy(out + i * dim_, it->second.data(), dim_ * sizeof(float));
    }
  }
  void Adagrad(absl::Span<const uint64_t> keys, const float* grads, float lr) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto& row = map_[keys[i]];
      if (row.empty()) row.assign(2 * dim_, 0.1f);
      for (uint32_t j = 0; j < dim_; ++j) {
        const float g = grads[i * dim_ + j];
        row[dim_ + j] += g * g;
        row[j] -= lr * g / (std::sqrt(row[dim_ + j]) + 1e-7f);
      }
    }
  }

 private:
  uint32_t dim_;
  std::mutex mu_;
  absl::flat_hash_map<uint64_t, std::vector<float>> map_;
};

}  // namespace ember::bench
