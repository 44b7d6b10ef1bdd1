#include "kernels/cpu/cpu_store.h"
#include "kernels/cpu/cpu_store_layout.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/rw_mutex.h"
#include "common/key_hash.h"
#include "common/prefetch.h"
#include "kernels/initializer_math.h"
#include "kernels/optimizer_rows.h"
#include "kernels/row_policy.h"

namespace ember {

using namespace cpu_detail;  // the layout of kernels/cpu/cpu_store_layout.h

absl::StatusOr<std::unique_ptr<CpuStore>> CpuStore::Create(const TableConfig& config) {
  if (absl::Status s = ValidateTableConfig(config); !s.ok()) return s;
  const uint64_t limit = static_cast<uint64_t>(kMaxStripes) * kMaxRowsPerStripe;
  if (config.capacity > limit) {
    return absl::InvalidArgumentError(absl::StrCat("table '", config.name,
                                                   "' field 'capacity': expected at most ", limit,
                                                   " rows per shard, received ", config.capacity));
  }
  return std::unique_ptr<CpuStore>(new CpuStore(config));
}

CpuStore::CpuStore(const TableConfig& config)
    : EmbeddingStore(config),
      dim_(config.dim),
      dtype_(config.dtype),
      value_bytes_(config.dim * DTypeSize(config.dtype)),
      state_floats_(config.dim * OptimizerStateFloatsPerElement(config.optimizer.kind)),
      has_step_(OptimizerHasStepCount(config.optimizer.kind)),
      has_ttl_(config.ttl.enabled()) {
  // Record: key (8) | score (4) | [step (4)] | [touched (4)] | row (padded
  // to 4) | state.
  ttl_offset_ = has_step_ ? 16 : 12;
  value_offset_ = ttl_offset_ + (has_ttl_ ? 4 : 0);
  state_offset_ = value_offset_ + ((value_bytes_ + 3) & ~size_t{3});
  stride_ = state_offset_ + state_floats_ * sizeof(float);
  // Small tables get one stripe (exact eviction order); large ones up to 64.
  // Stripes cost per request, not per row: a request's keys for one table
  // spread over all stripes, and each stripe touched costs a lock (a cache
  // miss on its mutex) and its passes. Trainer requests carry tens to a few
  // hundred keys per table, so unbounded tables get kUnboundedStripes, and
  // bounded ones one stripe per 8192 rows.
  if (config.capacity == 0) {
    num_stripes_ = kUnboundedStripes;
  } else {
    uint64_t want = std::max<uint64_t>(1, config.capacity / 8192);
    num_stripes_ = static_cast<uint32_t>(std::min<uint64_t>(kMaxStripes, std::bit_floor(want)));
  }
  const uint32_t bits = static_cast<uint32_t>(std::countr_zero(num_stripes_));
  stripe_shift_ = bits == 0 ? 64 : 64 - bits;
  const uint64_t per_stripe = config.capacity == 0 ? 16 * 1024 : config.capacity / num_stripes_;
  const size_t rows_per_chunk = std::clamp<size_t>(
      std::bit_floor(std::min<uint64_t>(per_stripe / 16, kMaxChunkBytes / stride_) + 1),
      kMinChunkRows, kMaxChunkRows);
  chunk_shift_ = static_cast<uint32_t>(std::countr_zero(rows_per_chunk));
  stripes_ = std::make_unique<Stripe[]>(num_stripes_);
  for (uint32_t i = 0; i < num_stripes_; ++i) {
    if (config.capacity == 0) {
      stripes_[i].capacity = kMaxRowsPerStripe;
    } else {
      uint64_t share = config.capacity / num_stripes_ + (i < config.capacity % num_stripes_ ? 1 : 0);
      stripes_[i].capacity = static_cast<uint32_t>(std::min<uint64_t>(share, kMaxRowsPerStripe));
    }
    stripes_[i].rng ^= Mix64(i + 1);
  }
  memory_bytes_ = sizeof(Stripe) * num_stripes_;
}

CpuStore::~CpuStore() = default;

uint32_t CpuStore::FindRow(const Stripe& s, uint64_t key, uint64_t hash) const
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (!s.index) return kNoRow;
  const uint32_t tag = TagOf(hash);
  for (size_t i = hash & s.index_mask;; i = (i + 1) & s.index_mask) {
    const uint32_t e = s.index[i];
    if (e == 0) return kNoRow;
    if ((e & 0xffu) == tag && RecordKey(Record(s, EntryRow(e))) == key) return EntryRow(e);
  }
}

