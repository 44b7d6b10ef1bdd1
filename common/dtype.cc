#include "common/dtype.h"

#include "common/vector_dispatch.h"

namespace ember {

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFp32: return "fp32";
    case DType::kFp16: return "fp16";
    case DType::kBf16: return "bf16";
  }
  return "unknown";
}

namespace {

// One loop per pair of types, so that the element type is not tested per
// element and the compiler can vectorise each.
// Buffers may sit at any address (slices of a request's bytes): elements are
// moved with memcpy, which compiles to plain (unaligned) loads and stores.
template <typename From, typename To, typename Fn>
void ConvertLoop(const void* src, void* dst, size_t n, Fn fn) {
  const unsigned char* in = static_cast<const unsigned char*>(src);
  unsigned char* out = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < n; ++i) {
    From v;
    memcpy(&v, in + i * sizeof(From), sizeof(From));
    const To r = fn(v);
    memcpy(out + i * sizeof(To), &r, sizeof(To));
  }
}

// Whether every element has an exponent field that is not all ones.
template <typename Bits>
bool ExponentsFinite(const void* data, size_t n, Bits exponent) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  // A branch-free OR over blocks (vectorised), with an early exit per block.
  constexpr size_t kBlock = 256;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t end = begin + kBlock < n ? begin + kBlock : n;
    Bits bad = 0;
    for (size_t i = begin; i < end; ++i) {
      Bits v;
      memcpy(&v, p + i * sizeof(Bits), sizeof(Bits));
      bad |= (v & exponent) == exponent ? Bits{1} : Bits{0};
    }
    if (bad != 0) return false;
  }
  return true;
}

}  // namespace

EMBER_VECTOR_CLONES
void CopyWideRowBytes(void* dst, const void* src, size_t n) {
  unsigned char* out = static_cast<unsigned char*>(dst);
  const unsigned char* in = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; i += 64) memcpy(out + i, in + i, 64);
}

EMBER_VECTOR_CLONES
void ConvertElements(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (st == dt) {
    memcpy(dst, src, n * DTypeSize(st));
    return;
  }
  // The element functions are inlined into each clone of this function.
  switch (st) {
    case DType::kFp32:
      if (dt == DType::kFp16) {
        ConvertLoop<float, uint16_t>(src, dst, n, [](float f) { return FloatToFp16(f); });
      } else {
        ConvertLoop<float, uint16_t>(src, dst, n, [](float f) { return FloatToBf16(f); });
      }
      return;
    case DType::kFp16:
      if (dt == DType::kFp32) {
        ConvertLoop<uint16_t, float>(src, dst, n, [](uint16_t h) { return Fp16ToFloat(h); });
      } else {
        ConvertLoop<uint16_t, uint16_t>(src, dst, n,
                                        [](uint16_t h) { return FloatToBf16(Fp16ToFloat(h)); });
      }
      return;
    case DType::kBf16:
      if (dt == DType::kFp32) {
        ConvertLoop<uint16_t, float>(src, dst, n, [](uint16_t h) { return Bf16ToFloat(h); });
      } else {
        ConvertLoop<uint16_t, uint16_t>(src, dst, n,
                                        [](uint16_t h) { return FloatToFp16(Bf16ToFloat(h)); });
      }
      return;
  }
}

EMBER_VECTOR_CLONES
bool AllFinite(const void* data, DType t, size_t n) {
  switch (t) {
    case DType::kFp32: return ExponentsFinite<uint32_t>(data, n, 0x7f800000u);
    case DType::kFp16: return ExponentsFinite<uint16_t>(data, n, 0x7c00u);
    case DType::kBf16: return ExponentsFinite<uint16_t>(data, n, 0x7f80u);
  }
  return false;
}

}  // namespace ember
