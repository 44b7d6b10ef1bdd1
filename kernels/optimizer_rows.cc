#include "kernels/optimizer_rows.h"

#include <cstring>

#include "common/vector_dispatch.h"
#include "kernels/optimizer_math.h"

namespace ember::opt {

namespace {

// Gradient j of a row at any address: memcpy compiles to the same
// unaligned vector loads as an aligned float array would.
inline float GradAt(const void* __restrict g, size_t j) {
  float x;
  memcpy(&x, static_cast<const char*>(g) + j * sizeof(float), sizeof(float));
  return x;
}

}  // namespace

// The config is copied so that the compiler knows no store to a row changes
// it (it would otherwise reload it per element and not vectorise).

EMBER_VECTOR_CLONES
void SgdRow(const OptimizerConfig& c, const void* __restrict g, float* __restrict w, size_t n) {
  const OptimizerConfig o = c;
  for (size_t j = 0; j < n; ++j) Sgd(o, GradAt(g, j), w[j]);
}

EMBER_VECTOR_CLONES
void AdagradRow(const OptimizerConfig& c, const void* __restrict g, float* __restrict w,
                float* __restrict acc, size_t n) {
  const OptimizerConfig o = c;
  for (size_t j = 0; j < n; ++j) Adagrad(o, GradAt(g, j), w[j], acc[j]);
}

EMBER_VECTOR_CLONES
void AdamRow(const OptimizerConfig& c, float step_size, const void* __restrict g,
             float* __restrict w, float* __restrict m, float* __restrict v, size_t n) {
  const OptimizerConfig o = c;
  for (size_t j = 0; j < n; ++j) Adam(o, step_size, GradAt(g, j), w[j], m[j], v[j]);
}

EMBER_VECTOR_CLONES
void FtrlRow(const OptimizerConfig& c, const void* __restrict g, float* __restrict w,
             float* __restrict z, float* __restrict sq, size_t n) {
  const OptimizerConfig o = c;
  for (size_t j = 0; j < n; ++j) Ftrl(o, GradAt(g, j), w[j], z[j], sq[j]);
}

}  // namespace ember::opt
