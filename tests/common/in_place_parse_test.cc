// ParseLeavingInPlace: the chosen bytes field is reported as pieces of the
// input, wherever the input is cut, and every message parses as protobuf
// parses it (the differential check of in_place_parse_check.h): genuine
// answers and requests, every truncation of them, and single-byte
// corruptions.
#include "common/in_place_parse.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ember/v1/embedding_service.pb.h"
#include "tests/common/in_place_parse_check.h"

namespace ember::testing {
namespace {

constexpr int kRowsPath[] = {2, 1, 4};       // ExchangeResponse lookup.tables[].rows
constexpr int kGradientsPath[] = {1, 1, 4};  // ExchangeRequest push.tables[].gradients

std::string Bytes(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + 31 * i);
  return s;
}

v1::ExchangeResponse Answer() {
  v1::ExchangeResponse r;
  r.mutable_push()->add_tables()->set_table("users");
  r.mutable_push()->mutable_tables(0)->set_updated(7);
  for (int i = 0; i < 3; ++i) {
    v1::TableRows* t = r.mutable_lookup()->add_tables();
    t->set_table("table" + std::to_string(i));
    t->set_dtype(v1::DTYPE_FP32);
    t->set_dim(8);
    t->set_missing(i * 70000);
    *t->mutable_rows() = Bytes(i == 1 ? 0 : 96 * (i + 1), i);  // one table without rows
  }
  return r;
}

v1::ExchangeRequest Request() {
  v1::ExchangeRequest r;
  r.mutable_push()->set_step(41);
  r.mutable_push()->set_worker_id(3);
  v1::TableGradients* g = r.mutable_push()->add_tables();
  g->set_table("clicks");
  *g->mutable_keys() = Bytes(64, 1);
  *g->mutable_gradients() = Bytes(256, 2);
  r.mutable_lookup()->add_tables()->set_table("clicks");
  *r.mutable_lookup()->mutable_tables(0)->mutable_keys() = Bytes(64, 3);
  return r;
}

// Cuts every `every` bytes, and at random places.
std::vector<size_t> Cuts(size_t size, size_t every, std::mt19937* rng) {
  std::vector<size_t> cuts;
  for (size_t c = every; c < size; c += every) cuts.push_back(c);
  if (size > 0) {
    for (int i = 0; i < 3; ++i) cuts.push_back((*rng)() % size);
  }
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

TEST(InPlaceParseTest, RowsAreReportedAsPiecesOfTheInputAndTheRestIsProtobufs) {
  const v1::ExchangeResponse answer = Answer();
  const std::string bytes = answer.SerializeAsString();
  for (size_t every : {1, 3, 7, 64, 100000}) {
    std::vector<absl::string_view> pieces;
    for (size_t at = 0; at < bytes.size(); at += every) pieces.push_back(absl::string_view(bytes).substr(at, every));
    v1::ExchangeResponse parsed;
    std::vector<std::string> rows;
    ASSERT_TRUE(ParseLeavingInPlace(
        pieces, kRowsPath, &parsed,
        [&](google::protobuf::Message* parent, std::vector<absl::string_view> value) {
          // The parent is the table being parsed: the last one so far.
          EXPECT_EQ(parent, &parsed.lookup().tables(parsed.lookup().tables_size() - 1));
          std::string v;
          for (absl::string_view p : value) {
            EXPECT_GE(p.data(), bytes.data());  // in the input itself, not a copy
            EXPECT_LE(p.data() + p.size(), bytes.data() + bytes.size());
            EXPECT_LE(p.size(), every);
            v.append(p.data(), p.size());
          }
          rows.push_back(v);
        }))
        << every;
    ASSERT_EQ(parsed.lookup().tables_size(), 3);
    // Table 1's rows are empty, so protobuf wrote no field: nothing reported.
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[0], answer.lookup().tables(0).rows());
    EXPECT_EQ(rows[1], answer.lookup().tables(2).rows());
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(parsed.lookup().tables(i).rows().empty());
      EXPECT_EQ(parsed.lookup().tables(i).table(), answer.lookup().tables(i).table());
      EXPECT_EQ(parsed.lookup().tables(i).missing(), answer.lookup().tables(i).missing());
    }
    EXPECT_EQ(parsed.push().tables(0).updated(), 7u);
  }
}

TEST(InPlaceParseTest, EveryTruncationIsJudgedAsProtobufJudgesIt) {
  std::mt19937 rng(5);
  const std::string answer = Answer().SerializeAsString();
  const std::string request = Request().SerializeAsString();
  for (size_t n = 0; n <= answer.size(); ++n) {
    const std::string bytes = answer.substr(0, n);
    EXPECT_EQ(CheckInPlaceParse<v1::ExchangeResponse>(bytes, kRowsPath, Cuts(n, 5, &rng)), "")
        << "answer cut to " << n << " bytes";
  }
  for (size_t n = 0; n <= request.size(); ++n) {
    const std::string bytes = request.substr(0, n);
    EXPECT_EQ(CheckInPlaceParse<v1::ExchangeRequest>(bytes, kGradientsPath, Cuts(n, 11, &rng)), "")
        << "request cut to " << n << " bytes";
  }
}

