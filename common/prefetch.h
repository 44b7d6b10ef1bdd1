// Software prefetches for the gathers of rows whose addresses the hardware
// prefetcher cannot guess (rows found through a hash index or an id list).
// A prefetch never faults, so any address may be given.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ember {

// Requests the cache line holding `p`, for reading.
inline void Prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

// Requests every cache line of [p, p + bytes), bytes > 0. A wide row spans
// many lines, and the hardware prefetcher, which sees only the first misses
// of each row, does not fetch the rest in time: a gather or an update then
// stalls on each line in turn.
inline void PrefetchSpan(const void* p, size_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const uintptr_t last = reinterpret_cast<uintptr_t>(p) + bytes - 1;
  for (uintptr_t line = first; line <= last; line += 64) {
    Prefetch(reinterpret_cast<const void*>(line));
  }
}

}  // namespace ember
