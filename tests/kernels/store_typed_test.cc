// The EmbeddingStore contract, run against every store implementation.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "absl/base/casts.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/initializer_math.h"
#include "tests/kernels/store_implementations.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

template <typename Factory>
class StoreTest : public StoreTestBase<Factory> {
 protected:
  std::vector<float> FindRows(EmbeddingStore& s, const std::vector<uint64_t>& keys,
                              std::vector<uint8_t>* found = nullptr) {
    std::vector<float> out(keys.size() * s.config().dim);
    std::vector<uint8_t> f(keys.size());
    auto r = s.Find(keys, DType::kFp32, MutableBytes(out), f.data());
    EXPECT_OK(r);
    if (found) *found = f;
    return out;
  }
  std::vector<float> InsertRows(EmbeddingStore& s, const std::vector<uint64_t>& keys) {
    std::vector<float> out(keys.size() * s.config().dim);
    EXPECT_OK(s.FindOrInsert(keys, DType::kFp32, MutableBytes(out)));
    return out;
  }
  // The initial row of `key` computed straight from the initializer math.
  static std::vector<float> Initial(const TableConfig& c, uint64_t key) {
    std::vector<float> row(c.dim);
    init::InitialRow(c.initializer, key, c.dim, DType::kFp32, row.data());
    for (float& v : row) v = RoundTo(c.dtype, v);
    return row;
  }
};
TYPED_TEST_SUITE(StoreTest, StoreImplementations, StoreImplementationNames);

TYPED_TEST(StoreTest, FindOfMissingKeyReturnsInitialRowWithoutStoringIt) {
  auto store = this->MakeStore(SmallTable());
  std::vector<uint8_t> found;
  std::vector<float> rows = this->FindRows(*store, {7, 8}, &found);
  EXPECT_EQ(found, (std::vector<uint8_t>{0, 0}));
  std::vector<float> expected = this->Initial(store->config(), 7);
  std::vector<float> expected8 = this->Initial(store->config(), 8);
  expected.insert(expected.end(), expected8.begin(), expected8.end());
  EXPECT_EQ(rows, expected);
  EXPECT_EQ(store->Stats().rows, 0u);
}

// Regression: Find counted every occurrence of a missing key, FindOrInsert
// each distinct key once.
TYPED_TEST(StoreTest, MissingCountsDistinctKeysInFindAndFindOrInsertAlike) {
  auto store = this->MakeStore(SmallTable());
  const std::vector<uint64_t> keys = {5, 9, 5, 5, 11, 9};
  std::vector<float> out(keys.size() * store->config().dim);
  auto read = store->Find(keys, DType::kFp32, MutableBytes(out));
  ASSERT_OK(read);
  EXPECT_EQ(read->missing, 3u);
  std::vector<uint8_t> found(keys.size());
  auto flagged = store->Find(keys, DType::kFp32, MutableBytes(out), found.data());
  ASSERT_OK(flagged);
  EXPECT_EQ(flagged->missing, 3u);
  EXPECT_EQ(found, std::vector<uint8_t>(keys.size(), 0));
  auto written = store->FindOrInsert(keys, DType::kFp32, MutableBytes(out));
  ASSERT_OK(written);
  EXPECT_EQ(written->missing, 3u);
  auto again = store->Find(keys, DType::kFp32, MutableBytes(out));
  ASSERT_OK(again);
  EXPECT_EQ(again->missing, 0u);
}

TYPED_TEST(StoreTest, FindOrInsertStoresTheSameRowFindReturned) {
  auto store = this->MakeStore(SmallTable());
  std::vector<float> before = this->FindRows(*store, {100});
  std::vector<float> inserted = this->InsertRows(*store, {100});
  std::vector<uint8_t> found;
  std::vector<float> after = this->FindRows(*store, {100}, &found);
  EXPECT_EQ(before, inserted);
  EXPECT_EQ(inserted, after);
  EXPECT_EQ(found[0], 1);
  EXPECT_EQ(store->Stats().rows, 1u);
}

