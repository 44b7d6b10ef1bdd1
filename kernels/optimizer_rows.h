// Optimizer updates over a whole row: the loops of kernels/optimizer_math.h's
// per-element steps, vectorised and dispatched at run time
// (common/vector_dispatch.h). Each element gets exactly the per-element
// function's expression, so results are bit-identical to calling it element
// by element (and to the CUDA store, which does).
//
// All arrays are host memory, fp32, `n` elements, and must not overlap. The
// gradients `g` may sit at any address (a shard reads a push's rows where
// they arrived off the network); the rows and state are float-aligned.
#pragma once

#include <cstddef>

#include "kernels/table_config.h"

namespace ember::opt {

void SgdRow(const OptimizerConfig& c, const void* g, float* w, size_t n);
void AdagradRow(const OptimizerConfig& c, const void* g, float* w, float* acc, size_t n);
void AdamRow(const OptimizerConfig& c, float step_size, const void* g, float* w, float* m,
             float* v, size_t n);
void FtrlRow(const OptimizerConfig& c, const void* g, float* w, float* z, float* sq, size_t n);

}  // namespace ember::opt
