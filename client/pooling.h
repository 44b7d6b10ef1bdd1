// Pooling of one feature's rows into [batch, dim] and its backward pass, on
// the host. The device path implements the same contract in CUDA.
//
// `offsets` (batch + 1) and `weights` (empty or one per id) are as in
// FeatureBatch; `inverse[j]` is the index of id j's row among the table's
// unique rows. All buffers are host memory, row-major fp32.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "ember/batch.h"

namespace ember {

// pooled[i, :] = combine over the ids j of example i of rows[inverse[j], :].
// pooled holds (offsets.size() - 1) * dim floats; it is overwritten.
void PoolForward(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                 absl::Span<const float> weights, Combiner combiner, const float* rows,
                 uint32_t dim, float* pooled);

// PoolForward with each unique row given by address: rows_at[inverse[j]]
// points at id j's row, dim floats at any alignment (a row in gRPC's receive
// buffer). The bits equal PoolForward's over the same rows.
void PoolForwardAt(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                   absl::Span<const float> weights, Combiner combiner, const char* const* rows_at,
                   uint32_t dim, float* pooled);

// The gradient of PoolForward: for every id j of example i, adds
// (w_j * scale_i) * d_pooled[i, :] to d_rows[inverse[j], :], visiting
// examples and ids in order (so the sum over duplicates is deterministic).
void PoolBackward(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                  absl::Span<const float> weights, Combiner combiner, const float* d_pooled,
                  uint32_t dim, float* d_rows);

// PoolBackward into a buffer that need not be zeroed first: rows
// [0, *written) hold sums so far and are added to; rows from *written up to
// the highest id of this call are zeroed first, and *written advances past
// them. The bits equal PoolBackward's into zeroed rows. After the last
// call, rows [*written, rows) were never touched and are the caller's to
// zero.
void PoolBackwardInto(absl::Span<const int64_t> offsets, absl::Span<const uint32_t> inverse,
                      absl::Span<const float> weights, Combiner combiner, const float* d_pooled,
                      uint32_t dim, float* d_rows, uint32_t* written);

// sums[to[u]][0, dim) += rows[u, :] for u in order: one rank's gradients
// into a node's sums (StepMerger), which may lie anywhere (the merger's lie
// in the push requests themselves). `rows` holds to.size() x dim floats and
// must not overlap any sum row. With `fresh` (one flag per sum row), a sum
// row whose flag is set is written instead (0 + row: the bits of adding
// into zeros) and its flag cleared, so that sums need not be zeroed first.
void ScatterAddRows(absl::Span<const uint32_t> to, const float* rows, uint32_t dim,
                    float* const* sums, uint8_t* fresh = nullptr);

// The factor example [begin, end) is scaled by: 1, 1 / sum w, or
// 1 / sqrt(sum w^2); 0 when that sum is 0.
float CombinerScale(absl::Span<const float> weights, int64_t begin, int64_t end,
                    Combiner combiner);

}  // namespace ember
