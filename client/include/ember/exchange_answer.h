// ExchangeAnswer: one shard's ExchangeResponse, with the rows of its lookup
// left where they arrived.
//
// Client::Exchange fills these for callers that read each row once, to
// where it is used (the StepMerger, the pipelines): over an exchange stream
// the rows stay in gRPC's receive buffers instead of being copied into the
// response's `rows` strings first. Over a unary call they are in the
// strings, and read the same way.
//
// Thread safety: none (one owner); movable, not copyable. The row addresses
// ForEachRow hands out are valid while the answer lives unchanged.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/piece_rows.h"
#include "ember/v1/embedding_service.pb.h"

namespace ember {
namespace internal {
struct ExchangeAnswerFill;
}  // namespace internal

class ExchangeAnswer {
 public:
  ExchangeAnswer() = default;
  ExchangeAnswer(ExchangeAnswer&&) = default;
  ExchangeAnswer& operator=(ExchangeAnswer&&) = default;

  // Every field of the response, except that the `rows` of a lookup table
  // left in place are empty here: read rows with rows_size and ForEachRow.
  const v1::ExchangeResponse& message() const { return message_; }

  // Bytes of the rows of lookup table i (0 <= i < message().lookup().tables_size()).
  size_t rows_size(int i) const;

  // Calls row(j, address) for each row j of lookup table i, in order, where
  // a row is `row_bytes` bytes (> 0, dividing rows_size(i)) and `address`
  // points at them, contiguous and possibly unaligned (read with memcpy).
  // A row that straddles two receive buffers is copied once into the answer
  // first; such a copy lasts until the next ForEachRow on the same table.
  template <typename RowFn>
  void ForEachRow(int i, size_t row_bytes, RowFn row) const;

  // The response as protobuf would have parsed it: the rows copied into
  // their fields. Leaves the answer empty.
  v1::ExchangeResponse TakeMessage();

  // Empties the answer.
  void Clear();

 private:
  // The channels fill answers (client/internal/exchange_answer_fill.h).
  friend struct internal::ExchangeAnswerFill;
  // Drops any rows held in place; the message for a parser that stores the
  // rows in their fields.
  v1::ExchangeResponse* mutable_message();

  // The pieces of table i's rows held in place; null when they are in the
  // message's field.
  const std::vector<absl::string_view>* InPlace(int i) const;

  v1::ExchangeResponse message_;
  // Per lookup table: its rows' pieces, or null when they are in the
  // message's field; they point into fields_.
  std::vector<const std::vector<absl::string_view>*> pieces_;
  std::vector<std::pair<const google::protobuf::Message*, std::vector<absl::string_view>>>
      fields_;
  std::shared_ptr<const void> slices_;  // the receive buffers the pieces point into
  mutable std::vector<std::string> straddled_;  // per table: rows copied out of two pieces
};

template <typename RowFn>
void ExchangeAnswer::ForEachRow(int i, size_t row_bytes, RowFn row) const {
  const std::vector<absl::string_view>* pieces = InPlace(i);
  if (pieces == nullptr) {
    const std::string& field = message_.lookup().tables(i).rows();
    for (size_t j = 0, n = field.size() / row_bytes; j < n; ++j) row(j, field.data() + j * row_bytes);
    return;
  }
  ForEachPieceRow(*pieces, row_bytes, &straddled_[i], row);
}

}  // namespace ember
