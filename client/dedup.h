// KeyDeduplicator: unique keys in first-occurrence order plus, for every key
// added, the index of its unique key (unique + inverse). Reusable: Clear is
// O(1) and keeps the table's memory for the next step.
//
// An open-addressing table (linear probing, load at most 1/2, slots of key,
// index and a generation stamp, so that Clear only bumps the generation):
// a step's few thousand keys stay in L2, and every probe is one compare.
// In a throwaway loop over 200 reference batches it took 35 us per batch
// where absl::flat_hash_map (whose clear() also walks the whole table) took
// 90; in the trainer, beside everything else in the cache, the gain is
// smaller (about 12% -> 10% of the trainer's CPU samples). bench/dedup_bench
// measures it on the reference keys: 6.6-8.6 ns per key added, then 5.6-5.8
// once Add made room for all its keys up front instead of checking the load
// before every key (6.4 before, alternated in one session). A branch-free
// Add (probe, then write the slot unconditionally) and hashing all keys in a
// pass of their own measured the same, so the simple loop stays.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/key_hash.h"

namespace ember {

class KeyDeduplicator {
 public:
  void Clear() {
    unique_.clear();
    if (++generation_ == 0) {  // wrapped: stamps from 2^32 Clears ago would match
      std::fill(slots_.begin(), slots_.end(), Slot{});
      generation_ = 1;
    }
  }
  // Appends one inverse index per key to `inverse`.
  void Add(absl::Span<const uint64_t> keys, std::vector<uint32_t>* inverse) {
    // Room for every key to be new, up front: the loop then never checks.
    while (2 * (unique_.size() + keys.size()) > slots_.size()) Grow();
    const size_t first = inverse->size();
    inverse->resize(first + keys.size());
    uint32_t* out = inverse->data() + first;
    for (uint64_t k : keys) *out++ = IndexOf(k);
  }
  const std::vector<uint64_t>& unique() const { return unique_; }

 private:
  struct Slot {
    uint64_t key = 0;
    uint32_t index = 0;
    uint32_t generation = 0;  // the slot is used iff == generation_
  };

  // The table has room for one more key (Add made it).
  uint32_t IndexOf(uint64_t key) {
    for (size_t i = Mix64(key) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.generation != generation_) {
        s = {key, static_cast<uint32_t>(unique_.size()), generation_};
        unique_.push_back(key);
        return s.index;
      }
      if (s.key == key) return s.index;
    }
  }

  void Grow() {
    slots_.assign(std::max<size_t>(1024, slots_.size() * 2), Slot{});
    mask_ = slots_.size() - 1;
    generation_ = 1;
    for (uint32_t u = 0; u < unique_.size(); ++u) {
      size_t i = Mix64(unique_[u]) & mask_;
      while (slots_[i].generation == generation_) i = (i + 1) & mask_;
      slots_[i] = {unique_[u], u, generation_};
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  uint32_t generation_ = 1;
  std::vector<uint64_t> unique_;
};

}  // namespace ember
