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

// The quantile math runs in double (float Horner loses ~1e-4 to cancellation
// in Acklam's central region); results are rounded to float once at the end.
#if defined(__CUDA_ARCH__)
EMBER_HD double RnAdd(double a, double b) { return __dadd_rn(a, b); }
EMBER_HD double RnSub(double a, double b) { return __dsub_rn(a, b); }
EMBER_HD double RnMul(double a, double b) { return __dmul_rn(a, b); }
EMBER_HD double RnDiv(double a, double b) { return __ddiv_rn(a, b); }
EMBER_HD double RnSqrt(double a) { return __dsqrt_rn(a); }
EMBER_HD float RnAddF(float a, float b) { return __fadd_rn(a, b); }
EMBER_HD float RnMulF(float a, float b) { return __fmul_rn(a, b); }
#else
// g++ on x86-64 does not contract without -mfma, and ember_kernels builds
// with -ffp-contract=off to be sure.
inline double RnAdd(double a, double b) { return a + b; }
inline double RnSub(double a, double b) { return a - b; }
inline double RnMul(double a, double b) { return a * b; }
inline double RnDiv(double a, double b) { return a / b; }
inline double RnSqrt(double a) { return std::sqrt(a); }
inline float RnAddF(float a, float b) { return a + b; }
inline float RnMulF(float a, float b) { return a * b; }
#endif

// Per-key base word; element words derive from it.
EMBER_HD uint64_t KeyBase(uint64_t seed, uint64_t key) {
  return Mix64(Mix64(seed ^ 0x243f6a8885a308d3ULL) ^ key);
}

// The counter-th random word of a key.
EMBER_HD uint64_t Word(uint64_t base, uint64_t counter) {
  return Mix64(base + (counter + 1) * 0x9e3779b97f4a7c15ULL);
}

// Uniform in (0, 1), never 0 or 1: (k + 0.5) / 2^32 for a 32-bit k (exact in double).
EMBER_HD double UnitOpen(uint64_t word) {
  return RnMul(static_cast<double>(word >> 32) + 0.5, 2.3283064365386963e-10);
}

// Natural log for x in (0, 1], through the exponent and an atanh series
// (|s| <= 0.1716; the truncation error is below 1e-13).
EMBER_HD double Log(double x) {
  uint64_t bits;
  memcpy(&bits, &x, 8);
  int e = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  bits = (bits & 0xfffffffffffffULL) | 0x3ff0000000000000ULL;
  double m;
  memcpy(&m, &bits, 8);  // [1, 2)
  if (m > 1.4142135623730951) {
    m = RnMul(m, 0.5);
    ++e;
  }
  const double s = RnDiv(RnSub(m, 1.0), RnAdd(m, 1.0));
  const double s2 = RnMul(s, s);
  double poly = 1.0 / 17.0;
  for (int k = 15; k >= 1; k -= 2) poly = RnAdd(1.0 / k, RnMul(s2, poly));
  return RnAdd(RnMul(static_cast<double>(e), 0.6931471805599453), RnMul(RnMul(2.0, s), poly));
}

// Standard normal quantile of p in (0, 1) (Acklam's rational approximation).
EMBER_HD double NormalQuantile(double p) {
  constexpr double kLow = 0.02425;
  if (p < kLow || p > 1.0 - kLow) {
    double tail = p < kLow ? p : RnSub(1.0, p);
    double q = RnSqrt(RnMul(-2.0, Log(tail)));
    double num = -7.784894002430293e-03;
    num = RnAdd(RnMul(num, q), -3.223964580411365e-01);
    num = RnAdd(RnMul(num, q), -2.400758277161838e+00);
    num = RnAdd(RnMul(num, q), -2.549732539343734e+00);
    num = RnAdd(RnMul(num, q), 4.374664141464968e+00);
    num = RnAdd(RnMul(num, q), 2.938163982698783e+00);
    double den = 7.784695709041462e-03;
    den = RnAdd(RnMul(den, q), 3.224671290700398e-01);
    den = RnAdd(RnMul(den, q), 2.445134137142996e+00);
    den = RnAdd(RnMul(den, q), 3.754408661907416e+00);
    den = RnAdd(RnMul(den, q), 1.0);
    double x = RnDiv(num, den);
    return p < kLow ? x : -x;
  }
  double q = RnSub(p, 0.5);
  double r = RnMul(q, q);
  double num = -3.969683028665376e+01;
  num = RnAdd(RnMul(num, r), 2.209460984245205e+02);
  num = RnAdd(RnMul(num, r), -2.759285104469687e+02);
  num = RnAdd(RnMul(num, r), 1.383577518672690e+02);
  num = RnAdd(RnMul(num, r), -3.066479806614716e+01);
  num = RnAdd(RnMul(num, r), 2.506628277459239e+00);
  double den = -5.447609879822406e+01;
  den = RnAdd(RnMul(den, r), 1.615858368580409e+02);
  den = RnAdd(RnMul(den, r), -1.556989798598866e+02);
  den = RnAdd(RnMul(den, r), 6.680131188771972e+01);
  den = RnAdd(RnMul(den, r), -1.328068155288572e+01);
  den = RnAdd(RnMul(den, r), 1.0);
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
      {
        // A 24-bit fraction is exact in float; rounding of min + span * u may
        // still reach max, which [min, max) excludes.
        const float u = RnMulF(static_cast<float>(Word(base, j) >> 40) + 0.5f, 5.9604644775390625e-8f);
        const float v = RnAddF(c.min, RnMulF(c.max - c.min, u));
        return v < c.max ? v : nextafterf(c.max, c.min);
      }
    case InitializerKind::kNormal:
      return RnAddF(c.mean, RnMulF(c.stddev, static_cast<float>(NormalQuantile(UnitOpen(Word(base, j))))));
    case InitializerKind::kTruncatedNormal: {
      double z = 0.0;
      for (int attempt = 0; attempt < kTruncatedNormalAttempts; ++attempt) {
        z = NormalQuantile(
            UnitOpen(Word(base, static_cast<uint64_t>(j) * kTruncatedNormalAttempts + attempt)));
        if (z >= -2.0 && z <= 2.0) break;
      }
      z = z < -2.0 ? -2.0 : (z > 2.0 ? 2.0 : z);
      return RnAddF(c.mean, RnMulF(c.stddev, static_cast<float>(z)));
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
