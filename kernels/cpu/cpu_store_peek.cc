// CpuStore::PeekImpl: rows with their optimizer state, read without any
// effect on the table (the trainer's early fetch at s = 0).
#include <algorithm>
#include <cstring>

#include "common/key_hash.h"
#include "kernels/cpu/cpu_store.h"
#include "kernels/cpu/cpu_store_layout.h"
#include "kernels/initializer_math.h"
#include "kernels/row_policy.h"

namespace ember {

using cpu_detail::kNoRow;
using cpu_detail::StepOf;

absl::Status CpuStore::PeekImpl(absl::Span<const uint64_t> keys, const PeekedRows& out) {
  const size_t slots = state_floats_ / dim_;
  const OptimizerConfig& o = config().optimizer;
  // One key at a time under its stripe's reader lock: pushes write rows
  // under the writer lock, so a row and its state are read whole. The
  // early fetch runs while the trainer computes, off its critical path.
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t hash = StoreHash(keys[i]);
    const Stripe& s = stripes_[StripeOf(hash)];
    float* values = out.values.data() + i * dim_;
    float* state = out.state.data() + i * state_floats_;
    uint32_t step = 0;
    ReaderLock lock(&s.mu);
    const uint32_t r = s.size == 0 ? kNoRow : FindRow(s, keys[i], hash);
    if (r != kNoRow) {
      const uint8_t* rec = Record(s, r);
      CopyOut(rec, DType::kFp32, reinterpret_cast<uint8_t*>(values));
      if (state_floats_ > 0) memcpy(state, rec + state_offset_, state_floats_ * sizeof(float));
      if (has_step_) memcpy(&step, StepOf(const_cast<uint8_t*>(rec)), sizeof(step));
    } else {
      InitialRowOut(keys[i], DType::kFp32, reinterpret_cast<uint8_t*>(values));
      for (size_t k = 0; k < slots; ++k) {
        std::fill(state + k * dim_, state + (k + 1) * dim_,
                  row::InitialState(o, static_cast<uint32_t>(k)));
      }
    }
    out.stored[i] = r != kNoRow ? 1 : 0;
    if (has_step_) out.steps[i] = step;
  }
  return absl::OkStatus();
}

}  // namespace ember
