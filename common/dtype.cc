#include "common/dtype.h"

namespace ember {

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFp32: return "fp32";
    case DType::kFp16: return "fp16";
    case DType::kBf16: return "bf16";
  }
  return "unknown";
}

void ConvertElements(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (st == dt) {
    memcpy(dst, src, n * DTypeSize(st));
    return;
  }
  if (dt == DType::kFp32) {
    float* out = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) out[i] = LoadElement(src, st, i);
    return;
  }
  for (size_t i = 0; i < n; ++i) StoreElement(dst, dt, i, LoadElement(src, st, i));
}

}  // namespace ember