uint32_t CpuStore::FirstCandidate(const Stripe& s, uint64_t hash) const
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const uint32_t tag = TagOf(hash);
  for (size_t i = hash & s.index_mask;; i = (i + 1) & s.index_mask) {
    const uint32_t e = s.index[i];
    if (e == 0) return kNoRow;
    if ((e & 0xffu) == tag) return EntryRow(e);
  }
}

void CpuStore::PrefetchIndexLines(const Batch& b, uint32_t stripe) const {
  const uint32_t* index = stripes_[stripe].index_view.load(std::memory_order_relaxed);
  const size_t mask = stripes_[stripe].index_mask_view.load(std::memory_order_relaxed);
  if (!index) return;
  for (uint32_t k = b.offsets[stripe]; k < b.offsets[stripe + 1]; ++k) {
    Prefetch(index + (b.slots[k].hash & mask));
  }
}

void CpuStore::CandidateRows(const Stripe& s, const Batch& b, uint32_t stripe,
                             size_t record_bytes) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const uint32_t begin = b.offsets[stripe], end = b.offsets[stripe + 1];
  if (s.size == 0) {
    for (uint32_t k = begin; k < end; ++k) b.slots[k].row = kNoRow;
    return;
  }
  // Each key's home index entry first: a tight loop of independent loads,
  // so many index misses are in flight at once.
  for (uint32_t k = begin; k < end; ++k) b.slots[k].row = s.index[b.slots[k].hash & s.index_mask];
  for (uint32_t k = begin; k < end; ++k) {
    Slot& slot = b.slots[k];
    const uint32_t e = slot.row;
    if (e == 0) {
      slot.row = kNoRow;
      continue;
    }
    slot.row = (e & 0xffu) == TagOf(slot.hash) ? EntryRow(e) : FirstCandidate(s, slot.hash);
    if (slot.row != kNoRow) PrefetchSpan(Record(s, slot.row), record_bytes);
  }
}

uint32_t CpuStore::SlotOfRow(const Stripe& s, uint64_t hash, uint32_t row) const
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  for (size_t i = hash & s.index_mask;; i = (i + 1) & s.index_mask) {
    if (s.index[i] != 0 && EntryRow(s.index[i]) == row) return static_cast<uint32_t>(i);
  }
}

void CpuStore::PlaceEntry(Stripe& s, uint64_t hash, uint32_t row) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  size_t i = hash & s.index_mask;
  while (s.index[i] != 0) i = (i + 1) & s.index_mask;
  s.index[i] = Entry(row, hash);
}

void CpuStore::GrowIndex(Stripe& s, size_t new_size) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const size_t old_size = s.index ? s.index_mask + 1 : 0;
  s.index = std::make_unique<uint32_t[]>(new_size);  // zeroed: all empty
  s.index_mask = new_size - 1;
  s.index_view.store(s.index.get(), std::memory_order_relaxed);
  s.index_mask_view.store(s.index_mask, std::memory_order_relaxed);
  for (uint32_t r = 0; r < s.size; ++r) PlaceEntry(s, StoreHash(RecordKey(Record(s, r))), r);
  memory_bytes_.fetch_add((new_size - old_size) * sizeof(uint32_t), std::memory_order_relaxed);
}

// Linear-probing deletion by backward shift: later entries of the cluster
// whose home slot is not cyclically in (slot, j] move back, so no tombstones.
void CpuStore::DeleteSlot(Stripe& s, size_t slot) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const size_t mask = s.index_mask;
  for (size_t j = (slot + 1) & mask;; j = (j + 1) & mask) {
    const uint32_t e = s.index[j];
    if (e == 0) break;
    const size_t home = StoreHash(RecordKey(Record(s, EntryRow(e)))) & mask;
    const bool stays = slot <= j ? (slot < home && home <= j) : (slot < home || home <= j);
    if (!stays) {
      s.index[slot] = e;
      slot = j;
    }
  }
  s.index[slot] = 0;
}