TYPED_TEST(StoreTest, EveryUint64IsAValidKeyIncludingZeroAndMax) {
  auto store = this->MakeStore(SmallTable(2));
  const std::vector<uint64_t> keys = {0, std::numeric_limits<uint64_t>::max(), 1,
                                      std::numeric_limits<uint64_t>::max() - 1,
                                      uint64_t{1} << 63};
  this->InsertRows(*store, keys);
  std::vector<float> grads(keys.size() * 2);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i + 1);
  ASSERT_OK(store->ApplyGradients(keys, DType::kFp32, Bytes(grads)));
  std::vector<uint8_t> found;
  std::vector<float> rows = this->FindRows(*store, keys, &found);
  EXPECT_EQ(store->Stats().rows, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(found[i], 1) << "key " << keys[i];
    std::vector<float> init = this->Initial(store->config(), keys[i]);
    for (uint32_t j = 0; j < 2; ++j) {
      EXPECT_FLOAT_EQ(rows[i * 2 + j], init[j] - 0.5f * grads[i * 2 + j]) << "key " << keys[i];
    }
  }
}

TYPED_TEST(StoreTest, RowsComeBackInRequestOrderWithDuplicatesAnsweredEachTime) {
  auto store = this->MakeStore(SmallTable(3));
  std::vector<uint64_t> keys;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 500; ++i) keys.push_back(rng());
  this->InsertRows(*store, keys);
  std::vector<uint64_t> query = {keys[3], keys[499], keys[3], 12345, keys[0]};
  std::vector<float> rows = this->FindRows(*store, query);
  for (size_t i = 0; i < query.size(); ++i) {
    std::vector<float> init = this->Initial(store->config(), query[i]);
    EXPECT_TRUE(std::equal(init.begin(), init.end(), rows.begin() + i * 3)) << "position " << i;
  }
}

TYPED_TEST(StoreTest, ZeroKeysIsValidAndChangesNothing) {
  auto store = this->MakeStore(SmallTable());
  std::vector<uint64_t> none;
  std::vector<float> empty;
  auto found = store->FindOrInsert(none, DType::kFp32, MutableBytes(empty));
  ASSERT_OK(found);
  EXPECT_EQ(found->missing, 0u);
  auto pushed = store->ApplyGradients(none, DType::kFp32, Bytes(empty));
  ASSERT_OK(pushed);
  EXPECT_EQ(pushed->updated, 0u);
  EXPECT_EQ(store->Stats().rows, 0u);
}

TYPED_TEST(StoreTest, WrongRowBufferSizeIsRejectedNamingTableAndSizes) {
  auto store = this->MakeStore(SmallTable(4));
  std::vector<float> out(7);  // 2 keys x dim 4 needs 8
  auto r = store->FindOrInsert({{1, 2}}, DType::kFp32, MutableBytes(out));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("table 't'"), absl::string_view::npos) << r.status();
  EXPECT_NE(r.status().message().find("expected 32 bytes"), absl::string_view::npos) << r.status();
  EXPECT_NE(r.status().message().find("received 28"), absl::string_view::npos) << r.status();
  EXPECT_EQ(store->Stats().rows, 0u);
}

TYPED_TEST(StoreTest, NonFiniteGradientIsRejectedAndChangesNothing) {
  auto store = this->MakeStore(SmallTable(2));
  std::vector<uint64_t> keys = {1, 2};
  std::vector<float> rows_before = this->InsertRows(*store, keys);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> grads = {1, 1, 1, bad};
    auto r = store->ApplyGradients(keys, DType::kFp32, Bytes(grads));
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("gradients"), absl::string_view::npos);
    EXPECT_NE(r.status().message().find("row 1"), absl::string_view::npos) << r.status();
  }
  EXPECT_EQ(this->FindRows(*store, keys), rows_before);
}

