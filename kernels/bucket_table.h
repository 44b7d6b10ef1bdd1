// The bucketed hash table of the CUDA store, as plain functions over raw
// arrays that host (g++) and device (nvcc) code both compile: the GPU runs
// them in its kernels, and tests/kernels/bucket_table_test.cc runs the very
// same code on the CPU.
//
// Layout (HierarchicalKV's idea): slots are grouped in buckets of kSlots. A
// key lives in exactly one bucket, BucketOf(StoreHash(key)), anywhere in it.
// Per slot the table keeps a key (8 B), a one-byte digest (a short
// fingerprint of the hash; kEmpty marks a free slot, so every uint64 stays a
// valid key) and a 4-byte eviction score, each in its own array, apart from
// the rows, which live in the store's row arrays at the same slot number.
// A bucket's 128 digests are one 128-byte line: a lookup reads that line,
// compares 4 digests per instruction and reads a key only where a digest
// matches (a false match costs one key read, 1 in 255 per occupied slot).
//
// Capacity: a table with a capacity spreads it evenly over its buckets
// (BucketCapacity), so rows never exceed the capacity; a full bucket evicts
// its lowest-score row (ChooseVictim; scores follow kernels/row_policy.h).
// A table without one lets every bucket fill all kSlots and grows the
// bucket count when it gets full.
//
// Change tracking (delta snapshots), when the arrays are set: `dirty` has a
// byte per slot, set when the slot's row is inserted or changed, cleared
// when it is erased; `removed` logs the keys erased or evicted, up to
// `removed_capacity` (the count goes on past it: an overflowed log means the
// next snapshot must be full). The snapshot reads and clears both.
//
// Concurrency: none here, except the removed-key count (atomic on the
// device). The CUDA store gives each bucket to one thread per call (keys
// are grouped by bucket first), so these functions never race.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/host_device.h"
#include "kernels/table_config.h"

