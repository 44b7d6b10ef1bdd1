#include "client/pooling.h"

#include <algorithm>
#include <cstring>

#include "client/pooling_math.h"
#include "common/fixed_width.h"
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

// Rows of a fixed width go through GCC's vector extension, 8 floats at a
// time: each clone lowers a vector to its own ISA (one AVX2 or AVX-512
// register, two SSE ones on the baseline). The operations are element-wise
// IEEE adds and multiplies, so the bits are the scalar loop's. Loads and
// stores go through memcpy: rows may sit at any alignment. Vectors are
// never passed by value, so none crosses a call at the baseline ABI.
// (Vectors of 16 floats were slower at dim 32 on AVX-512 in
// bench/pooling_bench, and no faster at dim 128.)
template <uint32_t kLanes>
struct Floats {
  typedef float Vector __attribute__((vector_size(kLanes * sizeof(float))));
};

template <bool kSet, typename T, uint32_t kDim>
inline void ScaledRow(float a, const T* __restrict x, float* __restrict y, Width<kDim>) {
  constexpr uint32_t kLanes = 8;
  static_assert(kDim % kLanes == 0);
  using V = typename Floats<kLanes>::Vector;
  const char* xb = reinterpret_cast<const char*>(x);
  for (uint32_t d = 0; d < kDim; d += kLanes) {
    V xv, yv = {};
    memcpy(&xv, xb + size_t{d} * sizeof(float), sizeof(V));
    if (!kSet) memcpy(&yv, y + d, sizeof(V));
    yv = yv + a * xv;
    memcpy(y + d, &yv, sizeof(V));
  }
}
template <bool kSet, typename T>
inline void ScaledRow(float a, const T* __restrict x, float* __restrict y, uint32_t n) {
  for (uint32_t d = 0; d < n; ++d) y[d] = (kSet ? 0.0f : y[d]) + a * Element(x, d);
}

// y += a * x over one row; inlined into each clone of the passes below.
template <typename T, typename D>
inline void AddScaledRow(float a, const T* __restrict x, float* __restrict y, D n) {
  ScaledRow</*kSet=*/false>(a, x, y, n);
}

// y = 0 + a * x: AddScaledRow into a zeroed row, in one pass. The add of
// 0.0f stays (it turns -0 into +0), so the bits are the zeroed form's.
template <typename T, typename D>
inline void SetScaledRow(float a, const T* __restrict x, float* __restrict y, D n) {
  ScaledRow</*kSet=*/true>(a, x, y, n);
}

// PoolForward's loop over rows found by row_at(u), the address of unique
// row u (const float* or const char*).
template <typename RowAt, typename D>
inline void PoolForwardRows(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                            const float* w, Combiner combiner, RowAt row_at, D dim,
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
  WithWidth(dim, [&](auto d) EMBER_ALWAYS_INLINE {
    PoolForwardRows(offsets, inverse, WeightsOrNull(weights), combiner,
                    [rows, d](uint32_t u) { return rows + size_t{u} * d; }, d, pooled);
  });
}

EMBER_VECTOR_CLONES
void PoolForwardAt(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                   absl::Span<const float> weights, Combiner combiner, const char* const* rows_at,
                   uint32_t dim, float* pooled) {
  WithWidth(dim, [&](auto d) EMBER_ALWAYS_INLINE {
    PoolForwardRows(offsets, inverse, WeightsOrNull(weights), combiner,
                    [rows_at](uint32_t u) { return rows_at[u]; }, d, pooled);
  });
}

namespace {
// PoolBackward's loop; with `written`, rows at and past *written are
// written (0 + term) on first touch instead of added to.
template <typename D>
inline void PoolBackwardRows(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                             const float* w, Combiner combiner, const float* d_pooled,
                             D dim, float* d_rows, uint32_t* written) {
  if (written != nullptr) {
    // Zero the rows this call touches first, in one pass, then only add:
    // a branch per id on "first touch?" mispredicted often enough to cost
    // more than the zeroing (bench/pooling_bench). 0 + term is the bits of
    // SetScaledRow.
    uint32_t end = *written;
    for (const uint32_t u : inverse) end = std::max(end, u + 1);
    if (end > *written) {
      memset(d_rows + size_t{*written} * dim, 0, size_t{end - *written} * dim * sizeof(float));
      *written = end;
    }
  }
  const size_t batch = offsets.size() - 1;
  for (size_t i = 0; i < batch; ++i) {
    const float scale = pool::CombinerScale(w, offsets[i], offsets[i + 1], combiner);
    const float* g = d_pooled + i * dim;
    for (int64_t j = offsets[i]; j < offsets[i + 1]; ++j) {
      AddScaledRow(pool::BackwardCoefficient(w, j, scale), g, d_rows + size_t{inverse[j]} * dim,
                   dim);
    }
  }
}
}  // namespace

EMBER_VECTOR_CLONES
void PoolBackward(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                  absl::Span<const float> weights, Combiner combiner, const float* d_pooled,
                  uint32_t dim, float* d_rows) {
  WithWidth(dim, [&](auto d) EMBER_ALWAYS_INLINE {
    PoolBackwardRows(offsets, inverse, WeightsOrNull(weights), combiner, d_pooled, d, d_rows,
                     nullptr);
  });
}

EMBER_VECTOR_CLONES
void PoolBackwardInto(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                      absl::Span<const float> weights, Combiner combiner, const float* d_pooled,
                      uint32_t dim, float* d_rows, uint32_t* written) {
  WithWidth(dim, [&](auto d) EMBER_ALWAYS_INLINE {
    PoolBackwardRows(offsets, inverse, WeightsOrNull(weights), combiner, d_pooled, d, d_rows,
                     written);
  });
}

EMBER_VECTOR_CLONES
void ScatterAddRows(absl::Span<const uint32_t> to, const float* rows, uint32_t dim,
                    float* const* sums, uint8_t* fresh) {
  WithWidth(dim, [&](auto d) EMBER_ALWAYS_INLINE {
    for (size_t u = 0; u < to.size(); ++u) {
      if (fresh != nullptr && fresh[to[u]]) {
        fresh[to[u]] = 0;
        SetScaledRow(1.0f, rows + u * d, sums[to[u]], d);
      } else {
        AddScaledRow(1.0f, rows + u * d, sums[to[u]], d);
      }
    }
  });
}

}  // namespace ember