TYPED_TEST(StoreTest, PreValidatedPushStillChecksShapesAndAppliesLikeApplyGradients) {
  auto store = this->MakeStore(SmallTable(2));
  auto other = this->MakeStore(SmallTable(2));
  std::vector<uint64_t> keys = {4, 5};
  std::vector<float> grads = {1, 2, 3, 4};
  ASSERT_OK(store->ValidateGradients(keys, DType::kFp32, Bytes(grads)));
  ASSERT_OK(store->ApplyValidatedGradients(keys, DType::kFp32, Bytes(grads)));
  ASSERT_OK(other->ApplyGradients(keys, DType::kFp32, Bytes(grads)));
  EXPECT_EQ(this->FindRows(*store, keys), this->FindRows(*other, keys));
  std::vector<float> short_grads = {1, 2, 3};
  EXPECT_EQ(store->ApplyValidatedGradients(keys, DType::kFp32, Bytes(short_grads)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A shard hands over a push's rows where they arrived off the network: each
// row at its own address, at any alignment. Applied by address, a push
// updates the rows bit for bit as the same push packed.
TYPED_TEST(StoreTest, GradientsGivenByRowAddressApplyAsThePackedBufferDoes) {
  TableConfig c = SmallTable(5);
  c.optimizer.kind = OptimizerKind::kAdagrad;
  auto by_address = this->MakeStore(c);
  auto packed = this->MakeStore(c);
  const std::vector<uint64_t> keys = {11, 3, 11, 42, 7};  // a duplicate, summed first
  std::vector<float> grads(keys.size() * 5);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i) - 0.1f;
  const size_t row_bytes = 5 * sizeof(float);
  // Rows in reverse order, one byte off float alignment.
  std::vector<uint8_t> scattered(1 + grads.size() * sizeof(float));
  std::vector<const uint8_t*> at(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    uint8_t* row = scattered.data() + 1 + (keys.size() - 1 - i) * row_bytes;
    memcpy(row, grads.data() + i * 5, row_bytes);
    at[i] = row;
  }
  const GradientRows rows(at, row_bytes);
  for (int step = 0; step < 3; ++step) {
    ASSERT_OK(by_address->ValidateGradients(keys, DType::kFp32, rows));
    ASSERT_OK(by_address->ApplyValidatedGradients(keys, DType::kFp32, rows));
    ASSERT_OK(packed->ApplyGradients(keys, DType::kFp32, Bytes(grads)));
  }
  EXPECT_EQ(this->FindRows(*by_address, keys), this->FindRows(*packed, keys));
}

TYPED_TEST(StoreTest, ANonFiniteGradientGivenByAddressIsFoundInItsRow) {
  auto store = this->MakeStore(SmallTable(2));
  const std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> a = {1, 1, 1, 1};  // rows 0 and 1, end to end
  std::vector<float> b = {1, std::numeric_limits<float>::quiet_NaN()};  // row 2, apart
  const std::vector<const uint8_t*> at = {reinterpret_cast<const uint8_t*>(a.data()),
                                          reinterpret_cast<const uint8_t*>(a.data() + 2),
                                          reinterpret_cast<const uint8_t*>(b.data())};
  const absl::Status s =
      store->ValidateGradients(keys, DType::kFp32, GradientRows(at, 2 * sizeof(float)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("row 2 (key 3) element 1"), absl::string_view::npos) << s;
  EXPECT_EQ(store->Stats().rows, 0u);
}

TYPED_TEST(StoreTest, DuplicateKeysInOnePushAreSummedBeforeOneOptimizerStep) {
  TableConfig c = SmallTable(1);
  c.initializer.kind = InitializerKind::kConstant;
  c.initializer.value = 1.0f;
  c.optimizer.kind = OptimizerKind::kAdagrad;
  c.optimizer.learning_rate = 0.1f;
  c.optimizer.initial_accumulator = 0.1f;
  auto store = this->MakeStore(c);
  std::vector<float> grads = {0.5f, 0.25f, 2.0f};
  auto r = store->ApplyGradients({{9, 9, 9}}, DType::kFp32, Bytes(grads));
  ASSERT_OK(r);
  EXPECT_EQ(r->updated, 1u);
  EXPECT_EQ(r->inserted, 1u);
  // One Adagrad step with g = 2.75 (three steps would give a different value).
  const double g = 2.75, acc = 0.1 + g * g;
  const double expected = 1.0 - 0.1 * g / (std::sqrt(acc) + 1e-7);
  EXPECT_NEAR(this->FindRows(*store, {9})[0], expected, 1e-6);
}

// Keys spread over several stripes, one of them twice, far apart: the
// duplicate's gradients are summed in request order before one step, and
// every other key gets its own step, exactly as when the caller sums first.
TYPED_TEST(StoreTest, ADuplicateAmongManyDistinctKeysIsSummedAndTheRestStepOnce) {
  TableConfig c = SmallTable(4, /*capacity=*/4 * 8192);
  c.optimizer.kind = OptimizerKind::kAdagrad;
  c.optimizer.learning_rate = 0.1f;
  auto summed_by_store = this->MakeStore(c);
  auto summed_before = this->MakeStore(c);
  std::vector<uint64_t> keys;
  std::vector<float> grads;
  for (uint64_t k = 1; k <= 40; ++k) {
    keys.push_back(k * 7919);
    for (int j = 0; j < 4; ++j) grads.push_back(0.01f * static_cast<float>(k + j));
  }
  std::vector<float> unique_grads = grads;
  keys.push_back(keys[3]);
  for (int j = 0; j < 4; ++j) {
    grads.push_back(0.5f + static_cast<float>(j));
    unique_grads[3 * 4 + j] += 0.5f + static_cast<float>(j);
  }
  const std::vector<uint64_t> unique_keys(keys.begin(), keys.end() - 1);
  auto r = summed_by_store->ApplyGradients(keys, DType::kFp32, Bytes(grads));
  ASSERT_OK(r);
  EXPECT_EQ(r->updated, 40u);
  ASSERT_OK(summed_before->ApplyGradients(unique_keys, DType::kFp32, Bytes(unique_grads)));
  const std::vector<float> got = this->FindRows(*summed_by_store, unique_keys);
  const std::vector<float> want = this->FindRows(*summed_before, unique_keys);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(absl::bit_cast<uint32_t>(got[i]), absl::bit_cast<uint32_t>(want[i])) << i;
  }
}

TYPED_TEST(StoreTest, OutputDtypesConvertTheStoredRow) {
  auto store = this->MakeStore(SmallTable(5));
  std::vector<uint64_t> keys = {11, 12, 13};
  std::vector<float> fp32 = this->InsertRows(*store, keys);
  for (DType t : {DType::kFp16, DType::kBf16}) {
    std::vector<uint8_t> out(keys.size() * 5 * 2);
    ASSERT_OK(store->Find(keys, t, absl::MakeSpan(out)));
    for (size_t i = 0; i < fp32.size(); ++i) {
      EXPECT_EQ(LoadElement(out.data(), t, i), RoundTo(t, fp32[i])) << DTypeName(t) << " " << i;
    }
  }
}

TYPED_TEST(StoreTest, HalfPrecisionStorageRoundsRowsAndKeepsFp32State) {
  for (DType storage : {DType::kFp16, DType::kBf16}) {
    TableConfig c = SmallTable(4);
    c.dtype = storage;
    c.optimizer.kind = OptimizerKind::kAdagrad;
    c.optimizer.learning_rate = 0.01f;
    c.optimizer.initial_accumulator = 0.1f;
    auto store = this->MakeStore(c);
    std::vector<float> rows = this->InsertRows(*store, {5});
    std::vector<float> init = this->Initial(c, 5);
    EXPECT_EQ(rows, init) << DTypeName(storage);
    // State is fp32: the accumulator keeps growing by g^2 even when the row
    // change is below the storage resolution.
    std::vector<float> grads = {1e-3f, 1e-3f, 1e-3f, 1e-3f};
    for (int i = 0; i < 3; ++i) ASSERT_OK(store->ApplyGradients({{5}}, DType::kFp32, Bytes(grads)));
    ExportCursor cursor;
    ExportedRows exported;
    ASSERT_OK(store->Export(&cursor, 10, &exported));
    ASSERT_EQ(exported.keys.size(), 1u);
    EXPECT_FLOAT_EQ(exported.state[0], 0.1f + 3e-6f);
    for (float v : exported.values) EXPECT_EQ(v, RoundTo(storage, v));
  }
}

TYPED_TEST(StoreTest, EraseRemovesOnlyTheGivenKeys) {
  auto store = this->MakeStore(SmallTable(2));
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 1000; ++k) keys.push_back(k * 7919);
  this->InsertRows(*store, keys);
  std::vector<float> grads(keys.size() * 2, 1.0f);
  ASSERT_OK(store->ApplyGradients(keys, DType::kFp32, Bytes(grads)));
  std::vector<float> before = this->FindRows(*store, keys);
  std::vector<uint64_t> erase(keys.begin(), keys.begin() + 500);
  erase.push_back(42);  // never stored
  auto erased = store->Erase(erase);
  ASSERT_OK(erased);
  EXPECT_EQ(*erased, 500u);
  EXPECT_EQ(store->Stats().rows, 500u);
  std::vector<uint8_t> found;
  std::vector<float> after = this->FindRows(*store, keys, &found);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(found[i], i < 500 ? 0 : 1) << i;
    if (i >= 500) {
      EXPECT_EQ(after[i * 2], before[i * 2]) << i;
      EXPECT_EQ(after[i * 2 + 1], before[i * 2 + 1]) << i;
    }
  }
}

