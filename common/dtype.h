// Element types of rows and gradients, and conversions between them.
//
// All conversions round to nearest even and keep NaN a NaN. They are
// EMBER_HD so the CUDA store converts exactly as the CPU store does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include "absl/strings/string_view.h"

#include "common/host_device.h"

namespace ember {

// Values match ember.v1.DType on the wire.
enum class DType : uint8_t { kFp32 = 1, kFp16 = 2, kBf16 = 3 };

constexpr size_t DTypeSize(DType t) { return t == DType::kFp32 ? 4 : 2; }
absl::string_view DTypeName(DType t);

EMBER_HD uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
EMBER_HD float BitsToFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

EMBER_HD uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
EMBER_HD float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

EMBER_HD uint16_t FloatToFp16(float f) {
  uint32_t u = FloatBits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (a < 0x38800000u) {                                              // fp16 subnormal or zero
    if (a < 0x33000000u) return static_cast<uint16_t>(sign);          // rounds to zero
    uint32_t exp = a >> 23;
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exp;  // 14..24
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1u);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

EMBER_HD float Fp16ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    // Subnormal: value = mant * 2^-24, exact in fp32.
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Element i of a packed buffer of type `t`, as fp32.
EMBER_HD float LoadElement(const void* data, DType t, size_t i) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  if (t == DType::kFp32) {
    float f;
    memcpy(&f, p + i * 4, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p + i * 2, 2);
  return t == DType::kFp16 ? Fp16ToFloat(h) : Bf16ToFloat(h);
}

// Stores fp32 `v` as element i of a packed buffer of type `t` (rounded).
EMBER_HD void StoreElement(void* data, DType t, size_t i, float v) {
  unsigned char* p = static_cast<unsigned char*>(data);
  if (t == DType::kFp32) {
    memcpy(p + i * 4, &v, 4);
    return;
  }
  uint16_t h = t == DType::kFp16 ? FloatToFp16(v) : FloatToBf16(v);
  memcpy(p + i * 2, &h, 2);
}

// Copies a multiple of 64 bytes in 64-byte blocks with the widest vector
// loads and stores the CPU has (common/vector_dispatch.h). For rows of 256
// bytes and more: the portable build's inline memcpy of those sizes is a
// `rep movsq`, whose start-up costs as much as the copy.
void CopyWideRowBytes(void* dst, const void* src, size_t n);

// memcpy for row-sized copies: the common row sizes get a fixed-size copy the
// compiler inlines (a library call per row costs more than the copy itself).
inline void CopyRowBytes(void* dst, const void* src, size_t n) {
  switch (n) {
    case 16: memcpy(dst, src, 16); return;
    case 32: memcpy(dst, src, 32); return;
    case 64: memcpy(dst, src, 64); return;
    case 128: memcpy(dst, src, 128); return;
    default:
      if (n >= 256 && n % 64 == 0) {
        CopyWideRowBytes(dst, src, n);
      } else {
        memcpy(dst, src, n);
      }
      return;
  }
}

// Copies n elements from `src` (type `st`) to `dst` (type `dt`), converting.
// Vectorised (common/vector_dispatch.h); the same values as LoadElement and
// StoreElement element by element.
void ConvertElements(const void* src, DType st, void* dst, DType dt, size_t n);

// Whether all n elements of `data` (type `t`) are finite: one pass over the
// exponent bits, vectorised. The gradient check of every push.
bool AllFinite(const void* data, DType t, size_t n);

// Rounds v to the nearest value representable in `t`.
EMBER_HD float RoundTo(DType t, float v) {
  if (t == DType::kFp32) return v;
  return t == DType::kFp16 ? Fp16ToFloat(FloatToFp16(v)) : Bf16ToFloat(FloatToBf16(v));
}

}  // namespace ember
