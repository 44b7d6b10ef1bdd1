#include "shard/push_gradients.h"

#include "common/piece_rows.h"

namespace ember {

GradientRows GradientsOf(const v1::TableGradients& t, const std::vector<absl::string_view>* pieces,
                         size_t rows, size_t row_bytes, std::vector<const uint8_t*>* addresses,
                         std::string* copies) {
  auto packed = [](absl::string_view bytes) {
    return GradientRows(
        absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  };
  if (pieces == nullptr) return packed(t.gradients());
  if (pieces->size() == 1) return packed(pieces->front());
  size_t bytes = 0;
  for (absl::string_view p : *pieces) bytes += p.size();
  if (bytes != rows * row_bytes || row_bytes < kByAddressMinRowBytes) {
    copies->clear();
    copies->reserve(bytes);
    for (absl::string_view p : *pieces) copies->append(p.data(), p.size());
    return packed(*copies);
  }
  const size_t first = addresses->size();
  ForEachPieceRow(*pieces, row_bytes, copies, [&](size_t, const char* row) {
    addresses->push_back(reinterpret_cast<const uint8_t*>(row));
  });
  return GradientRows(absl::Span<const uint8_t* const>(addresses->data() + first, rows), row_bytes);
}

}  // namespace ember
