// Deterministic row initialisation, shared by the CPU and CUDA stores.
//
// Element j of the initial row of `key` is a pure function of (seed, key, j):
// a counter-based generator (splitmix64 over seed, key and j) gives a uniform
// 24-bit fraction, mapped by the initializer. Only IEEE-rounded +, -, *, /
// and sqrt are used, each written through the Rn* helpers so that nvcc cannot
// contract them into FMAs: fp32 rows are bit-identical on host and device.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.h"
#include "common/key_hash.h"
#include "kernels/table_config.h"

namespace ember::init {

#if defined(__CUDA_ARCH__)
EMBER_HD float RnAdd(float a, float b) { return __fadd_rn(a, b); }
EMBER_HD float RnSub(float a, float b) { return __fsub_rn(a, b); }
EMBER_HD float RnMul(float a, float b) { return __fmul_rn(a, b); }
EMBER_HD float RnDiv(float a, float b) { return __fdiv_rn(a, b); }
EMBER_HD float RnSqrt(float a) { return __fsqrt_rn(a); }
#else
// g++ on x86-64 does not contract without -mfma; the build keeps
// -ffp-contract=off on for this header's users to be sure.
inline float RnAdd(float a, float b) { return a + b; }
inline float RnSub(float a, float b) { return a - b; }
inline float RnMul(float a, float b) { return a * b; }
inline float RnDiv(float a, float b) { return a / b; }
inline float RnSqrt(float a) { return std::sqrt(a); }
#endif

// Per-key base word; element words derive from it.
EMBER_HD uint64_t KeyBase(uint64_t seed, uint64_t key) {
  return Mix64(Mix64(seed ^ 0x243f6a8885a308d3ULL) ^ key);
}

// The counter-th random word of a key.
EMBER_HD uint64_t Word(uint64_t base, uint64_t counter) {
  return Mix64(base + (counter + 1) * 0x9e3779b97f4a7c15ULL);
}

// Uniform in (0, 1), never 0 or 1: (k + 0.5) / 2^24 for a 24-bit k.
EMBER_HD float UnitOpen(uint64_t word) {
  return RnMul(static_cast<float>(word >> 40) + 0.5f, 5.9604644775390625e-8f);
}

// Natural log for x in (0, 1], through the exponent and an atanh series
// (|s| <= 0.1716, error well below fp32 resolution).
EMBER_HD float Log(float x) {
  uint32_t bits = FloatBits(x);
  int e = static_cast<int>((bits >> 23) & 0xff) - 127;
  float m = BitsToFloat((bits & 0x7fffffu) | 0x3f800000u);  // [1, 2)
  if (m > 1.41421356f) {
    m = RnMul(m, 0.5f);
    ++e;
  }
  float s = RnDiv(RnSub(m, 1.0f), RnAdd(m, 1.0f));
  float s2 = RnMul(s, s);
  float poly = RnAdd(1.0f / 9.0f, RnMul(s2, 1.0f / 11.0f));
  poly = RnAdd(1.0f / 7.0f, RnMul(s2, poly));
  poly = RnAdd(1.0f / 5.0f, RnMul(s2, poly));
  poly = RnAdd(1.0f / 3.0f, RnMul(s2, poly));
  poly = RnAdd(1.0f, RnMul(s2, poly));
  float log_m = RnMul(RnMul(2.0f, s), poly);
  return RnAdd(RnMul(static_cast<float>(e), 0.693147180559945f), log_m);
}

// Standard normal quantile of p in (0, 1) (Acklam's rational approximation).
EMBER_HD float NormalQuantile(float p) {
  constexpr float kLow = 0.02425f;
  if (p < kLow || p > 1.0f - kLow) {
    float tail = p < kLow ? p : RnSub(1.0f, p);
    float q = RnSqrt(RnMul(-2.0f, Log(tail)));
    float num = -7.784894002430293e-03f;
    num = RnAdd(RnMul(num, q), -3.223964580411365e-01f);
    num = RnAdd(RnMul(num, q), -2.400758277161838e+00f);
    num = RnAdd(RnMul(num, q), -2.549732539343734e+00f);
    num = RnAdd(RnMul(num, q), 4.374664141464968e+00f);
    num = RnAdd(RnMul(num, q), 2.938163982698783e+00f);
    float den = 7.784695709041462e-03f;
    den = RnAdd(RnMul(den, q), 3.224671290700398e-01f);
    den = RnAdd(RnMul(den, q), 2.445134137142996e+00f);
    den = RnAdd(RnMul(den, q), 3.754408661907416e+00f);
    den = RnAdd(RnMul(den, q), 1.0f);
    float x = RnDiv(num, den);
    return p < kLow ? x : -x;
  }
  float q = RnSub(p, 0.5f);
  float r = RnMul(q, q);
  float num = -3.969683028665376e+01f;
  num = RnAdd(RnMul(num, r), 2.209460984245205e+02f);
  num = RnAdd(RnMul(num, r), -2.759285104469687e+02f);
  num = RnAdd(RnMul(num, r), 1.383577518672690e+02f);
  num = RnAdd(RnMul(num, r), -3.066479806614716e+01f);
  num = RnAdd(RnMul(num, r), 2.506628277459239e+00f);
  float den = -5.447609879822406e+01f;
  den = RnAdd(RnMul(den, r), 1.615858368580409e+02f);
  den = RnAdd(RnMul(den, r), -1.556989798598866e+02f);
  den = RnAdd(RnMul(den, r), 6.680131188771972e+01f);
  den = RnAdd(RnMul(den, r), -1.328068155288572e+01f);
  den = RnAdd(RnMul(den, r), 1.0f);
  return RnDiv(RnMul(num, q), den);
}

// Draws of a truncated normal before giving up and clamping; P(16 misses) ~ 1e-21.
inline constexpr int kTruncatedNormalAttempts = 16;

// Element j of the initial row (fp32, before rounding to the storage dtype).
EMBER_HD float Element(const InitializerConfig& c, uint64_t base, uint32_t j) {
  switch (c.kind) {
    case InitializerKind::kZeros: return 0.0f;
    case InitializerKind::kConstant: return c.value;
    case InitializerKind::kUniform:
      return RnAdd(c.min, RnMul(RnSub(c.max, c.min), UnitOpen(Word(base, j))));
    case InitializerKind::kNormal:
      return RnAdd(c.mean, RnMul(c.stddev, NormalQuantile(UnitOpen(Word(base, j)))));
    case InitializerKind::kTruncatedNormal: {
      float z = 0.0f;
      for (int attempt = 0; attempt < kTruncatedNormalAttempts; ++attempt) {
        z = NormalQuantile(
            UnitOpen(Word(base, static_cast<uint64_t>(j) * kTruncatedNormalAttempts + attempt)));
        if (z >= -2.0f && z <= 2.0f) break;
      }
      z = z < -2.0f ? -2.0f : (z > 2.0f ? 2.0f : z);
      return RnAdd(c.mean, RnMul(c.stddev, z));
    }
  }
  return 0.0f;
}

// Writes the initial row of `key` (dim elements) to `out` as type `dtype`.
EMBER_HD void InitialRow(const InitializerConfig& c, uint64_t key, uint32_t dim, DType dtype,
                         void* out) {
  uint64_t base = KeyBase(c.seed, key);
  for (uint32_t j = 0; j < dim; ++j) StoreElement(out, dtype, j, Element(c, base, j));
}

}  // namespace ember::init