void CpuStore::RemoveRow(Stripe& s, uint32_t row) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  uint8_t* record = Record(s, row);
  DeleteSlot(s, SlotOfRow(s, StoreHash(RecordKey(record)), row));
  const uint32_t last = s.size - 1;
  MarkRemoved(s, row, last, RecordKey(record));
  if (row != last) {
    // Keep records dense: move the last record into the hole.
    const uint8_t* last_record = Record(s, last);
    const uint64_t last_hash = StoreHash(RecordKey(last_record));
    s.index[SlotOfRow(s, last_hash, last)] = Entry(row, last_hash);
    memcpy(record, last_record, stride_);
  }
  s.size = last;
  rows_.fetch_sub(1, std::memory_order_relaxed);
  // Free the last chunk once a whole spare chunk follows the used ones.
  const size_t rows_per_chunk = size_t{1} << chunk_shift_;
  if (s.chunks.size() >= 2 && s.size + 2 * rows_per_chunk <= s.chunks.size() * rows_per_chunk) {
    s.chunks.pop_back();
    memory_bytes_.fetch_sub(rows_per_chunk * stride_, std::memory_order_relaxed);
  }
}

void CpuStore::EvictOne(Stripe& s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const uint32_t n = s.size;
  uint32_t start = 0;
  uint32_t count = n;
  if (n > kEvictionSample) {
    s.rng ^= s.rng << 13;
    s.rng ^= s.rng >> 7;
    s.rng ^= s.rng << 17;
    start = static_cast<uint32_t>(s.rng % n);
    count = kEvictionSample;
  }
  uint32_t victim = start;
  uint32_t best = 0xffffffffu;
  for (uint32_t k = 0; k < count; ++k) {
    const uint32_t r = (start + k) % n;
    const uint32_t score = std::atomic_ref<uint32_t>(*ScoreOf(Record(s, r))).load(std::memory_order_relaxed);
    if (score < best) {
      best = score;
      victim = r;
    }
  }
  RemoveRow(s, victim);
  evictions_.fetch_add(1, std::memory_order_relaxed);
}

uint32_t CpuStore::InsertRow(Stripe& s, uint64_t key, uint64_t hash, bool initialize) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (s.size >= s.capacity) {
    if (config().eviction == EvictionPolicy::kNone || config().capacity == 0 || s.size == 0) {
      insert_failures_.fetch_add(1, std::memory_order_relaxed);
      return kNoRow;
    }
    EvictOne(s);
  }
  const size_t index_size = s.index ? s.index_mask + 1 : 0;
  if ((static_cast<size_t>(s.size) + 1) * 4 > index_size * 3) {
    GrowIndex(s, std::max(kMinIndexSize, index_size * 2));
  }
  const uint32_t row = s.size;
  const size_t rows_per_chunk = size_t{1} << chunk_shift_;
  if ((row >> chunk_shift_) >= s.chunks.size()) {
    s.chunks.push_back(std::make_unique_for_overwrite<uint8_t[]>(rows_per_chunk * stride_));
    memory_bytes_.fetch_add(rows_per_chunk * stride_, std::memory_order_relaxed);
  }
  ++s.size;
  uint8_t* record = Record(s, row);
  memcpy(record, &key, 8);
  *ScoreOf(record) = row::kUntouchedScore;
  if (has_step_) *StepOf(record) = 0;
  if (has_ttl_) {
    *reinterpret_cast<uint32_t*>(record + ttl_offset_) = ttl_now_.load(std::memory_order_relaxed);
  }
  if (initialize) InitializeRow(record, key);
  PlaceEntry(s, hash, row);
  MarkChanged(s, row, key);
  rows_.fetch_add(1, std::memory_order_relaxed);
  inserts_.fetch_add(1, std::memory_order_relaxed);
  return row;
}

void CpuStore::InitializeRow(uint8_t* record, uint64_t key) const {
  init::InitialRow(config().initializer, key, dim_, dtype_, record + value_offset_);
  float* state = reinterpret_cast<float*>(record + state_offset_);
  const OptimizerConfig& o = config().optimizer;
  const uint32_t slots = static_cast<uint32_t>(state_floats_ / dim_);
  for (uint32_t k = 0; k < slots; ++k) {
    std::fill(state + k * dim_, state + (k + 1) * dim_, row::InitialState(o, k));
  }
}

