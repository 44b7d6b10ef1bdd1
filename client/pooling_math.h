// Per-element pooling math that host (client/pooling.cc) and device
// (client/cuda/device_step.cu) code both compile, so that the two paths
// add the same terms in the same order and give the same floats (the CUDA
// file is compiled without FMA contraction).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.h"
#include "ember/batch.h"

namespace ember::pool {

// The factor example [begin, end) is scaled by: 1, 1 / sum w, or
// 1 / sqrt(sum w^2); 0 when that sum is 0. `weights` null means all 1.
EMBER_HD float CombinerScale(const float* weights, int64_t begin, int64_t end, Combiner c) {
  if (c == Combiner::kSum) return 1.0f;
  float sum = 0;
  for (int64_t j = begin; j < end; ++j) {
    const float w = weights == nullptr ? 1.0f : weights[j];
    sum += c == Combiner::kMean ? w : w * w;
  }
  if (sum == 0) return 0.0f;
  return c == Combiner::kMean ? 1.0f / sum : 1.0f / sqrtf(sum);
}

// Element d of example i's pooled row: sum over its ids j, in order, of
// w_j * rows[inverse[j], d], then times the combiner's scale.
EMBER_HD float PooledElement(const int64_t* offsets, const uint32_t* inverse,
                             const float* weights, Combiner c, const float* rows, uint32_t dim,
                             int64_t i, uint32_t d) {
  float acc = 0.0f;
  for (int64_t j = offsets[i]; j < offsets[i + 1]; ++j) {
    const float w = weights == nullptr ? 1.0f : weights[j];
    acc += w * rows[static_cast<uint64_t>(inverse[j]) * dim + d];
  }
  const float scale = CombinerScale(weights, offsets[i], offsets[i + 1], c);
  return scale != 1.0f ? acc * scale : acc;
}

// The coefficient of id j of example i in the backward pass: d(pooled_i) /
// d(row of id j) = w_j * scale_i.
EMBER_HD float BackwardCoefficient(const float* weights, int64_t j, float scale) {
  return (weights == nullptr ? 1.0f : weights[j]) * scale;
}

}  // namespace ember::pool
