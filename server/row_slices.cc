#include "server/row_slices.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/repeated_ptr_field.h>
#include <grpcpp/support/slice.h>

namespace ember {
namespace {

using google::protobuf::io::CodedOutputStream;

// Tag of a length-delimited field (all the fields written here are < 16, so
// their tags are one byte).
constexpr char LengthTag(int field) { return static_cast<char>((field << 3) | 2); }

size_t LengthFieldBytes(size_t payload) {
  return 1 + CodedOutputStream::VarintSize64(payload) + payload;
}

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void AppendLengthPrefix(int field, size_t payload, std::string* out) {
  out->push_back(LengthTag(field));
  AppendVarint(payload, out);
}

// Small byte runs are gathered into one slice; large row buffers become
// slices that own them.
class SliceList {
 public:
  std::string* small() { return &small_; }

  void AddOwned(std::string&& bytes) {
    if (bytes.size() < kMinRowSliceBytes) {
      small_ += bytes;
      return;
    }
    FlushSmall();
    auto* held = new std::string(std::move(bytes));
    slices_.emplace_back(
        held->data(), held->size(), [](void* p) { delete static_cast<std::string*>(p); }, held);
  }

  grpc::ByteBuffer Finish() {
    FlushSmall();
    return grpc::ByteBuffer(slices_.data(), slices_.size());
  }

 private:
  void FlushSmall() {
    if (small_.empty()) return;
    slices_.emplace_back(small_);  // copies the few header bytes
    small_.clear();
  }

  std::string small_;
  std::vector<grpc::Slice> slices_;
};

}  // namespace

grpc::ByteBuffer SerializeWithRowSlices(v1::ExchangeResponse* response) {
  SliceList out;
  if (!response->has_lookup()) {
    response->AppendToString(out.small());
    return out.Finish();
  }
  // Every field but `lookup`, by protobuf (they come before it in field
  // order, as protobuf would write them).
  std::unique_ptr<v1::LookupResponse> lookup(response->release_lookup());
  response->AppendToString(out.small());

  // The lookup's tables apart from its other fields, and each table's rows
  // apart from the table, so that the sizes below are of what protobuf
  // serialises.
  google::protobuf::RepeatedPtrField<v1::TableRows> tables;
  tables.Swap(lookup->mutable_tables());
  const std::string lookup_rest = lookup->SerializeAsString();
  std::vector<std::string> rows(tables.size());
  std::vector<std::string> heads(tables.size());
  std::vector<size_t> table_bytes(tables.size());
  size_t lookup_bytes = lookup_rest.size();
  for (int i = 0; i < tables.size(); ++i) {
    rows[i].swap(*tables[i].mutable_rows());
    heads[i] = tables[i].SerializeAsString();
    table_bytes[i] = heads[i].size() + (rows[i].empty() ? 0 : LengthFieldBytes(rows[i].size()));
    lookup_bytes += LengthFieldBytes(table_bytes[i]);
  }

  AppendLengthPrefix(v1::ExchangeResponse::kLookupFieldNumber, lookup_bytes, out.small());
  for (int i = 0; i < tables.size(); ++i) {
    AppendLengthPrefix(v1::LookupResponse::kTablesFieldNumber, table_bytes[i], out.small());
    *out.small() += heads[i];
    if (rows[i].empty()) continue;
    AppendLengthPrefix(v1::TableRows::kRowsFieldNumber, rows[i].size(), out.small());
    out.AddOwned(std::move(rows[i]));
  }
  *out.small() += lookup_rest;

  tables.Swap(lookup->mutable_tables());
  response->set_allocated_lookup(lookup.release());
  return out.Finish();
}

}  // namespace ember
