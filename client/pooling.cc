#include "client/pooling.h"

#include <cmath>
#include <cstring>

namespace ember {

float CombinerScale(absl::Span<const float> weights, int64_t begin, int64_t end,
                    Combiner combiner) {
  if (combiner == Combiner::kSum) return 1.0f;
  float sum = 0;
  for (int64_t j = begin; j < end; ++j) {
    const float w = weights.empty() ? 1.0f : weights[j];
    sum += combiner == Combiner::kMean ? w : w * w;
  }
  if (sum == 0) return 0.0f;
  return combiner == Combiner::kMean ? 1.0f / sum : 1.0f / std::sqrt(sum);
}

void PoolForward(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                 absl::Span<const float> weights, Combiner combiner, const float* rows,
                 uint32_t dim, float* pooled) {
  const size_t batch = offsets.size() - 1;
  memset(pooled, 0, batch * dim * sizeof(float));
  for (size_t i = 0; i < batch; ++i) {
    float* out = pooled + i * dim;
    for (int64_t j = offsets[i]; j < offsets[i + 1]; ++j) {
      const float w = weights.empty() ? 1.0f : weights[j];
      const float* row = rows + size_t{inverse[j]} * dim;
      for (uint32_t d = 0; d < dim; ++d) out[d] += w * row[d];
    }
    const float scale = CombinerScale(weights, offsets[i], offsets[i + 1], combiner);
    if (scale != 1.0f) {
      for (uint32_t d = 0; d < dim; ++d) out[d] *= scale;
    }
  }
}

void PoolBackward(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                  absl::Span<const float> weights, Combiner combiner, const float* d_pooled,
                  uint32_t dim, float* d_rows) {
  const size_t batch = offsets.size() - 1;
  for (size_t i = 0; i < batch; ++i) {
    const float scale = CombinerScale(weights, offsets[i], offsets[i + 1], combiner);
    const float* g = d_pooled + i * dim;
    for (int64_t j = offsets[i]; j < offsets[i + 1]; ++j) {
      const float c = (weights.empty() ? 1.0f : weights[j]) * scale;
      float* out = d_rows + size_t{inverse[j]} * dim;
      for (uint32_t d = 0; d < dim; ++d) out[d] += c * g[d];
    }
  }
}

}  // namespace ember
