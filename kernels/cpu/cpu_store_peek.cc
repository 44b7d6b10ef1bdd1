// CpuStore::PeekImpl: rows with their optimizer state, read without any
// effect on the table (the trainer's early fetch at s = 0).
#include <algorithm>
#include <cstring>

#include "common/key_hash.h"
#include "common/prefetch.h"
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
  const size_t sub = cpu_detail::SubBatchKeys(value_bytes_ + state_floats_ * sizeof(float));
  // Keys grouped by stripe, each stripe under its reader lock once: pushes
  // write a row and its state under the writer lock, so both are read
  // whole. The staged find of a lookup (CandidateRows), then the copy.
  for (size_t base = 0; base < keys.size(); base += sub) {
    const size_t count = std::min(sub, keys.size() - base);
    Batch b;
    GroupByStripe(keys, base, count, &b);
    PrefetchIndexLines(b, 0);
    for (uint32_t si = 0; si < num_stripes_; ++si) {
      const uint32_t begin = b.offsets[si], end = b.offsets[si + 1];
      if (begin == end) continue;
      const Stripe& s = stripes_[si];
      ReaderLock lock(&s.mu);
      CandidateRows(s, b, si, stride_);
      if (si + 1 < num_stripes_) PrefetchIndexLines(b, si + 1);
      for (uint32_t k = begin; k < end; ++k) {
        const Slot& slot = b.slots[k];
        const size_t i = slot.pos;
        const uint32_t row = ConfirmedRow(s, slot, keys[i]);
        float* values = out.values.data() + i * dim_;
        float* state = state_floats_ > 0 ? out.state.data() + i * state_floats_ : nullptr;
        out.stored[i] = row != kNoRow ? 1 : 0;
        if (row != kNoRow) {
          uint8_t* rec = Record(s, row);
          CopyOut(rec, DType::kFp32, reinterpret_cast<uint8_t*>(values));
          if (state_floats_ > 0) memcpy(state, rec + state_offset_, state_floats_ * sizeof(float));
          if (has_step_) out.steps[i] = *StepOf(rec);
          continue;
        }
        InitialRowOut(keys[i], DType::kFp32, reinterpret_cast<uint8_t*>(values));
        for (size_t j = 0; j < slots; ++j) {
          std::fill(state + j * dim_, state + (j + 1) * dim_,
                    row::InitialState(o, static_cast<uint32_t>(j)));
        }
        if (has_step_) out.steps[i] = 0;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ember
