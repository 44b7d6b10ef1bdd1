// Serving tables: written by WriteServingTable (ember-export), read back by
// ServingTable, and refused when damaged.
#include "kernels/serving_table.h"

#include <unistd.h>

#include <fstream>

#include "common/file_system.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/embedding_store.h"
#include "kernels/table_config_proto.h"
#include "tests/server/requests.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

class ServingTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = AdagradTable("emb", 3);
    config_.set_dtype(v1::DTYPE_BF16);  // initial rows round to the storage dtype
    keys_ = {5, 17, 1000, ~uint64_t{0}};
    rows_ = {0.1f, 0.2f, 0.3f, 1.5f, -2.25f, 3.0f, 7.0f, 8.0f, 9.0f, -1.0f, -0.5f, 0.125f};
  }
  // A file of this test's own: CTest runs the tests of this binary in
  // parallel processes, which must not share a path.
  static std::string TestFile(const char* suffix) {
    return JoinPath(::testing::TempDir(),
                    absl::StrCat(::testing::UnitTest::GetInstance()->current_test_info()->name(),
                                 "-", getpid(), suffix));
  }
  std::string Write(DType dtype) {
    const std::string path = TestFile(".emb");
    EXPECT_OK(WriteServingTable(path, config_, keys_, rows_, dtype));
    return path;
  }
  v1::TableConfig config_;
  std::vector<uint64_t> keys_;
  std::vector<float> rows_;
};

TEST_F(ServingTableTest, Fp32RowsReadBackExactlyAndMissingKeysGetTheShardsInitialRow) {
  auto table = ServingTable::Load(Write(DType::kFp32));
  ASSERT_OK(table);
  EXPECT_EQ((*table)->size(), 4u);
  EXPECT_EQ((*table)->config().name(), "emb");
  const std::vector<uint64_t> query = {1000, 42, 5};
  std::vector<float> out(query.size() * 3);
  std::vector<uint8_t> found(query.size());
  ASSERT_OK((*table)->Lookup(query, absl::MakeSpan(out), found.data()));
  EXPECT_EQ(found, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 3), (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(std::vector<float>(out.begin() + 6, out.end()),
            (std::vector<float>{0.1f, 0.2f, 0.3f}));
  // Key 42 is not in the file: the row a shard's read-only lookup gives.
  auto store = NewCpuStore(*TableConfigFromProto(*NormalizeTableConfig(config_)));
  ASSERT_OK(store);
  std::vector<float> initial(3);
  const std::vector<uint64_t> k42 = {42};
  ASSERT_OK((*store)->Find(k42, DType::kFp32, MutableBytes(initial)));
  EXPECT_EQ(std::vector<float>(out.begin() + 3, out.begin() + 6), initial);
}

TEST_F(ServingTableTest, Fp16FileHoldsRowsRoundedToFp16) {
  auto table = ServingTable::Load(Write(DType::kFp16));
  ASSERT_OK(table);
  std::vector<float> out(keys_.size() * 3);
  ASSERT_OK((*table)->Lookup(keys_, absl::MakeSpan(out)));
  std::vector<float> want = rows_;
  for (float& v : want) v = RoundTo(DType::kFp16, v);
  EXPECT_EQ(out, want);
  EXPECT_EQ((*table)->dtype(), DType::kFp16);
}

TEST_F(ServingTableTest, UnsortedKeysAndWrongShapesAreRefusedNamingTheField) {
  const std::string path = TestFile("-bad.emb");
  std::vector<uint64_t> unsorted = {5, 3, 9, 10};
  absl::Status s = WriteServingTable(path, config_, unsorted, rows_, DType::kFp32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("field 'keys'"), std::string::npos) << s;
  s = WriteServingTable(path, config_, keys_, std::vector<float>(5), DType::kFp32);
  EXPECT_NE(s.message().find("field 'rows'"), std::string::npos) << s;
  s = WriteServingTable(path, config_, keys_, rows_, DType::kBf16);
  EXPECT_NE(s.message().find("field 'dtype'"), std::string::npos) << s;
  auto table = ServingTable::Load(Write(DType::kFp32));
  ASSERT_OK(table);
  std::vector<float> small(2);
  EXPECT_EQ((*table)->Lookup(keys_, absl::MakeSpan(small)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ServingTableTest, DamagedFilesAreRefusedNamingTheFault) {
  const std::string path = Write(DType::kFp32);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto load_with = [&](std::string data) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
    return ServingTable::Load(path).status();
  };
  std::string flipped = bytes;
  flipped[bytes.size() - 10] ^= 1;
  absl::Status s = load_with(flipped);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("CRC32C mismatch"), std::string::npos) << s;
  s = load_with(bytes.substr(0, bytes.size() - 8));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("do not add up"), std::string::npos) << s;
  std::string version = bytes;
  version[8] = 9;
  s = load_with(version);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("format version 9"), std::string::npos) << s;
  s = load_with("EMBERXXX" + bytes.substr(8));
  EXPECT_NE(s.message().find("bad magic"), std::string::npos) << s;
}

}  // namespace
}  // namespace ember::testing
