// The CPU store's record layout, stripes and per-thread scratch, shared by
// its source files (cpu_store.cc: lookups, pushes and row management;
// cpu_store_peek.cc: the early fetch's peek; cpu_store_snapshot.cc: erase,
// export, import, snapshots and TTL expiry).
// Internal to kernels/cpu/.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/rw_mutex.h"
#include "kernels/cpu/cpu_store.h"

namespace ember {
namespace cpu_detail {

inline constexpr uint32_t kNoRow = 0xffffffffu;
inline constexpr size_t kMinIndexSize = 16;
// Rows per record chunk: about 1/16 of a stripe's capacity, so a full stripe
// has ~16 chunks (a chunk table that stays in cache), and at most 256 KiB, so
// the one partly used chunk per stripe wastes little; 1024 rows for tables
// without a capacity.
inline constexpr size_t kMinChunkRows = 16;
inline constexpr size_t kMaxChunkRows = 4096;
inline constexpr size_t kMaxChunkBytes = 256 * 1024;

inline uint32_t TagOf(uint64_t hash) { return static_cast<uint32_t>(hash >> 32) & 0xffu; }
inline uint32_t Entry(uint32_t row, uint64_t hash) { return ((row + 1) << 8) | TagOf(hash); }
inline uint32_t EntryRow(uint32_t entry) { return (entry >> 8) - 1; }

inline uint64_t RecordKey(const uint8_t* record) {
  uint64_t k;
  memcpy(&k, record, 8);
  return k;
}
inline uint32_t* ScoreOf(uint8_t* record) { return reinterpret_cast<uint32_t*>(record + 8); }
inline uint32_t* StepOf(uint8_t* record) { return reinterpret_cast<uint32_t*>(record + 12); }

// A key of a sub-batch, sorted by stripe: its hash, its position in the
// caller's arrays, and the row found for it.
struct Slot {
  uint64_t hash;
  uint32_t pos;
  uint32_t row;
};

// True only if the slots' hashes are pairwise distinct: no two share their
// low 10 bits. A false "no" costs a sort; with the ~10 keys per stripe of a
// trainer's push it comes about 1 time in 20.
inline bool SurelyDistinct(const Slot* slots, size_t n) {
  constexpr size_t kBits = 1024;
  if (n > kBits / 16) return false;  // the filter would mostly say no
  uint64_t seen[kBits / 64] = {};
  for (size_t i = 0; i < n; ++i) {
    const uint64_t bit = slots[i].hash & (kBits - 1);
    const uint64_t mask = uint64_t{1} << (bit & 63);
    if (seen[bit >> 6] & mask) return false;
    seen[bit >> 6] |= mask;
  }
  return true;
}

// Per-thread scratch reused across calls: batches are often large, and a
// fresh allocation per call would go to mmap and back each time.
struct Scratch {
  std::vector<Slot> slots;
  std::vector<uint64_t> hashes;
  std::vector<uint32_t> offsets;
  std::vector<uint32_t> cursors;
  std::vector<uint32_t> pending;
};
inline Scratch& LocalScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// Keys per sub-batch: the sub-batch's keys, slots and row buffer stay in L2
// while it is processed, so the per-key bookkeeping never misses the cache.
inline size_t SubBatchKeys(size_t row_bytes) {
  return std::clamp<size_t>((256 * 1024) / (row_bytes + 32), 256, 8192);
}

}  // namespace cpu_detail

using cpu_detail::Slot;

struct alignas(64) CpuStore::Stripe {
  mutable RwMutex mu;
  // Open-addressing index; index_mask + 1 entries, a power of two.
  std::unique_ptr<uint32_t[]> index ABSL_GUARDED_BY(mu);
  size_t index_mask ABSL_GUARDED_BY(mu) = 0;
  // Copies of index/index_mask readable without the lock, used only to
  // prefetch the index lines of the next stripe's keys (a stale address is
  // harmless to a prefetch).
  std::atomic<const uint32_t*> index_view{nullptr};
  std::atomic<size_t> index_mask_view{0};
  // Dense row records, rows [0, size), in chunks of 1 << chunk_shift_ rows.
  std::vector<std::unique_ptr<uint8_t[]>> chunks ABSL_GUARDED_BY(mu);
  uint32_t size ABSL_GUARDED_BY(mu) = 0;
  uint32_t capacity = 0;  // rows this stripe may hold; fixed at creation
  uint64_t rng ABSL_GUARDED_BY(mu) = 0x853c49e6748fea9bULL;
  // Change tracking: bit r of `dirty` is set while row r has changes no
  // snapshot holds yet; `changed` lists the keys whose bit was set or whose
  // row was removed since this stripe's last snapshot (a key may repeat).
  std::vector<uint64_t> dirty ABSL_GUARDED_BY(mu);
  std::vector<uint64_t> changed ABSL_GUARDED_BY(mu);
};

// Inline: called per key from both source files.
inline uint8_t* CpuStore::Record(const Stripe& s,
                                 uint32_t row) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const size_t mask = (size_t{1} << chunk_shift_) - 1;
  return s.chunks[row >> chunk_shift_].get() + (row & mask) * stride_;
}

inline uint32_t CpuStore::ConfirmedRow(const Stripe& s, const Slot& slot, uint64_t key) const {
  if (slot.row == cpu_detail::kNoRow || cpu_detail::RecordKey(Record(s, slot.row)) == key) {
    return slot.row;
  }
  return FindRow(s, key, slot.hash);
}

// A sub-batch grouped by stripe: slots[offsets[s]..offsets[s+1]) are the keys
// of stripe s, in request order.
struct CpuStore::Batch {
  Slot* slots;
  const uint32_t* offsets;
};

}  // namespace ember
