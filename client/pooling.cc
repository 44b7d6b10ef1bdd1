#include "client/pooling.h"

#include <cstring>

#include "client/pooling_math.h"
#include "common/vector_dispatch.h"

namespace ember {
namespace {
const float* WeightsOrNull(absl::Span<const float> weights) {
  return weights.empty() ? nullptr : weights.data();
}

// Element d of a row of floats, or of a row given as bytes at any alignment
// (a row in gRPC's receive buffer).
inline float Element(const float* x, uint32_t d) { return x[d]; }
inline float Element(const char* x, uint32_t d) {
  float v;
  memcpy(&v, x + size_t{d} * sizeof(float), sizeof(float));
  return v;
}

// y += a * x over one row; inlined into each clone of the passes below.
template <typename T>
inline void AddScaledRow(float a, const T* __restrict x, float* __restrict y, uint32_t n) {
  for (uint32_t d = 0; d < n; ++d) y[d] += a * Element(x, d);
}

// y = 0 + a * x: AddScaledRow into a zeroed row, in one pass. The add of
// 0.0f stays (it turns -0 into +0), so the bits are the zeroed form's.
template <typename T>
inline void SetScaledRow(float a, const T* __restrict x, float* __restrict y, uint32_t n) {
  for (uint32_t d = 0; d < n; ++d) y[d] = 0.0f + a * Element(x, d);
}

// PoolForward's loop over rows found by row_at(u), the address of unique
// row u (const float* or const char*).
template <typename RowAt>
inline void PoolForwardRows(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                            const float* w, Combiner combiner, RowAt row_at, uint32_t dim,
                            float* pooled) {
  // Row at a time (one pass over each example's ids), adding the same terms
  // in the same order as pool::PooledElement, the device's per-element form.
  const size_t batch = offsets.size() - 1;
  for (size_t i = 0; i < batch; ++i) {
    float* out = pooled + i * dim;
    if (offsets[i] == offsets[i + 1]) {
      memset(out, 0, dim * sizeof(float));
      continue;
    }
    for (int64_t j = offsets[i]; j < offsets[i + 1]; ++j) {
      const float wj = w == nullptr ? 1.0f : w[j];
      const auto* row = row_at(inverse[j]);
      if (j == offsets[i]) {
        SetScaledRow(wj, row, out, dim);
      } else {
        AddScaledRow(wj, row, out, dim);
      }
    }
    const float scale = pool::CombinerScale(w, offsets[i], offsets[i + 1], combiner);
    if (scale != 1.0f) {
      for (uint32_t d = 0; d < dim; ++d) out[d] *= scale;
    }
  }
}
}  // namespace

float CombinerScale(absl::Span<const float> weights, int64_t begin, int64_t end,
                    Combiner combiner) {
  return pool::CombinerScale(WeightsOrNull(weights), begin, end, combiner);
}

EMBER_VECTOR_CLONES
void PoolForward(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                 absl::Span<const float> weights, Combiner combiner, const float* rows,
                 uint32_t dim, float* pooled) {
  PoolForwardRows(offsets, inverse, WeightsOrNull(weights), combiner,
                  [rows, dim](uint32_t u) { return rows + size_t{u} * dim; }, dim, pooled);
}

EMBER_VECTOR_CLONES
void PoolForwardAt(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                   absl::Span<const float> weights, Combiner combiner, const char* const* rows_at,
                   uint32_t dim, float* pooled) {
  PoolForwardRows(offsets, inverse, WeightsOrNull(weights), combiner,
                  [rows_at](uint32_t u) { return rows_at[u]; }, dim, pooled);
}

namespace {
// PoolBackward's loop; with `written`, rows at and past *written are
// written (0 + term) on first touch instead of added to.
inline void PoolBackwardRows(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                             const float* w, Combiner combiner, const float* d_pooled,
                             uint32_t dim, float* d_rows, uint32_t* written) {
  const size_t batch = offsets.size() - 1;
  for (size_t i = 0; i < batch; ++i) {
    const float scale = pool::CombinerScale(w, offsets[i], offsets[i + 1], combiner);
    const float* g = d_pooled + i * dim;
    for (int64_t j = offsets[i]; j < offsets[i + 1]; ++j) {
      const float c = pool::BackwardCoefficient(w, j, scale);
      const uint32_t u = inverse[j];
      float* out = d_rows + size_t{u} * dim;
      if (written != nullptr && u >= *written) {
        // Rows skipped over start at zero (none, when ids come in
        // first-occurrence order, as deduplication numbers them).
        memset(d_rows + size_t{*written} * dim, 0, size_t{u - *written} * dim * sizeof(float));
        SetScaledRow(c, g, out, dim);
        *written = u + 1;
      } else {
        AddScaledRow(c, g, out, dim);
      }
    }
  }
}
}  // namespace

EMBER_VECTOR_CLONES
void PoolBackward(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                  absl::Span<const float> weights, Combiner combiner, const float* d_pooled,
                  uint32_t dim, float* d_rows) {
  PoolBackwardRows(offsets, inverse, WeightsOrNull(weights), combiner, d_pooled, dim, d_rows,
                   nullptr);
}

EMBER_VECTOR_CLONES
void PoolBackwardInto(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                      absl::Span<const float> weights, Combiner combiner, const float* d_pooled,
                      uint32_t dim, float* d_rows, uint32_t* written) {
  PoolBackwardRows(offsets, inverse, WeightsOrNull(weights), combiner, d_pooled, dim, d_rows,
                   written);
}

EMBER_VECTOR_CLONES
void ScatterAddRows(absl::Span<const uint32_t> to, const float* rows, uint32_t dim,
                    float* const* sums, uint8_t* fresh) {
  for (size_t u = 0; u < to.size(); ++u) {
    if (fresh != nullptr && fresh[to[u]]) {
      fresh[to[u]] = 0;
      SetScaledRow(1.0f, rows + u * dim, sums[to[u]], dim);
    } else {
      AddScaledRow(1.0f, rows + u * dim, sums[to[u]], dim);
    }
  }
}

}  // namespace ember
