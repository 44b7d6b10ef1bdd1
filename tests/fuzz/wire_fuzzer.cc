// Fuzzes the wire packing: keys viewed from `bytes` fields at any alignment,
// and rows converted to and from the 16-bit storage dtypes.
//
// Checked: keys viewed and packed again give the same bytes; every non-NaN
// fp16 and bf16 value converts to float and back unchanged; float to fp16
// and bf16 rounds to the nearest representable value.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/wire.h"

namespace {

[[noreturn]] void Fail(const char* what, uint32_t bits) {
  fprintf(stderr, "wire_fuzzer: %s (bits 0x%08x)\n", what, bits);
  abort();
}

bool IsNanFp16(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool IsNanBf16(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

// Whether `h` is the nearest finite value to `f` among `h` and its neighbours
// of the same sign (`decode` maps encodings to floats, `max_finite` is the
// largest finite magnitude encoding).
template <typename Decode>
bool Nearest(float f, uint16_t h, uint16_t max_finite, Decode decode) {
  const double err = std::fabs(static_cast<double>(decode(h)) - f);
  const uint16_t sign = h & 0x8000u;
  const uint16_t mag = h & 0x7fffu;
  if (mag > 0 && std::fabs(static_cast<double>(decode(sign | (mag - 1))) - f) < err) return false;
  if (mag < max_finite && std::fabs(static_cast<double>(decode(sign | (mag + 1))) - f) < err) {
    return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember;
  if (size == 0) return 0;
  // Keys at the alignment the first byte picks.
  const size_t shift = data[0] % 8;
  std::string buffer(shift, '\0');
  buffer.append(reinterpret_cast<const char*>(data) + 1, size - 1);
  const absl::string_view bytes(buffer.data() + shift, size - 1);
  std::vector<uint64_t> storage;
  const absl::Span<const uint64_t> keys = KeysView(bytes, &storage);
  if (keys.size() != bytes.size() / 8 ||
      PackKeys(keys) != bytes.substr(0, keys.size() * 8)) {
    Fail("keys viewed and packed differ", static_cast<uint32_t>(shift));
  }
  // The same bytes as 16-bit values and as floats.
  for (size_t i = 0; i + 2 <= bytes.size(); i += 2) {
    uint16_t h;
    memcpy(&h, bytes.data() + i, 2);
    if (!IsNanFp16(h) && FloatToFp16(Fp16ToFloat(h)) != h) Fail("fp16 round trip", h);
    if (!IsNanBf16(h) && FloatToBf16(Bf16ToFloat(h)) != h) Fail("bf16 round trip", h);
  }
  for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
    float f;
    memcpy(&f, bytes.data() + i, 4);
    if (!std::isfinite(f)) continue;
    if (std::fabs(f) <= 65504.0f && !Nearest(f, FloatToFp16(f), 0x7bffu, Fp16ToFloat)) {
      Fail("fp16 not the nearest", FloatBits(f));
    }
    const uint16_t b = FloatToBf16(f);
    if ((b & 0x7fffu) < 0x7f80u && !Nearest(f, b, 0x7f7fu, Bf16ToFloat)) {
      Fail("bf16 not the nearest", FloatBits(f));
    }
    // A row element stored in each dtype loads back as its rounding.
    for (DType t : {DType::kFp32, DType::kFp16, DType::kBf16}) {
      alignas(4) unsigned char row[4];
      StoreElement(row, t, 0, f);
      const float expected = t == DType::kFp32   ? f
                             : t == DType::kFp16 ? Fp16ToFloat(FloatToFp16(f))
                                                 : Bf16ToFloat(FloatToBf16(f));
      if (FloatBits(LoadElement(row, t, 0)) != FloatBits(expected)) Fail("element store/load", FloatBits(f));
    }
  }
  return 0;
}