TYPED_TEST(StoreTest, ManyKeysSurviveGrowthAndInterleavedErases) {
  auto store = this->MakeStore(SmallTable(3));
  std::mt19937_64 rng(7);
  std::vector<uint64_t> keys(50000);
  for (auto& k : keys) k = rng();
  for (size_t i = 0; i < keys.size(); i += 5000) {
    std::vector<uint64_t> part(keys.begin() + i, keys.begin() + i + 5000);
    this->InsertRows(*store, part);
    std::vector<uint64_t> odd;  // erase a third of what is there so far
    for (size_t j = 0; j < i + 5000; j += 3) odd.push_back(keys[j]);
    ASSERT_OK(store->Erase(odd));
  }
  std::vector<uint8_t> found;
  std::vector<float> rows = this->FindRows(*store, keys, &found);
  size_t stored = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(found[i], i % 3 == 0 ? 0 : 1) << i;
    stored += found[i];
    std::vector<float> init = this->Initial(store->config(), keys[i]);
    EXPECT_TRUE(std::equal(init.begin(), init.end(), rows.begin() + i * 3)) << i;
  }
  EXPECT_EQ(store->Stats().rows, stored);
}

TYPED_TEST(StoreTest, ExportThenImportIntoAFreshStoreReproducesRowsAndState) {
  TableConfig c = SmallTable(4);
  c.optimizer.kind = OptimizerKind::kAdam;
  c.optimizer.learning_rate = 0.01f;
  auto store = this->MakeStore(c);
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 3000; ++k) keys.push_back(k * 0x9e3779b97f4a7c15ULL);
  std::vector<float> grads(keys.size() * 4, 0.5f);
  ASSERT_OK(store->ApplyGradients(keys, DType::kFp32, Bytes(grads)));
  ASSERT_OK(store->ApplyGradients(std::vector<uint64_t>(keys.begin(), keys.begin() + 10),
                                  DType::kFp32,
                                  Bytes(std::vector<float>(40, -1.0f))));
  ExportedRows all, batch;
  ExportCursor cursor;
  int batches = 0;
  while (!cursor.done) {
    ASSERT_OK(store->Export(&cursor, 700, &batch));
    ASSERT_LE(batch.keys.size(), 700u);
    all.keys.insert(all.keys.end(), batch.keys.begin(), batch.keys.end());
    all.values.insert(all.values.end(), batch.values.begin(), batch.values.end());
    all.state.insert(all.state.end(), batch.state.begin(), batch.state.end());
    all.steps.insert(all.steps.end(), batch.steps.begin(), batch.steps.end());
    all.scores.insert(all.scores.end(), batch.scores.begin(), batch.scores.end());
    ASSERT_LT(++batches, 100);
  }
  ASSERT_EQ(all.keys.size(), keys.size());
  auto copy = this->MakeStore(c);
  ASSERT_OK(copy->Import(all));
  EXPECT_EQ(this->FindRows(*copy, keys), this->FindRows(*store, keys));
  // The step counts travelled: one more identical push moves both alike.
  ASSERT_OK(store->ApplyGradients({{keys[0]}}, DType::kFp32, Bytes(std::vector<float>(4, 1.0f))));
  ASSERT_OK(copy->ApplyGradients({{keys[0]}}, DType::kFp32, Bytes(std::vector<float>(4, 1.0f))));
  EXPECT_EQ(this->FindRows(*copy, {keys[0]}), this->FindRows(*store, {keys[0]}));
  auto steps = std::count(all.steps.begin(), all.steps.end(), 2u);
  EXPECT_EQ(steps, 10);
}

