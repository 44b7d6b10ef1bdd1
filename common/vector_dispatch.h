// Runtime dispatch of the hot row loops to the CPU's widest vector unit.
//
// A function marked EMBER_VECTOR_CLONES is compiled three times (AVX-512F,
// AVX2 and the x86-64 baseline) and the loader picks one per process from
// the CPU it runs on (GCC/Clang target_clones, an ifunc). Shipped binaries
// stay portable: no -march flag anywhere. Mark whole loops (a pooling pass,
// a row update), not per-element helpers: each call goes through the ifunc.
//
// Files holding such functions are compiled with -O3 -fno-math-errno (so
// loops with a sqrt vectorise; errno is never read) and, like every kernel,
// -ffp-contract=off, so that no clone fuses a multiply and an add: every
// clone computes the same per-element expression in the same order and
// gives bit-identical results to the baseline (IEEE add, multiply, divide
// and sqrt are exactly rounded in scalar and vector form alike).
#pragma once

// Sanitizer builds run the baseline only: the clones' resolver runs while
// the dynamic loader relocates, before the sanitizer's runtime is set up,
// and instrumented it crashes there (TSan: a segfault at start-up).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EMBER_NO_VECTOR_CLONES 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define EMBER_NO_VECTOR_CLONES 1
#endif
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(EMBER_NO_VECTOR_CLONES)
#define EMBER_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define EMBER_VECTOR_CLONES
#endif

namespace ember {

// The clone the loader picks on this CPU: "avx512f", "avx2" or "baseline"
// (for benchmarks' headers).
const char* VectorIsa();

}  // namespace ember
