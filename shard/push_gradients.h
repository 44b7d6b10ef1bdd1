// The gradients of a push's table, read from where the request's bytes
// are: the shard's decoding of the wire's TableGradients into the rows a
// store applies (kernels/embedding_store.h GradientRows), without copying
// them where it can.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "ember/v1/embedding_service.pb.h"
#include "kernels/embedding_store.h"

namespace ember {

// Rows at least this long are read by address where they arrived; shorter
// ones split between pieces are packed into one buffer first. Reading by
// address saves the copy but costs a few ns per row (the address array, and
// rows at any alignment read in the apply pass's random order), which only
// wide rows repay: bench/push_parse_bench, in place against protobuf's
// copy, measured 1.02, 1.09, 1.03, 0.98 and 0.93 at dims 8, 32, 64, 128 and
// 256 (fp32) with every field split this way.
inline constexpr size_t kByAddressMinRowBytes = 512;

// A table's gradients, read where they are: the field, one piece as it
// lies, or several pieces by row address (wide rows; a row split between
// pieces is copied into `*copies`, and the addresses are appended to
// `*addresses`, which must have room for them: no reallocation) or packed
// into `*copies`. Pieces that do not hold exactly the rows asked for are
// packed, for the store to report their size as it does a field's.
//
// `pieces` null: the field `t.gradients()`. The result points into `t`,
// `pieces`, `*addresses` and `*copies`, which must outlive its use.
GradientRows GradientsOf(const v1::TableGradients& t, const std::vector<absl::string_view>* pieces,
                         size_t rows, size_t row_bytes, std::vector<const uint8_t*>* addresses,
                         std::string* copies);

}  // namespace ember
