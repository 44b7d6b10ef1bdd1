// ExchangeAnswer: rows read in place from gRPC's receive slices, wherever
// the slices cut them (a row across two or more slices is copied once), the
// same rows from a unary answer's fields, and the message protobuf would
// have parsed.
#include "ember/exchange_answer.h"

#include <string>
#include <vector>

#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/support/byte_buffer.h>
#include <gtest/gtest.h>

#include "client/internal/exchange_answer_fill.h"

namespace ember {
namespace {

constexpr size_t kRowBytes = 12;

v1::ExchangeResponse Answer() {
  v1::ExchangeResponse r;
  r.mutable_push()->set_duplicate(true);
  for (int i = 0; i < 3; ++i) {
    v1::TableRows* t = r.mutable_lookup()->add_tables();
    t->set_table("t" + std::to_string(i));
    t->set_dim(3);
    std::string rows((i + 1) * 9 * kRowBytes, '\0');
    for (size_t b = 0; b < rows.size(); ++b) rows[b] = static_cast<char>(i * 50 + b * 7);
    *t->mutable_rows() = rows;
  }
  return r;
}

// The serialised answer as gRPC would hand it over: in slices of `every` bytes.
grpc::ByteBuffer InSlices(const std::string& bytes, size_t every) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += every) {
    slices.emplace_back(bytes.data() + at, std::min(every, bytes.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// Table i's rows as ForEachRow hands them over, checking the row indices.
std::string RowsOf(const ExchangeAnswer& a, int i) {
  std::string rows;
  size_t next = 0;
  a.ForEachRow(i, kRowBytes, [&](size_t j, const char* row) {
    EXPECT_EQ(j, next++);
    rows.append(row, kRowBytes);
  });
  return rows;
}

TEST(ExchangeAnswerTest, RowsCutAnywhereBySlicesAreReadWhole) {
  const v1::ExchangeResponse answer = Answer();
  const std::string bytes = answer.SerializeAsString();
  // Slices smaller than a row, a row apart, and larger; one whole buffer.
  for (size_t every : {1, 5, 12, 13, 40, 4096}) {
    grpc::ByteBuffer buffer = InSlices(bytes, every);
    ExchangeAnswer a;
    ASSERT_TRUE(internal::ExchangeAnswerFill::Parse(a, &buffer)) << every;
    EXPECT_EQ(buffer.Length(), 0u);  // the answer took the slices
    ASSERT_EQ(a.message().lookup().tables_size(), 3);
    EXPECT_TRUE(a.message().push().duplicate());
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(a.message().lookup().tables(i).rows().empty());  // left in place
      EXPECT_EQ(a.message().lookup().tables(i).table(), answer.lookup().tables(i).table());
      EXPECT_EQ(a.rows_size(i), answer.lookup().tables(i).rows().size());
      EXPECT_EQ(RowsOf(a, i), answer.lookup().tables(i).rows()) << "slices of " << every;
    }
  }
}

TEST(ExchangeAnswerTest, AddressesOfEveryTableStayValidTogether) {
  const v1::ExchangeResponse answer = Answer();
  grpc::ByteBuffer buffer = InSlices(answer.SerializeAsString(), 7);
  ExchangeAnswer a;
  ASSERT_TRUE(internal::ExchangeAnswerFill::Parse(a, &buffer));
  // Collect every row's address first (as the StepMerger does), read after.
  std::vector<std::vector<const char*>> at(3);
  for (int i = 0; i < 3; ++i) {
    a.ForEachRow(i, kRowBytes, [&](size_t, const char* row) { at[i].push_back(row); });
  }
  for (int i = 0; i < 3; ++i) {
    std::string rows;
    for (const char* row : at[i]) rows.append(row, kRowBytes);
    EXPECT_EQ(rows, answer.lookup().tables(i).rows());
  }
}

TEST(ExchangeAnswerTest, TakeMessageGivesProtobufsParse) {
  const v1::ExchangeResponse answer = Answer();
  grpc::ByteBuffer buffer = InSlices(answer.SerializeAsString(), 9);
  ExchangeAnswer a;
  ASSERT_TRUE(internal::ExchangeAnswerFill::Parse(a, &buffer));
  const v1::ExchangeResponse taken = a.TakeMessage();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(taken, answer));
  EXPECT_EQ(a.message().lookup().tables_size(), 0);  // the answer is empty after
}

TEST(ExchangeAnswerTest, AUnaryAnswerReadsTheSameFromItsFields) {
  const v1::ExchangeResponse answer = Answer();
  ExchangeAnswer a;
  grpc::ByteBuffer buffer = InSlices(answer.SerializeAsString(), 5);
  ASSERT_TRUE(internal::ExchangeAnswerFill::Parse(a, &buffer));
  *internal::ExchangeAnswerFill::MutableMessage(a) = answer;  // a unary call's parse: the rows in their fields
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.rows_size(i), answer.lookup().tables(i).rows().size());
    EXPECT_EQ(RowsOf(a, i), answer.lookup().tables(i).rows());
  }
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(a.TakeMessage(), answer));
}

TEST(ExchangeAnswerTest, BytesThatAreNotAnAnswerAreRefusedAndLeaveItEmpty) {
  std::string bytes = Answer().SerializeAsString();
  bytes.resize(bytes.size() - 3);  // the last table's rows cut short
  grpc::ByteBuffer buffer = InSlices(bytes, 16);
  ExchangeAnswer a;
  EXPECT_FALSE(internal::ExchangeAnswerFill::Parse(a, &buffer));
  EXPECT_EQ(a.message().lookup().tables_size(), 0);
  EXPECT_EQ(a.message().ByteSizeLong(), 0u);
}

}  // namespace
}  // namespace ember