void CpuStore::MarkChanged(Stripe& s, uint32_t row, uint64_t key) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (!tracking_.load(std::memory_order_relaxed)) return;
  const size_t word = row >> 6;
  const uint64_t bit = uint64_t{1} << (row & 63);
  if (word >= s.dirty.size()) s.dirty.resize(((s.chunks.size() << chunk_shift_) >> 6) + 1, 0);
  if (s.dirty[word] & bit) return;
  s.dirty[word] |= bit;
  s.changed.push_back(key);
}

void CpuStore::MarkRemoved(Stripe& s, uint32_t row, uint32_t last, uint64_t key)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (!tracking_.load(std::memory_order_relaxed)) return;
  s.changed.push_back(key);
  // The last row moves into `row`, and its bit with it.
  auto bit_of = [&](uint32_t r) {
    return (r >> 6) < s.dirty.size() && (s.dirty[r >> 6] >> (r & 63)) & 1;
  };
  auto set_bit = [&](uint32_t r, bool on) {
    if ((r >> 6) >= s.dirty.size()) {
      if (!on) return;
      s.dirty.resize(((s.chunks.size() << chunk_shift_) >> 6) + 1, 0);
    }
    const uint64_t bit = uint64_t{1} << (r & 63);
    s.dirty[r >> 6] = on ? (s.dirty[r >> 6] | bit) : (s.dirty[r >> 6] & ~bit);
  };
  set_bit(row, bit_of(last));
  if (last != row) set_bit(last, false);
}