TYPED_TEST(StoreTest, FullTableWithoutEvictionFailsLoudlyAndCountsFailures) {
  auto store = this->MakeStore(SmallTable(2, /*capacity=*/4, EvictionPolicy::kNone));
  this->InsertRows(*store, {1, 2, 3, 4});
  std::vector<float> out(2 * 2);
  auto r = store->FindOrInsert({{5, 1}}, DType::kFp32, MutableBytes(out));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("capacity 4"), absl::string_view::npos) << r.status();
  auto p = store->ApplyGradients({{6}}, DType::kFp32, Bytes(std::vector<float>{1, 1}));
  ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  StoreStats st = store->Stats();
  EXPECT_EQ(st.rows, 4u);
  EXPECT_EQ(st.insert_failures, 2u);
  EXPECT_EQ(st.evictions, 0u);
}

TYPED_TEST(StoreTest, LruEvictsTheLeastRecentlyUsedRow) {
  auto store = this->MakeStore(SmallTable(2, /*capacity=*/4, EvictionPolicy::kLru));
  for (uint64_t k : {1, 2, 3, 4}) this->InsertRows(*store, {k});
  this->FindRows(*store, {1});  // 2 is now the least recently used
  ASSERT_OK(store->ApplyGradients({{3}}, DType::kFp32, Bytes(std::vector<float>{1, 1})));
  this->InsertRows(*store, {5});  // evicts 2
  this->InsertRows(*store, {6});  // evicts 4
  std::vector<uint8_t> found;
  this->FindRows(*store, {1, 2, 3, 4, 5, 6}, &found);
  EXPECT_EQ(found, (std::vector<uint8_t>{1, 0, 1, 0, 1, 1}));
  EXPECT_EQ(store->Stats().evictions, 2u);
  EXPECT_EQ(store->Stats().rows, 4u);
}

