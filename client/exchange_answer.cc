#include "ember/exchange_answer.h"

#include <unordered_map>

#include "common/in_place_parse.h"
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
  return static_cast<size_t>(i) < in_place_.size() && in_place_[i] ? &pieces_[i] : nullptr;
}

bool ExchangeAnswer::Parse(grpc::ByteBuffer* bytes) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  const bool dumped = bytes->Dump(slices.get()).ok();
  bytes->Clear();
  std::vector<absl::string_view> views;
  views.reserve(slices->size());
  for (const grpc::Slice& s : *slices) {
    views.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  std::unordered_map<const google::protobuf::Message*, std::vector<absl::string_view>> rows;
  const bool parsed =
      dumped && ParseLeavingInPlace(views, kRowsPath, &message_,
                                    [&](google::protobuf::Message* table,
                                        std::vector<absl::string_view> value) {
                                      rows[table] = std::move(value);  // the last one wins
                                    });
  const int tables = parsed ? message_.lookup().tables_size() : 0;
  pieces_.resize(tables);
  in_place_.assign(tables, false);
  straddled_.resize(tables);
  for (int i = 0; i < tables; ++i) {
    auto it = rows.find(&message_.lookup().tables(i));
    pieces_[i].clear();
    if (it == rows.end()) continue;  // no rows on the wire: the empty field says so
    pieces_[i] = std::move(it->second);
    in_place_[i] = true;
  }
  slices_ = parsed ? std::move(slices) : nullptr;
  if (!parsed) message_.Clear();
  return parsed;
}

v1::ExchangeResponse* ExchangeAnswer::mutable_message() {
  pieces_.clear();
  in_place_.clear();
  slices_ = nullptr;
  return &message_;
}

v1::ExchangeResponse ExchangeAnswer::TakeMessage() {
  for (int i = 0; i < static_cast<int>(in_place_.size()); ++i) {
    if (!in_place_[i]) continue;
    std::string* field = message_.mutable_lookup()->mutable_tables(i)->mutable_rows();
    field->clear();
    field->reserve(rows_size(i));
    for (absl::string_view p : pieces_[i]) field->append(p.data(), p.size());
  }
  v1::ExchangeResponse out = std::move(message_);
  message_.Clear();
  mutable_message();
  return out;
}

}  // namespace ember
