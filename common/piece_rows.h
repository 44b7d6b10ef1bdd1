// Fixed-size rows read from a `bytes` field left in gRPC's receive buffers
// (ParseAndClearLeavingInPlace): the value comes as pieces, and a piece
// boundary can fall anywhere, inside a row too.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ember {

// Calls row(j, address) for each whole row j of `row_bytes` (> 0) bytes in
// the pieces taken end to end, in order; `address` points at the row's
// bytes, contiguous and possibly unaligned (read with memcpy). A row that
// straddles pieces is copied once into `*copies` (cleared first) and handed
// out from there; those addresses stay valid until `*copies` is modified.
// Bytes after the last whole row are ignored: callers check the total.
template <typename RowFn>
void ForEachPieceRow(absl::Span<const absl::string_view> pieces, size_t row_bytes,
                     std::string* copies, RowFn row) {
  copies->clear();
  // At most one straddling row ends in each piece: room for all of them up
  // front, so that no earlier address moves.
  copies->reserve(pieces.size() * row_bytes);
  size_t j = 0;
  size_t partial = 0;  // bytes of row j gathered into `copies` so far
  for (absl::string_view p : pieces) {
    size_t at = 0;
    if (partial > 0) {  // finish the row that began in an earlier piece
      const size_t take = std::min(row_bytes - partial, p.size());
      copies->append(p.data(), take);
      partial += take;
      at = take;
      if (partial < row_bytes) continue;
      row(j++, copies->data() + copies->size() - row_bytes);
      partial = 0;
    }
    for (; at + row_bytes <= p.size(); at += row_bytes) row(j++, p.data() + at);
    if (at < p.size()) {
      copies->append(p.data() + at, p.size() - at);
      partial = p.size() - at;
    }
  }
}

}  // namespace ember