TYPED_TEST(StoreTest, LfuEvictsTheLeastFrequentlyUsedRow) {
  auto store = this->MakeStore(SmallTable(2, /*capacity=*/3, EvictionPolicy::kLfu));
  this->InsertRows(*store, {1, 2, 3});
  for (int i = 0; i < 3; ++i) this->FindRows(*store, {1});
  for (int i = 0; i < 2; ++i) this->FindRows(*store, {3});
  this->FindRows(*store, {2});
  // Uses: 1 -> 4, 2 -> 2, 3 -> 3.
  this->InsertRows(*store, {4});  // evicts 2
  this->InsertRows(*store, {4});
  this->InsertRows(*store, {4});
  this->InsertRows(*store, {4});  // 4 -> 4 uses
  this->InsertRows(*store, {5});  // evicts 3
  std::vector<uint8_t> found;
  this->FindRows(*store, {1, 2, 3, 4, 5}, &found);
  EXPECT_EQ(found, (std::vector<uint8_t>{1, 0, 0, 1, 1}));
  EXPECT_EQ(store->Stats().evictions, 2u);
}

TYPED_TEST(StoreTest, LargeTableHoldsItsCapacityAndEvictsBeyondIt) {
  const uint64_t capacity = 64 * 1024;
  auto store = this->MakeStore(SmallTable(2, capacity, EvictionPolicy::kLru));
  std::vector<uint64_t> keys(capacity / 2);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = Mix64(i);
  this->InsertRows(*store, keys);
  EXPECT_EQ(store->Stats().rows, keys.size());
  EXPECT_EQ(store->Stats().evictions, 0u);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = Mix64(i + capacity);
  this->InsertRows(*store, keys);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = Mix64(i + 2 * capacity);
  this->InsertRows(*store, keys);
  StoreStats st = store->Stats();
  EXPECT_LE(st.rows, capacity);
  EXPECT_GE(st.rows, capacity * 95 / 100);  // per-stripe limits end a little below
  EXPECT_EQ(st.rows + st.evictions, st.inserts);
  EXPECT_GT(st.evictions, 0u);
}

TYPED_TEST(StoreTest, InvalidConfigIsRejectedNamingTheField) {
  TableConfig c = SmallTable(0);
  auto s = TypeParam::Make(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("'dim'"), absl::string_view::npos) << s.status();
  c = SmallTable(4);
  c.optimizer.learning_rate = -1;
  s = TypeParam::Make(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("learning_rate"), absl::string_view::npos) << s.status();
}

}  // namespace
}  // namespace ember::testing
