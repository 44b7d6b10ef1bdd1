// CountMinSketch: approximate occurrence counts of uint64 keys in fixed
// memory (Cormode & Muthukrishnan), for admission control: 4 rows of
// `width` saturating 16-bit counters; an estimate is the smallest of the
// key's 4 counters, so it is never below the true count (up to 65535) and
// exceeds it only through collisions.
//
// Thread safety: Add and Estimate may be called concurrently; increments are
// compare-and-swap loops, so none is lost.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "common/key_hash.h"

namespace ember {

class CountMinSketch {
 public:
  static constexpr int kRows = 4;

  // `width` must be a power of two.
  explicit CountMinSketch(uint32_t width)
      : mask_(width - 1), counters_(std::make_unique<std::atomic<uint16_t>[]>(size_t{width} * kRows)) {}

  // Counts one occurrence of `key`; returns the new estimate.
  uint32_t Add(uint64_t key) {
    uint32_t estimate = 0xffff;
    ForEachCounter(key, [&](std::atomic<uint16_t>& c) {
      uint16_t v = c.load(std::memory_order_relaxed);
      while (v != 0xffff && !c.compare_exchange_weak(v, static_cast<uint16_t>(v + 1),
                                                     std::memory_order_relaxed)) {
      }
      estimate = std::min<uint32_t>(estimate, v == 0xffff ? v : v + 1u);
    });
    return estimate;
  }

  uint32_t Estimate(uint64_t key) const {
    uint32_t estimate = 0xffff;
    const_cast<CountMinSketch*>(this)->ForEachCounter(key, [&](std::atomic<uint16_t>& c) {
      estimate = std::min<uint32_t>(estimate, c.load(std::memory_order_relaxed));
    });
    return estimate;
  }

  size_t memory_bytes() const { return (size_t{mask_} + 1) * kRows * sizeof(uint16_t); }

 private:
  // Row i uses h1 + i * h2 (Kirsch-Mitzenmacher): two hashes make four.
  template <typename Fn>
  void ForEachCounter(uint64_t key, Fn fn) {
    const uint64_t h1 = Mix64(key ^ 0x9e3779b97f4a7c15ULL);
    const uint64_t h2 = Mix64(key + 0x632be59bd9b4e019ULL) | 1;
    for (int i = 0; i < kRows; ++i) {
      fn(counters_[size_t{mask_ + 1u} * i + ((h1 + i * h2) & mask_)]);
    }
  }

  const uint32_t mask_;
  std::unique_ptr<std::atomic<uint16_t>[]> counters_;
};

}  // namespace ember