// Scores are written under a shared lock by concurrent readers, hence the
// relaxed atomics; an LFU increment lost to a race only blurs the count.
void CpuStore::Touch(uint8_t* record, uint32_t clock) const {
  if (has_ttl_) {
    std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(record + ttl_offset_))
        .store(ttl_now_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  // Without eviction nobody reads scores: skip the store, which would dirty
  // the record's cache line on every lookup.
  if (config().eviction == EvictionPolicy::kNone) return;
  std::atomic_ref<uint32_t> score(*ScoreOf(record));
  score.store(row::TouchedScore(config().eviction, score.load(std::memory_order_relaxed), clock),
              std::memory_order_relaxed);
}

void CpuStore::CopyOut(const uint8_t* record, DType out_dtype, uint8_t* out) const {
  if (out_dtype == dtype_) {
    CopyRowBytes(out, record + value_offset_, value_bytes_);
  } else {
    ConvertElements(record + value_offset_, dtype_, out, out_dtype, dim_);
  }
}

void CpuStore::InitialRowOut(uint64_t key, DType out_dtype, uint8_t* out) const {
  const uint64_t base = init::KeyBase(config().initializer.seed, key);
  for (uint32_t j = 0; j < dim_; ++j) {
    StoreElement(out, out_dtype, j, RoundTo(dtype_, init::Element(config().initializer, base, j)));
  }
}

void CpuStore::GroupByStripe(absl::Span<const uint64_t> keys, size_t base, size_t count,
                             Batch* batch) const {
  Scratch& sc = LocalScratch();
  sc.slots.resize(count);
  sc.offsets.assign(num_stripes_ + 1, 0);
  if (num_stripes_ == 1) {
    for (size_t i = 0; i < count; ++i) {
      sc.slots[i] = {StoreHash(keys[base + i]), static_cast<uint32_t>(base + i), kNoRow};
    }
    sc.offsets[1] = static_cast<uint32_t>(count);
  } else {
    sc.hashes.resize(count);
    uint64_t* hashes = sc.hashes.data();
    for (size_t i = 0; i < count; ++i) {
      hashes[i] = StoreHash(keys[base + i]);
      ++sc.offsets[StripeOf(hashes[i]) + 1];
    }
    for (uint32_t s = 0; s < num_stripes_; ++s) sc.offsets[s + 1] += sc.offsets[s];
    sc.cursors.assign(sc.offsets.begin(), sc.offsets.end() - 1);
    for (size_t i = 0; i < count; ++i) {
      sc.slots[sc.cursors[StripeOf(hashes[i])]++] = {hashes[i], static_cast<uint32_t>(base + i),
                                                     kNoRow};
    }
  }
  batch->slots = sc.slots.data();
  batch->offsets = sc.offsets.data();
}

absl::StatusOr<FindResult> CpuStore::FindImpl(absl::Span<const uint64_t> keys, DType out_dtype,
                                              uint8_t* out, uint8_t* found, bool insert) {
  Scratch& sc = LocalScratch();
  const size_t out_row = dim_ * DTypeSize(out_dtype);
  const uint32_t clock = clock_.fetch_add(1, std::memory_order_relaxed) + 1;
  const size_t sub = SubBatchKeys(out_row);
  FindResult result;
  size_t failed = 0;

  for (size_t base = 0; base < keys.size(); base += sub) {
    const size_t count = std::min(sub, keys.size() - base);
    Batch b;
    GroupByStripe(keys, base, count, &b);
    sc.pending.clear();
    // Three passes per stripe group, staggered (CandidateRows): the index
    // lines of the next group are requested while this one copies.
    PrefetchIndexLines(b, 0);
    for (uint32_t si = 0; si < num_stripes_; ++si) {
      const uint32_t begin = b.offsets[si], end = b.offsets[si + 1];
      if (begin == end) continue;
      Stripe& s = stripes_[si];
      ReaderLock lock(&s.mu);
      CandidateRows(s, b, si, value_offset_ + value_bytes_);
      if (si + 1 < num_stripes_) PrefetchIndexLines(b, si + 1);
      for (uint32_t k = begin; k < end; ++k) {
        const Slot& slot = b.slots[k];
        const uint64_t key = keys[slot.pos];
        const uint32_t r = ConfirmedRow(s, slot, key);
        if (r != kNoRow) {
          uint8_t* rec = Record(s, r);
          CopyOut(rec, out_dtype, out + slot.pos * out_row);
          Touch(rec, clock);
          if (found) found[slot.pos] = 1;
        } else if (insert) {
          sc.pending.push_back(k);
        } else {
          InitialRowOut(key, out_dtype, out + slot.pos * out_row);
          if (found) found[slot.pos] = 0;
          ++result.missing;
        }
      }
    }

    // Inserts, under the writer lock of each stripe that has missing keys.
    for (size_t i = 0; i < sc.pending.size();) {
      const uint32_t si = StripeOf(b.slots[sc.pending[i]].hash);
      Stripe& s = stripes_[si];
      WriterLock lock(&s.mu);
      for (; i < sc.pending.size() && StripeOf(b.slots[sc.pending[i]].hash) == si; ++i) {
        const Slot& slot = b.slots[sc.pending[i]];
        const uint64_t key = keys[slot.pos];
        uint32_t r = FindRow(s, key, slot.hash);  // a duplicate or a racing insert
        if (r == kNoRow) {
          r = InsertRow(s, key, slot.hash);
          if (r == kNoRow) {
            InitialRowOut(key, out_dtype, out + slot.pos * out_row);
            ++failed;
            continue;
          }
          ++result.missing;
        }
        uint8_t* rec = Record(s, r);
        CopyOut(rec, out_dtype, out + slot.pos * out_row);
        Touch(rec, clock);
      }
    }
  }
  if (failed > 0) {
    return TableFullError(config(), failed, "new keys not inserted");
  }
  return result;
}

void CpuStore::ApplyOptimizer(uint8_t* record, const void* grad, float* scratch) const {
  const OptimizerConfig& o = config().optimizer;
  // fp32 rows are updated in place; half-precision rows through `scratch`.
  float* w = dtype_ == DType::kFp32 ? reinterpret_cast<float*>(record + value_offset_) : scratch;
  if (w == scratch) ConvertElements(record + value_offset_, dtype_, w, DType::kFp32, dim_);
  float* state = reinterpret_cast<float*>(record + state_offset_);
  float step_size = 0.0f;
  if (has_step_) step_size = row::AdvanceStep(o, *StepOf(record));
  opt::UpdateRow(o, step_size, grad, w, state, dim_);
  if (w == scratch) ConvertElements(w, DType::kFp32, record + value_offset_, dtype_, dim_);
}

absl::StatusOr<PushResult> CpuStore::ApplyGradientsImpl(absl::Span<const uint64_t> keys,
                                                        DType grad_dtype,
                                                        const GradientRows& grads) {
  std::vector<float> g(dim_), scratch(dim_);
  const size_t grad_row = dim_ * DTypeSize(grad_dtype);
  const uint32_t clock = clock_.fetch_add(1, std::memory_order_relaxed) + 1;
  // Sub-batches must not split a key's duplicates (they are summed before
  // one step), so pushes are grouped whole.
  Batch b;
  GroupByStripe(keys, 0, keys.size(), &b);
  PushResult result;
  size_t failed = 0;

  // Writers start at different stripes so that concurrent pushes spread out
  // instead of queueing behind each other in stripe order.
  const uint32_t start = clock & (num_stripes_ - 1);
  // A push spreads over many stripes with few keys each, so the prefetching
  // runs across stripes: the index lines of the next stripe are requested
  // while this one is updated, and this stripe's records are requested,
  // under its lock, before the first of them is touched.
  PrefetchIndexLines(b, start);
  for (uint32_t i = 0; i < num_stripes_; ++i) {
    const uint32_t si = (start + i) & (num_stripes_ - 1);
    const uint32_t begin = b.offsets[si], end = b.offsets[si + 1];
    if (i + 1 < num_stripes_) PrefetchIndexLines(b, (si + 1) & (num_stripes_ - 1));
    if (begin == end) continue;
    // Duplicates must be adjacent, in request order, to be summed in a
    // fixed order: sort the stripe's keys by hash, then position, unless
    // they are surely distinct, as a trainer's deduplicated pushes are (the
    // sort was a third of this function's samples at dim 8). By hash, which
    // the slot holds (no load of the key): StoreHash is a bijection, so
    // equal hashes are equal keys.
    if (!SurelyDistinct(b.slots + begin, end - begin)) {
      std::sort(b.slots + begin, b.slots + end, [](const Slot& x, const Slot& y) {
        return x.hash != y.hash ? x.hash < y.hash : x.pos < y.pos;
      });
    }
    Stripe& s = stripes_[si];
    WriterLock lock(&s.mu);
    if (s.index) {
      for (uint32_t k = begin; k < end; ++k) {
        const uint64_t h = b.slots[k].hash;
        const uint32_t e = s.index[h & s.index_mask];
        if (e != 0 && (e & 0xffu) == TagOf(h)) {
          PrefetchSpan(Record(s, EntryRow(e)), stride_);
        }
      }
    }
    for (uint32_t k = begin; k < end;) {
      const Slot& first = b.slots[k];
      const uint64_t key = keys[first.pos];
      const uint8_t* row = grads.row(first.pos, grad_row);
      const void* grad = g.data();
      const bool alone = k + 1 == end || b.slots[k + 1].hash != first.hash;
      if (alone && grad_dtype == DType::kFp32) {
        grad = row;  // the request's row, read in place (at any alignment)
        ++k;
      } else {
        ConvertElements(row, grad_dtype, g.data(), DType::kFp32, dim_);
        for (++k; k < end && b.slots[k].hash == first.hash; ++k) {
          const uint8_t* more = grads.row(b.slots[k].pos, grad_row);
          for (uint32_t j = 0; j < dim_; ++j) g[j] += LoadElement(more, grad_dtype, j);
        }
      }
      uint32_t r = FindRow(s, key, first.hash);
      if (r == kNoRow) {
        r = InsertRow(s, key, first.hash);
        if (r == kNoRow) {
          ++failed;
          continue;
        }
        ++result.inserted;
      }
      uint8_t* rec = Record(s, r);
      ApplyOptimizer(rec, grad, scratch.data());
      Touch(rec, clock);
      MarkChanged(s, r, key);
      ++result.updated;
    }
  }
  if (failed > 0) {
    return TableFullError(config(), failed, "new keys' gradients dropped");
  }
  return result;
}

StoreStats CpuStore::StatsImpl() const {
  StoreStats st;
  st.rows = rows_.load(std::memory_order_relaxed);
  st.capacity = config().capacity;
  st.memory_bytes = memory_bytes_.load(std::memory_order_relaxed);
  st.inserts = inserts_.load(std::memory_order_relaxed);
  st.evictions = evictions_.load(std::memory_order_relaxed);
  st.insert_failures = insert_failures_.load(std::memory_order_relaxed);
  st.expired = expired_.load(std::memory_order_relaxed);
  return st;
}

absl::StatusOr<std::unique_ptr<EmbeddingStore>> NewCpuStore(const TableConfig& config) {
  auto store = CpuStore::Create(config);
  if (!store.ok()) return store.status();
  return std::unique_ptr<EmbeddingStore>(std::move(*store));
}

}  // namespace ember
