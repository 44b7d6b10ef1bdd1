// CpuStore's bulk and cold paths: erase, export, import, snapshots (full and
// delta), reservation and TTL expiry. The hot paths are in cpu_store.cc.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/key_hash.h"
#include "common/prefetch.h"
#include "kernels/cpu/cpu_store.h"
#include "kernels/cpu/cpu_store_layout.h"

namespace ember {

using namespace cpu_detail;  // the layout of kernels/cpu/cpu_store_layout.h

template <typename Fn>
void CpuStore::ForEachKeyLocked(absl::Span<const uint64_t> keys, Fn fn) {
  const size_t sub = SubBatchKeys(0);
  for (size_t base = 0; base < keys.size(); base += sub) {
    Batch b;
    GroupByStripe(keys, base, std::min(sub, keys.size() - base), &b);
    for (uint32_t si = 0; si < num_stripes_; ++si) {
      const uint32_t begin = b.offsets[si], end = b.offsets[si + 1];
      if (begin == end) continue;
      Stripe& s = stripes_[si];
      WriterLock lock(&s.mu);
      // Request every key's index line before the first probe, so that the
      // misses overlap (a restore inserts millions of keys through here).
      if (s.index) {
        for (uint32_t k = begin; k < end; ++k) Prefetch(&s.index[b.slots[k].hash & s.index_mask]);
      }
      for (uint32_t k = begin; k < end; ++k) fn(s, b.slots[k]);
    }
  }
}

absl::StatusOr<size_t> CpuStore::EraseImpl(absl::Span<const uint64_t> keys) {
  size_t erased = 0;
  ForEachKeyLocked(keys, [&](Stripe& s, const Slot& slot) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const uint32_t r = FindRow(s, keys[slot.pos], slot.hash);
    if (r == kNoRow) return;
    RemoveRow(s, r);
    ++erased;
  });
  return erased;
}

void CpuStore::AppendRow(const uint8_t* record, ExportedRows* out) const {
  out->keys.push_back(RecordKey(record));
  const size_t v = out->values.size();
  out->values.resize(v + dim_);
  ConvertElements(record + value_offset_, dtype_, out->values.data() + v, DType::kFp32, dim_);
  const float* state = reinterpret_cast<const float*>(record + state_offset_);
  out->state.insert(out->state.end(), state, state + state_floats_);
  out->steps.push_back(has_step_ ? *StepOf(const_cast<uint8_t*>(record)) : 0);
  out->scores.push_back(
      std::atomic_ref<uint32_t>(*ScoreOf(const_cast<uint8_t*>(record))).load(std::memory_order_relaxed));
}

absl::Status CpuStore::ExportImpl(ExportCursor* cursor, size_t max_rows, ExportedRows* out) {
  uint32_t si = static_cast<uint32_t>(cursor->position >> 32);
  uint32_t row = static_cast<uint32_t>(cursor->position);
  while (si < num_stripes_ && out->keys.size() < max_rows) {
    Stripe& s = stripes_[si];
    ReaderLock lock(&s.mu);
    for (; row < s.size && out->keys.size() < max_rows; ++row) AppendRow(Record(s, row), out);
    if (row >= s.size) {
      ++si;
      row = 0;
    }
  }
  cursor->position = (static_cast<uint64_t>(si) << 32) | row;
  cursor->done = si >= num_stripes_;
  return absl::OkStatus();
}

absl::Status CpuStore::ImportImpl(const ExportedRows& rows) {
  size_t failed = 0;
  ForEachKeyLocked(rows.keys, [&](Stripe& s, const Slot& slot) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const uint64_t key = rows.keys[slot.pos];
    uint32_t r = FindRow(s, key, slot.hash);
    if (r == kNoRow) r = InsertRow(s, key, slot.hash, /*initialize=*/false);
    if (r == kNoRow) {
      ++failed;
      return;
    }
    uint8_t* rec = Record(s, r);
    ConvertElements(rows.values.data() + slot.pos * dim_, DType::kFp32, rec + value_offset_,
                    dtype_, dim_);
    std::copy_n(rows.state.data() + slot.pos * state_floats_, state_floats_,
                reinterpret_cast<float*>(rec + state_offset_));
    if (has_step_) *StepOf(rec) = rows.steps[slot.pos];
    *ScoreOf(rec) = rows.scores[slot.pos];
    MarkChanged(s, r, key);
  });
  if (failed > 0) {
    return TableFullError(config(), failed, "imported rows not inserted");
  }
  return absl::OkStatus();
}

