// Optimizer updates over a whole row on the host: the rule of
// kernels/row_policy.h for `c.kind` applied to every element, in a loop
// vectorised and dispatched at run time (common/vector_dispatch.h). Each
// element gets exactly the rule's expression, so results are bit-identical
// to calling row::UpdateElement element by element (and to the CUDA store,
// which does).
//
// All arrays are host memory, fp32, and must not overlap: `w` is (n), the
// state (rule's kStateSlots, n), slot-major. The gradients `g` (n) may sit at
// any address (a shard reads a push's rows where they arrived off the
// network); the row and state are float-aligned. `step_size` is what
// row::AdvanceStep returned for this update (ignored by optimizers without
// a step count).
#pragma once

#include <cstddef>

#include "common/dtype.h"
#include "kernels/table_config.h"

namespace ember::opt {

void UpdateRow(const OptimizerConfig& c, float step_size, const void* g, float* w, float* state,
               size_t n);

// One push's optimizer step on one row exactly as a host store applies it,
// for a row held as fp32 outside the store (the trainer's early fetch,
// docs/client.md#early-fetch-at-s--0): the step count advanced
// (row::AdvanceStep; `step` may be null for optimizers without one), the rule
// applied (UpdateRow), and `w` rounded to `storage` precision, so that `w`,
// `state` and `step` then hold exactly what the store holds after the same
// push. `w` must hold values of `storage` precision on entry (what a lookup
// returns). `g` is n fp32 at any address.
void StepStoredRow(const OptimizerConfig& c, DType storage, const void* g, float* w,
                   float* state, uint32_t* step, size_t n);

}  // namespace ember::opt