TEST(InPlaceParseTest, CorruptedBytesAreJudgedAsProtobufJudgesThem) {
  std::mt19937 rng(9);
  const std::string answer = Answer().SerializeAsString();
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = answer;
    for (int k = 0; k < 1 + i % 3; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    EXPECT_EQ(CheckInPlaceParse<v1::ExchangeResponse>(bytes, kRowsPath, Cuts(bytes.size(), 13, &rng)),
              "")
        << "corruption " << i;
    v1::ExchangeResponse m;
    refused += !m.ParseFromString(bytes);
  }
  EXPECT_GT(refused, 100);  // the corruptions reach the refusing paths too
}

TEST(InPlaceParseTest, ARepeatedFieldKeepsTheLastValueAndAMergedMessageItsTables) {
  // Two lookups (protobuf merges them: 2 tables), the first table with two
  // rows fields (the last wins).
  v1::TableRows t;
  t.set_table("a");
  t.set_rows("first");
  std::string table_bytes = t.SerializeAsString();
  t.Clear();
  t.set_rows("second");
  table_bytes += t.SerializeAsString();
  // Table 0 as written above, two rows fields and all.
  std::string lookup_bytes;
  lookup_bytes += static_cast<char>(0x0a);  // LookupResponse.tables, length-delimited
  lookup_bytes += static_cast<char>(table_bytes.size());
  lookup_bytes += table_bytes;
  std::string bytes;
  bytes += static_cast<char>(0x12);  // ExchangeResponse.lookup
  bytes += static_cast<char>(lookup_bytes.size());
  bytes += lookup_bytes;
  v1::ExchangeResponse second;
  second.mutable_lookup()->add_tables()->set_table("b");
  bytes += second.SerializeAsString();
  std::mt19937 rng(1);
  EXPECT_EQ(CheckInPlaceParse<v1::ExchangeResponse>(bytes, kRowsPath, Cuts(bytes.size(), 4, &rng)),
            "");
  v1::ExchangeResponse theirs;
  ASSERT_TRUE(theirs.ParseFromString(bytes));
  ASSERT_EQ(theirs.lookup().tables_size(), 2);
  EXPECT_EQ(theirs.lookup().tables(0).rows(), "second");
}

// Protobuf reads a tag from at most 5 bytes (dropping bits past 32) and a
// length from at most 5; the fuzz target found the first difference.
TEST(InPlaceParseTest, TagsAndLengthsAreReadAsProtobufReadsThem) {
  const std::string answer = Answer().SerializeAsString();
  const std::string cases[] = {
      std::string("\xdd\xf2\xf2\xac\x2c", 5) + "abcd",   // 5-byte tag, high bits set: fixed32
      std::string("\x8d\x80\x80\x80\x80\x00", 6) + "abcd",  // a 6-byte tag
      std::string("\x12\x80\x80\x80\x80\x80\x00", 7),      // lookup, a 6-byte length
      std::string("\x12\x80\x80\x80\x80\x08", 6),          // lookup, a length of 2 GiB
      std::string("\x12\x80\x80\x80\x80\x00", 6),          // lookup, an overlong 0
  };
  std::mt19937 rng(3);
  for (const std::string& tail : cases) {
    const std::string bytes = answer + tail;
    EXPECT_EQ(CheckInPlaceParse<v1::ExchangeResponse>(bytes, kRowsPath, Cuts(bytes.size(), 3, &rng)),
              "");
  }
  v1::ExchangeResponse m;
  EXPECT_TRUE(m.ParseFromString(answer + cases[0]));   // protobuf accepts these two
  EXPECT_TRUE(m.ParseFromString(answer + cases[4]));
  EXPECT_FALSE(m.ParseFromString(answer + cases[1]));  // and refuses the others
  EXPECT_FALSE(m.ParseFromString(answer + cases[2]));
  EXPECT_FALSE(m.ParseFromString(answer + cases[3]));
}

TEST(InPlaceParseTest, AGroupIsRefusedThoughProtobufSkipsIt) {
  std::string bytes = Answer().SerializeAsString();
  bytes += "\x1b\x08\x01\x1c";  // field 3 as a group holding field 1 = 1
  v1::ExchangeResponse theirs;
  ASSERT_TRUE(theirs.ParseFromString(bytes));
  ASSERT_TRUE(HasGroup(theirs));
  v1::ExchangeResponse ours;
  const std::vector<absl::string_view> pieces = {bytes};
  EXPECT_FALSE(ParseLeavingInPlace(pieces, kRowsPath, &ours,
                                   [](google::protobuf::Message*, std::vector<absl::string_view>) {}));
}

TEST(InPlaceParseTest, APathThatDoesNotEndInABytesFieldIsRefused) {
  const std::string bytes = Answer().SerializeAsString();
  const std::vector<absl::string_view> pieces = {bytes};
  v1::ExchangeResponse m;
  auto ignore = [](google::protobuf::Message*, std::vector<absl::string_view>) {};
  const int to_string[] = {2, 1, 1};   // TableRows.table is a string
  const int to_message[] = {2, 1};     // a message, not bytes
  const int unknown[] = {2, 9, 4};
  EXPECT_FALSE(ParseLeavingInPlace(pieces, to_string, &m, ignore));
  EXPECT_FALSE(ParseLeavingInPlace(pieces, to_message, &m, ignore));
  EXPECT_FALSE(ParseLeavingInPlace(pieces, unknown, &m, ignore));
}

}  // namespace
}  // namespace ember::testing