namespace ember::bucket {

inline constexpr uint32_t kSlots = 128;
inline constexpr uint8_t kEmpty = 0;
inline constexpr int64_t kNoSlot = -1;

// Raw arrays of num_buckets * kSlots entries (sizes: num_buckets), in device
// memory on the GPU and host memory in tests. Not owning.
struct Table {
  uint64_t* keys = nullptr;
  uint8_t* digests = nullptr;  // 4-byte aligned
  uint32_t* scores = nullptr;
  uint32_t* sizes = nullptr;   // occupied slots per bucket
  uint64_t num_buckets = 0;
  uint64_t capacity = 0;       // 0: every bucket may fill all kSlots
  // Change tracking; null when off.
  uint8_t* dirty = nullptr;
  uint64_t* removed = nullptr;
  unsigned long long* removed_count = nullptr;
  uint64_t removed_capacity = 0;
};

// The slot's row changed (inserted, updated, imported).
EMBER_HD void MarkDirty(const Table& t, int64_t slot) {
  if (t.dirty != nullptr) t.dirty[slot] = 1;
}

// `key` left the table (erased or evicted).
EMBER_HD void LogRemoved(const Table& t, uint64_t key) {
  if (t.removed_count == nullptr) return;
#if defined(__CUDA_ARCH__)
  const unsigned long long i = atomicAdd(t.removed_count, 1ull);
#else
  const unsigned long long i = (*t.removed_count)++;
#endif
  if (i < t.removed_capacity) t.removed[i] = key;
}

// Buckets are chosen by the high half of the hash (Lemire's multiply-shift,
// no division); digests and start slots come from the low bits, which are
// independent of it.
EMBER_HD uint64_t BucketOf(uint64_t hash, uint64_t num_buckets) {
  return ((hash >> 32) * num_buckets) >> 32;
}
EMBER_HD uint8_t DigestOf(uint64_t hash) {
  const uint8_t d = static_cast<uint8_t>(hash);
  return d == kEmpty ? 1 : d;
}
// Where an insert starts looking for a free slot, so that a bucket's keys
// spread over its slots rather than all piling up at slot 0.
EMBER_HD uint32_t StartSlot(uint64_t hash) { return static_cast<uint32_t>(hash >> 8) % kSlots; }

// Bit 8k+7 is set where byte k of `word` equals `digest` (the classic
// has-zero-byte trick, exact: no false positives from borrows).
EMBER_HD uint32_t MatchBytes(uint32_t word, uint8_t digest) {
  const uint32_t x = word ^ (0x01010101u * digest);
  return ~(((x & 0x7f7f7f7fu) + 0x7f7f7f7fu) | x | 0x7f7f7f7fu);
}

// Four digests as one word (bucket starts are 4-byte aligned). The device
// loads the word; the host copies it, which is the defined way to read bytes
// as a uint32 in C++ and compiles to the same load.
EMBER_HD uint32_t DigestWord(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t w;
  memcpy(&w, p, 4);
  return w;
#endif
}

// Rows bucket `b` may hold: the capacity split evenly, the remainder to the
// first buckets.
EMBER_HD uint32_t BucketCapacity(const Table& t, uint64_t b) {
  if (t.capacity == 0) return kSlots;
  const uint64_t share = t.capacity / t.num_buckets;
  return static_cast<uint32_t>(share + (b < t.capacity % t.num_buckets ? 1 : 0));
}

// Buckets for a table of `capacity` rows (0: `initial_slots` of room).
inline uint64_t BucketsFor(uint64_t capacity, uint64_t initial_slots) {
  const uint64_t slots = capacity == 0 ? initial_slots : capacity;
  return slots == 0 ? 1 : (slots + kSlots - 1) / kSlots;
}

// The global slot of `key`, or kNoSlot.
EMBER_HD int64_t FindSlot(const Table& t, uint64_t key, uint64_t hash) {
  const uint64_t base = BucketOf(hash, t.num_buckets) * kSlots;
  const uint8_t digest = DigestOf(hash);
  for (uint32_t w = 0; w < kSlots / 4; ++w) {
    uint32_t match = MatchBytes(DigestWord(t.digests + base + 4 * w), digest);
    while (match != 0) {
#if defined(__CUDA_ARCH__)
      const uint32_t byte = (__ffs(match) - 1) / 8;
#else
      const uint32_t byte = static_cast<uint32_t>(__builtin_ctz(match)) / 8;
#endif
      const uint64_t slot = base + w * 4 + byte;
      if (t.keys[slot] == key) return static_cast<int64_t>(slot);
      match &= match - 1;
    }
  }
  return kNoSlot;
}

// The occupied slot (0..kSlots-1) of a bucket with the lowest score; the
// lowest slot among equals, so the choice is deterministic.
EMBER_HD uint32_t ChooseVictim(const uint8_t* digests, const uint32_t* scores) {
  uint32_t victim = 0;
  uint32_t best = 0xffffffffu;
  bool any = false;
  for (uint32_t s = 0; s < kSlots; ++s) {
    if (digests[s] == kEmpty) continue;
    if (!any || scores[s] < best) {
      best = scores[s];
      victim = s;
      any = true;
    }
  }
  return victim;
}

enum class Placement : uint8_t { kFound, kInserted, kReplaced, kFull };

struct InsertOutcome {
  int64_t slot = kNoSlot;      // kNoSlot when kFull
  Placement placement = Placement::kFull;
  uint64_t evicted_key = 0;    // kReplaced: the key whose row was evicted
};

// Finds `key` or inserts it with `score`: in a free slot while the bucket is
// under its capacity, else (with an eviction policy) in place of the bucket's
// lowest-score row. The caller owns the bucket for the duration and writes
// the row of a kInserted / kReplaced slot.
EMBER_HD InsertOutcome InsertKey(Table& t, uint64_t key, uint64_t hash, EvictionPolicy policy,
                                 uint32_t score) {
  InsertOutcome out;
  out.slot = FindSlot(t, key, hash);
  if (out.slot != kNoSlot) {
    out.placement = Placement::kFound;
    return out;
  }
  const uint64_t b = BucketOf(hash, t.num_buckets);
  const uint64_t base = b * kSlots;
  const uint32_t cap = BucketCapacity(t, b);
  uint32_t s;
  if (t.sizes[b] < cap) {
    s = StartSlot(hash);
    while (t.digests[base + s] != kEmpty) s = (s + 1) % kSlots;
    ++t.sizes[b];
    out.placement = Placement::kInserted;
  } else if (policy != EvictionPolicy::kNone && t.capacity != 0 && cap != 0) {
    s = ChooseVictim(t.digests + base, t.scores + base);
    out.evicted_key = t.keys[base + s];
    out.placement = Placement::kReplaced;
    LogRemoved(t, out.evicted_key);
  } else {
    return out;  // kFull
  }
  t.keys[base + s] = key;
  t.digests[base + s] = DigestOf(hash);
  t.scores[base + s] = score;
  out.slot = static_cast<int64_t>(base + s);
  MarkDirty(t, out.slot);
  return out;
}

// Removes `key`; false when it was not stored.
EMBER_HD bool EraseKey(Table& t, uint64_t key, uint64_t hash) {
  const int64_t slot = FindSlot(t, key, hash);
  if (slot == kNoSlot) return false;
  t.digests[slot] = kEmpty;
  --t.sizes[static_cast<uint64_t>(slot) / kSlots];
  if (t.dirty != nullptr) t.dirty[slot] = 0;
  LogRemoved(t, key);
  return true;
}

}  // namespace ember::bucket
