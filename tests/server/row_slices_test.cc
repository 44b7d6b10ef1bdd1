// SerializeWithRowSlices: the bytes are protobuf's for the same message, and
// large rows travel in slices of their own without being copied.
#include "server/row_slices.h"

#include <string>
#include <vector>

#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <gtest/gtest.h>

namespace ember {
namespace {

using google::protobuf::util::MessageDifferencer;

std::string Bytes(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + 31 * i);
  return s;
}

v1::TableRows* AddTable(v1::ExchangeResponse* r, const std::string& name, uint32_t dim,
                        size_t rows_bytes, uint64_t missing) {
  v1::TableRows* t = r->mutable_lookup()->add_tables();
  t->set_table(name);
  t->set_dtype(v1::DTYPE_FP32);
  t->set_dim(dim);
  t->set_missing(missing);
  *t->mutable_rows() = Bytes(rows_bytes, static_cast<char>(name.size()));
  return t;
}

v1::ExchangeResponse Parse(grpc::ByteBuffer* buffer) {
  v1::ExchangeResponse parsed;
  grpc::ProtoBufferReader reader(buffer);
  EXPECT_TRUE(parsed.ParseFromZeroCopyStream(&reader));
  return parsed;
}

std::vector<v1::ExchangeResponse> Responses() {
  std::vector<v1::ExchangeResponse> all;
  all.emplace_back();  // nothing at all
  {
    v1::ExchangeResponse r;  // a push answer alone
    v1::TablePushResult* p = r.mutable_push()->add_tables();
    p->set_table("users");
    p->set_updated(7);
    p->set_inserted(2);
    all.push_back(r);
  }
  {
    v1::ExchangeResponse r;  // an empty lookup is still present
    r.mutable_lookup();
    all.push_back(r);
  }
  {
    v1::ExchangeResponse r;  // push and lookup; rows small, large, none, and long varints
    r.mutable_push()->set_duplicate(true);
    AddTable(&r, "small", 8, 32, 0);
    AddTable(&r, "large", 128, 128 * 4 * 300, 5);
    AddTable(&r, "none", 16, 0, 0);
    AddTable(&r, "exactly_the_threshold", 1, kMinRowSliceBytes, 1);
    AddTable(&r, "over_two_mib", 64, 2 * 1024 * 1024 + 256, 70000);
    all.push_back(r);
  }
  return all;
}

TEST(RowSlicesTest, BytesParseIntoAResponseEqualToTheOriginal) {
  for (const v1::ExchangeResponse& original : Responses()) {
    v1::ExchangeResponse response = original;
    grpc::ByteBuffer buffer = SerializeWithRowSlices(&response);
    EXPECT_EQ(buffer.Length(), original.ByteSizeLong());
    const v1::ExchangeResponse parsed = Parse(&buffer);
    EXPECT_TRUE(MessageDifferencer::Equals(parsed, original))
        << "sent:\n" << original.ShortDebugString().substr(0, 400) << "\nparsed:\n"
        << parsed.ShortDebugString().substr(0, 400);
  }
}

TEST(RowSlicesTest, RowsLeaveTheResponseAndEveryOtherFieldStays) {
  v1::ExchangeResponse response = Responses().back();
  v1::ExchangeResponse expected = response;
  for (v1::TableRows& t : *expected.mutable_lookup()->mutable_tables()) t.clear_rows();
  grpc::ByteBuffer buffer = SerializeWithRowSlices(&response);
  EXPECT_TRUE(MessageDifferencer::Equals(response, expected)) << response.ShortDebugString();
}

TEST(RowSlicesTest, LargeRowsTravelInTheirOwnSlicesWithoutACopyAndOutliveTheResponse) {
  const v1::ExchangeResponse original = Responses().back();
  auto response = std::make_unique<v1::ExchangeResponse>(original);
  // Where the store wrote each table's rows.
  std::vector<std::pair<const char*, size_t>> written;
  for (const v1::TableRows& t : response->lookup().tables()) {
    written.emplace_back(t.rows().data(), t.rows().size());
  }
  grpc::ByteBuffer buffer = SerializeWithRowSlices(response.get());
  response.reset();  // the buffer owns the rows now

  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  int own_slices = 0;
  for (const auto& [data, size] : written) {
    bool found = false;
    for (const grpc::Slice& s : slices) {
      found |= reinterpret_cast<const char*>(s.begin()) == data && s.size() == size;
    }
    EXPECT_EQ(found, size >= kMinRowSliceBytes) << "rows of " << size << " bytes";
    own_slices += found;
  }
  EXPECT_EQ(own_slices, 3);  // large, exactly_the_threshold, over_two_mib
  EXPECT_TRUE(MessageDifferencer::Equals(Parse(&buffer), original));
}

}  // namespace
}  // namespace ember
