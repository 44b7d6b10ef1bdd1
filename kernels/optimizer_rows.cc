#include "kernels/optimizer_rows.h"

#include <cstring>
#include <algorithm>
#include <cstdint>

#include "common/vector_dispatch.h"
#include "kernels/row_policy.h"

namespace ember::opt {

namespace {

// Gradient j of a row at any address: memcpy compiles to the same
// unaligned vector loads as an aligned float array would.
inline float GradAt(const void* __restrict g, size_t j) {
  float x;
  memcpy(&x, static_cast<const char*>(g) + j * sizeof(float), sizeof(float));
  return x;
}

// The rule over a row, one function (and one set of vector clones) per
// rule, so that the dispatch on the kind happens once, before the ifunc
// picks the clone. Each state slot is its own restrict pointer, so that the
// compiler needs no run-time alias check between them; s1 is null for
// rules with fewer than two slots.
template <typename Rule>
EMBER_VECTOR_CLONES void RuleOverRow(const OptimizerConfig& c, float step_size,
                                     const void* __restrict g, float* __restrict w,
                                     float* __restrict s0, float* __restrict s1, size_t n) {
  static_assert(Rule::kStateSlots <= 2, "a rule with more slots needs its pointers here");
  // The config is copied so that the compiler knows no store to a row changes
  // it (it would otherwise reload it per element and not vectorise).
  const OptimizerConfig o = c;
  for (size_t j = 0; j < n; ++j) {
    float s[row::kMaxStateSlots] = {};
    if constexpr (Rule::kStateSlots > 0) s[0] = s0[j];
    if constexpr (Rule::kStateSlots > 1) s[1] = s1[j];
    Rule::Update(o, step_size, GradAt(g, j), w[j], s);
    if constexpr (Rule::kStateSlots > 0) s0[j] = s[0];
    if constexpr (Rule::kStateSlots > 1) s1[j] = s[1];
  }
}

}  // namespace

void UpdateRow(const OptimizerConfig& c, float step_size, const void* g, float* w, float* state,
               size_t n) {
  row::VisitOptimizer(c.kind, [&](auto rule) {
    using Rule = decltype(rule);
    RuleOverRow<Rule>(c, step_size, g, w, state, Rule::kStateSlots > 1 ? state + n : nullptr, n);
  });
}

void StepStoredRow(const OptimizerConfig& c, DType storage, const void* g, float* w,
                   float* state, uint32_t* step, size_t n) {
  uint32_t no_step = 0;
  const float step_size = row::AdvanceStep(c, step != nullptr ? *step : no_step);
  UpdateRow(c, step_size, g, w, state, n);
  if (storage == DType::kFp32) return;
  // The store keeps the row as `storage`: the same conversion there and
  // back, in pieces on the stack (no thread_local: the trainer's library
  // is also a shared object, libember_c.so).
  constexpr size_t kPiece = 256;
  uint16_t stored[kPiece];
  for (size_t i = 0; i < n; i += kPiece) {
    const size_t m = std::min(kPiece, n - i);
    ConvertElements(w + i, DType::kFp32, stored, storage, m);
    ConvertElements(stored, storage, w + i, DType::kFp32, m);
  }
}

}  // namespace ember::opt