absl::Status CpuStore::SnapshotImpl(SnapshotKind kind, ExportCursor* cursor, size_t max_rows,
                                    SnapshotBatch* out) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  std::lock_guard<std::mutex> one_snapshot(snapshot_mu_);
  if (kind == SnapshotKind::kDelta && !tracking_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", config().name, "': no snapshot was taken before, so no changes are tracked; "
        "take a full snapshot"));
  }
  // Tracking starts before the first stripe is copied: a stripe changed
  // after its copy is marked, one changed before it is in the copy.
  if (kind == SnapshotKind::kFull) tracking_.store(true, std::memory_order_release);
  uint32_t si = static_cast<uint32_t>(cursor->position);
  for (; si < num_stripes_ && out->rows.keys.size() < max_rows; ++si) {
    Stripe& s = stripes_[si];
    // A shared lock: lookups of the stripe go on during its copy, inserts
    // and pushes wait. The change-tracking state is written here under the
    // shared lock; that is safe because every other writer of it holds the
    // lock exclusively, readers never touch it, and snapshot_mu_ keeps
    // snapshots apart.
    ReaderLock lock(&s.mu);
    ExportedRows& rows = out->rows;
    if (kind == SnapshotKind::kFull) {
      // Sized once and filled in place: a full copy runs at memory speed,
      // and pushes are held while it runs.
      const size_t base = rows.keys.size();
      const size_t n = s.size;
      rows.keys.resize(base + n);
      rows.values.resize((base + n) * dim_);
      rows.state.resize((base + n) * state_floats_);
      rows.steps.resize(base + n);
      rows.scores.resize(base + n);
      for (size_t r = 0; r < n; ++r) {
        const uint8_t* rec = Record(s, static_cast<uint32_t>(r));
        const size_t i = base + r;
        rows.keys[i] = RecordKey(rec);
        // Pointers, not operator[]: SGD rows have no state (an empty vector).
        float* values = rows.values.data() + i * dim_;
        if (dtype_ == DType::kFp32) {
          memcpy(values, rec + value_offset_, value_bytes_);
        } else {
          ConvertElements(rec + value_offset_, dtype_, values, DType::kFp32, dim_);
        }
        if (state_floats_ != 0) {
          memcpy(rows.state.data() + i * state_floats_, rec + state_offset_,
                 state_floats_ * sizeof(float));
        }
        rows.steps[i] = has_step_ ? *StepOf(const_cast<uint8_t*>(rec)) : 0;
        rows.scores[i] = std::atomic_ref<uint32_t>(*ScoreOf(const_cast<uint8_t*>(rec)))
                             .load(std::memory_order_relaxed);
      }
      std::fill(s.dirty.begin(), s.dirty.end(), 0);
    } else {
      const size_t removed_before = out->removed.size();
      for (const uint64_t key : s.changed) {
        const uint32_t r = FindRow(s, key, StoreHash(key));
        if (r == kNoRow) {
          out->removed.push_back(key);
          continue;
        }
        if ((r >> 6) >= s.dirty.size()) continue;  // never marked: a repeat
        uint64_t& word = s.dirty[r >> 6];
        const uint64_t bit = uint64_t{1} << (r & 63);
        if ((word & bit) == 0) continue;  // a repeat, already copied
        word &= ~bit;
        AppendRow(Record(s, r), &rows);
      }
      auto removed = out->removed.begin() + static_cast<std::ptrdiff_t>(removed_before);
      std::sort(removed, out->removed.end());
      out->removed.erase(std::unique(removed, out->removed.end()), out->removed.end());
    }
    s.changed.clear();
    if (s.changed.capacity() > 4096) s.changed.shrink_to_fit();
  }
  cursor->position = si;
  cursor->done = si >= num_stripes_;
  return absl::OkStatus();
}

void CpuStore::Reserve(uint64_t rows) {
  // Keys spread evenly over stripes by hash; a little slack for the spread.
  const uint64_t per_stripe = rows / num_stripes_ + rows / num_stripes_ / 16 + 16;
  for (uint32_t si = 0; si < num_stripes_; ++si) {
    Stripe& s = stripes_[si];
    WriterLock lock(&s.mu);
    const uint64_t want = std::min<uint64_t>(s.size + per_stripe, s.capacity);
    const size_t index_size = s.index ? s.index_mask + 1 : 0;
    const size_t needed = std::bit_ceil(std::max<size_t>(kMinIndexSize, (want * 4 + 2) / 3 + 1));
    if (needed > index_size) GrowIndex(s, needed);
    s.chunks.reserve((want >> chunk_shift_) + 1);
  }
}

void CpuStore::SetTtlTime(uint32_t now) { ttl_now_.store(now, std::memory_order_relaxed); }

absl::StatusOr<uint64_t> CpuStore::EvictExpired(uint32_t older_than) {
  if (!has_ttl_) return EmbeddingStore::EvictExpired(older_than);
  uint64_t evicted = 0;
  for (uint32_t si = 0; si < num_stripes_; ++si) {
    Stripe& s = stripes_[si];
    WriterLock lock(&s.mu);
    // Downwards: removing row r moves the last row (already checked) into r.
    for (uint32_t r = s.size; r-- > 0;) {
      const uint8_t* rec = Record(s, r);
      uint32_t touched;
      memcpy(&touched, rec + ttl_offset_, 4);
      if (touched < older_than) {
        RemoveRow(s, r);
        ++evicted;
      }
    }
  }
  expired_.fetch_add(evicted, std::memory_order_relaxed);
  return evicted;
}

}  // namespace ember
