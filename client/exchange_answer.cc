#include "ember/exchange_answer.h"

#include "client/internal/exchange_answer_fill.h"

#include "common/aliased_serialize.h"
#include "grpcpp/support/byte_buffer.h"

namespace ember {

// ExchangeResponse.lookup (2) -> LookupResponse.tables (1) -> TableRows.rows (4).
constexpr int kRowsPath[] = {2, 1, 4};

size_t ExchangeAnswer::rows_size(int i) const {
  const std::vector<absl::string_view>* pieces = InPlace(i);
  if (pieces == nullptr) return message_.lookup().tables(i).rows().size();
  size_t n = 0;
  for (absl::string_view p : *pieces) n += p.size();
  return n;
}

const std::vector<absl::string_view>* ExchangeAnswer::InPlace(int i) const {
  return static_cast<size_t>(i) < pieces_.size() ? pieces_[i] : nullptr;
}

bool internal::ExchangeAnswerFill::Parse(ExchangeAnswer& a, grpc::ByteBuffer* bytes) {
  a.slices_ = ParseAndClearLeavingInPlace(bytes, kRowsPath, &a.message_, &a.fields_);
  const int tables = a.slices_ != nullptr ? a.message_.lookup().tables_size() : 0;
  a.pieces_.resize(tables);
  a.straddled_.resize(tables);
  // A table without rows on the wire reads its (empty) field.
  for (int i = 0; i < tables; ++i) {
    a.pieces_[i] = FindInPlace(a.fields_, a.message_.lookup().tables(i));
  }
  return a.slices_ != nullptr;
}

v1::ExchangeResponse* internal::ExchangeAnswerFill::MutableMessage(ExchangeAnswer& a) {
  return a.mutable_message();
}

void ExchangeAnswer::Clear() { mutable_message()->Clear(); }

v1::ExchangeResponse* ExchangeAnswer::mutable_message() {
  pieces_.clear();
  fields_.clear();
  slices_ = nullptr;
  return &message_;
}

v1::ExchangeResponse ExchangeAnswer::TakeMessage() {
  for (int i = 0; i < static_cast<int>(pieces_.size()); ++i) {
    if (pieces_[i] == nullptr) continue;
    std::string* field = message_.mutable_lookup()->mutable_tables(i)->mutable_rows();
    field->clear();
    field->reserve(rows_size(i));
    for (absl::string_view p : *pieces_[i]) field->append(p.data(), p.size());
  }
  v1::ExchangeResponse out = std::move(message_);
  message_.Clear();
  mutable_message();
  return out;
}

}  // namespace ember
