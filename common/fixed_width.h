// Row loops over a width known at compile time for the widths models use
// most. A loop over a width known only at run time is vectorised for long
// rows but pays its set-up (trip-count checks, a vector epilogue) on every
// row, which at dim 8 cost as much as the arithmetic (bench/pooling_bench,
// docs/design.md "Fixed widths"); over a fixed width it is straight-line
// vector code in every clone (common/vector_dispatch.h). The pooling passes
// use it; the optimizers' row updates did not gain from it in store_bench,
// where the store's own work per row dominates.
//
//   WithWidth(dim, [&](auto n) EMBER_ALWAYS_INLINE {
//     for (uint32_t d = 0; d < n; ++d) y[d] += x[d];   // n: Width<8>, ... or uint32_t
//   });
//
// The lambda must be EMBER_ALWAYS_INLINE: a lambda is a function of its own,
// compiled for the baseline ISA, not for the clone that calls it (a
// dispatch through plain lambdas ran every pass as SSE code).
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__GNUC__)
#define EMBER_ALWAYS_INLINE __attribute__((always_inline))
#else
#define EMBER_ALWAYS_INLINE
#endif

namespace ember {

template <uint32_t kWidth>
using Width = std::integral_constant<uint32_t, kWidth>;

// Calls pass(width) with width as a Width<> when it is 8, 16, 32, 64 or
// 128, else as the uint32_t it is.
template <typename Pass>
EMBER_ALWAYS_INLINE inline void WithWidth(uint32_t width, Pass pass) {
  switch (width) {
    case 8: return pass(Width<8>{});
    case 16: return pass(Width<16>{});
    case 32: return pass(Width<32>{});
    case 64: return pass(Width<64>{});
    case 128: return pass(Width<128>{});
    default: return pass(width);
  }
}

}  // namespace ember
