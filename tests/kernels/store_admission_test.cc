// Admission (count-min sketch) on every store, and the CPU store's TTL.
#include <vector>

#include "gtest/gtest.h"
#include "kernels/count_min_sketch.h"
#include "kernels/initializer_math.h"
#include "tests/kernels/store_implementations.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

TableConfig AdmissionTable(uint32_t min_count) {
  TableConfig c = SmallTable(2);
  c.admission.min_count = min_count;
  c.admission.sketch_width = 1024;
  return c;
}

template <typename Factory>
class StoreAdmissionTest : public StoreTestBase<Factory> {
 protected:
  std::vector<float> Lookup(EmbeddingStore& s, const std::vector<uint64_t>& keys) {
    std::vector<float> out(keys.size() * s.config().dim);
    EXPECT_OK(s.FindOrInsert(keys, DType::kFp32, MutableBytes(out)));
    return out;
  }
};
TYPED_TEST_SUITE(StoreAdmissionTest, StoreImplementations, StoreImplementationNames);

TYPED_TEST(StoreAdmissionTest, KeyIsStoredOnlyAtItsKthLookupAndAnsweredItsInitialRowBefore) {
  auto store = this->MakeStore(AdmissionTable(3));
  std::vector<float> initial(2);
  init::InitialRow(store->config().initializer, 77, 2, DType::kFp32, initial.data());
  EXPECT_EQ(this->Lookup(*store, {77}), initial);
  EXPECT_EQ(this->Lookup(*store, {77}), initial);
  EXPECT_EQ(store->Stats().rows, 0u);
  EXPECT_EQ(store->Stats().admission_rejected, 2u);
  EXPECT_EQ(this->Lookup(*store, {77}), initial);  // the third: stored
  EXPECT_EQ(store->Stats().rows, 1u);
  EXPECT_EQ(store->Stats().admission_rejected, 2u);
  // Stored rows are found without counting again.
  this->Lookup(*store, {77});
  EXPECT_EQ(store->Stats().admission_rejected, 2u);
}

TYPED_TEST(StoreAdmissionTest, GradientsOfKeysNotAdmittedAreDroppedAndCounted) {
  auto store = this->MakeStore(AdmissionTable(2));
  this->Lookup(*store, {1, 2, 2});  // key 2 reaches 2 within the call; key 1 does not
  EXPECT_EQ(store->Stats().rows, 1u);
  EXPECT_EQ(store->Stats().admission_rejected, 2u);  // key 1, and key 2's first occurrence
  const std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> grads(6, 1.0f);
  auto pushed = store->ApplyGradients(keys, DType::kFp32, Bytes(grads));
  ASSERT_OK(pushed);
  EXPECT_EQ(pushed->updated, 1u);  // key 2 only
  EXPECT_EQ(store->Stats().admission_dropped, 2u);
  EXPECT_EQ(store->Stats().rows, 1u);
  std::vector<uint8_t> found(3);
  std::vector<float> rows(6);
  ASSERT_OK(store->Find(keys, DType::kFp32, MutableBytes(rows), found.data()));
  EXPECT_EQ(found, (std::vector<uint8_t>{0, 1, 0}));
}

TYPED_TEST(StoreAdmissionTest, WithoutAdmissionEveryLookupInserts) {
  auto store = this->MakeStore(SmallTable(2));
  this->Lookup(*store, {1, 2, 3});
  EXPECT_EQ(store->Stats().rows, 3u);
  EXPECT_EQ(store->Stats().admission_rejected, 0u);
}

TEST(CountMinSketchTest, EstimateNeverBelowTheTrueCountAndSaturates) {
  CountMinSketch sketch(64);  // small: collisions happen
  std::vector<uint32_t> truth(500, 0);
  for (uint32_t round = 0; round < 5; ++round) {
    for (uint64_t k = 0; k < truth.size(); k += 1 + round) {
      sketch.Add(k);
      ++truth[k];
    }
  }
  for (uint64_t k = 0; k < truth.size(); ++k) EXPECT_GE(sketch.Estimate(k), truth[k]) << k;
  CountMinSketch one(1024);
  for (int i = 0; i < 70000; ++i) one.Add(9);
  EXPECT_EQ(one.Estimate(9), 65535u);
}

TEST(CpuStoreTtlTest, RowsNotTouchedSinceTheCutoffAreEvictedAndCounted) {
  TableConfig c = SmallTable(2);
  c.ttl.steps = 5;
  auto store = NewCpuStore(c);
  ASSERT_OK(store);
  EmbeddingStore& s = **store;
  std::vector<float> out(2 * 100);
  std::vector<uint64_t> old_keys, new_keys;
  for (uint64_t k = 0; k < 100; ++k) (k % 4 == 0 ? new_keys : old_keys).push_back(k * 7919);
  s.SetTtlTime(10);
  std::vector<uint64_t> all = old_keys;
  all.insert(all.end(), new_keys.begin(), new_keys.end());
  ASSERT_OK(s.FindOrInsert(all, DType::kFp32, MutableBytes(out)));
  s.SetTtlTime(20);  // the new keys are touched again later
  std::vector<float> some(2 * new_keys.size());
  ASSERT_OK(s.FindOrInsert(new_keys, DType::kFp32, MutableBytes(some)));
  auto none = s.EvictExpired(10);  // stamps 10 and 20 are not before 10
  ASSERT_OK(none);
  EXPECT_EQ(*none, 0u);
  auto evicted = s.EvictExpired(15);
  ASSERT_OK(evicted);
  EXPECT_EQ(*evicted, old_keys.size());
  EXPECT_EQ(s.Stats().expired, old_keys.size());
  EXPECT_EQ(s.Stats().rows, new_keys.size());
  std::vector<uint8_t> found(new_keys.size());
  ASSERT_OK(s.Find(new_keys, DType::kFp32, MutableBytes(some), found.data()));
  EXPECT_EQ(found, std::vector<uint8_t>(new_keys.size(), 1));
}

TEST(CpuStoreTtlTest, TableWithoutTtlRefusesToExpire) {
  auto store = NewCpuStore(SmallTable(2));
  ASSERT_OK(store);
  EXPECT_EQ((*store)->EvictExpired(5).status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace ember::testing
