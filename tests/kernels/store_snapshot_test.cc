// Snapshots (the checkpoint's view of a store), run against every store:
// full snapshots copy every row once; deltas copy what changed since.
#include <algorithm>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "tests/kernels/store_implementations.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

// A store's contents keyed by key: values, state, step (scores left out:
// lookups move them).
struct RowState {
  std::vector<float> values;
  std::vector<float> state;
  uint32_t step = 0;
  bool operator==(const RowState&) const = default;
};
using Contents = std::map<uint64_t, RowState>;

void AddRows(const ExportedRows& rows, uint32_t dim, Contents* out) {
  const size_t n = rows.keys.size();
  const size_t sf = n == 0 ? 0 : rows.state.size() / n;
  for (size_t i = 0; i < n; ++i) {
    RowState& r = (*out)[rows.keys[i]];
    r.values.assign(rows.values.begin() + i * dim, rows.values.begin() + (i + 1) * dim);
    r.state.assign(rows.state.begin() + i * sf, rows.state.begin() + (i + 1) * sf);
    r.step = rows.steps[i];
  }
}

// Every row of the store, through Export.
Contents ExportAll(EmbeddingStore& store) {
  Contents out;
  ExportCursor cursor;
  ExportedRows rows;
  while (!cursor.done) {
    EXPECT_OK(store.Export(&cursor, 1000, &rows));
    AddRows(rows, store.config().dim, &out);
  }
  return out;
}

// A whole snapshot, in batches of `max_rows`; counts the rows it held.
struct Taken {
  Contents rows;
  std::vector<uint64_t> removed;
  size_t row_count = 0;
};
absl::StatusOr<Taken> TakeSnapshot(EmbeddingStore& store, SnapshotKind kind,
                                   size_t max_rows = 64) {
  Taken t;
  ExportCursor cursor;
  SnapshotBatch batch;
  while (!cursor.done) {
    absl::Status s = store.Snapshot(kind, &cursor, max_rows, &batch);
    if (!s.ok()) return s;
    t.row_count += batch.rows.keys.size();
    AddRows(batch.rows, store.config().dim, &t.rows);
    t.removed.insert(t.removed.end(), batch.removed.begin(), batch.removed.end());
  }
  std::sort(t.removed.begin(), t.removed.end());
  return t;
}

TableConfig AdamTable(uint64_t capacity = 0, EvictionPolicy eviction = EvictionPolicy::kNone) {
  TableConfig c = SmallTable(3, capacity, eviction);
  c.optimizer.kind = OptimizerKind::kAdam;
  c.optimizer.learning_rate = 0.01f;
  return c;
}

std::vector<uint64_t> Range(uint64_t begin, uint64_t end) {
  std::vector<uint64_t> keys;
  for (uint64_t k = begin; k < end; ++k) keys.push_back(k * 0x9e3779b97f4a7c15ULL);
  return keys;
}

void Push(EmbeddingStore& store, const std::vector<uint64_t>& keys, float g) {
  std::vector<float> grads(keys.size() * store.config().dim, g);
  ASSERT_OK(store.ApplyGradients(keys, DType::kFp32, Bytes(grads)));
}

template <typename Factory>
class StoreSnapshotTest : public StoreTestBase<Factory> {};
TYPED_TEST_SUITE(StoreSnapshotTest, StoreImplementations, StoreImplementationNames);

TYPED_TEST(StoreSnapshotTest, FullSnapshotHoldsEveryStoredRowExactlyOnce) {
  auto store = this->MakeStore(AdamTable());
  const std::vector<uint64_t> keys = Range(0, 3000);
  Push(*store, keys, 0.25f);
  Push(*store, Range(0, 100), -1.0f);
  auto taken = TakeSnapshot(*store, SnapshotKind::kFull);
  ASSERT_OK(taken);
  EXPECT_EQ(taken->row_count, keys.size());  // no row twice
  EXPECT_TRUE(taken->removed.empty());
  EXPECT_EQ(taken->rows, ExportAll(*store));
}

TYPED_TEST(StoreSnapshotTest, DeltaBeforeAnyFullSnapshotIsRefused) {
  auto store = this->MakeStore(AdamTable());
  Push(*store, Range(0, 10), 1.0f);
  auto taken = TakeSnapshot(*store, SnapshotKind::kDelta);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kFailedPrecondition) << taken.status();
  EXPECT_NE(taken.status().message().find("table 't'"), std::string::npos) << taken.status();
}

TYPED_TEST(StoreSnapshotTest, DeltaHoldsOnlyChangedRowsAndRemovedKeys) {
  auto store = this->MakeStore(AdamTable());
  Push(*store, Range(0, 2000), 0.5f);
  ASSERT_OK(TakeSnapshot(*store, SnapshotKind::kFull));

  const std::vector<uint64_t> updated = Range(10, 30);
  const std::vector<uint64_t> inserted = Range(5000, 5007);
  const std::vector<uint64_t> erased = Range(100, 103);
  Push(*store, updated, -0.5f);
  Push(*store, Range(15, 20), 2.0f);  // twice changed: still one row in the delta
  std::vector<float> out(inserted.size() * 3);
  ASSERT_OK(store->FindOrInsert(inserted, DType::kFp32, MutableBytes(out)));
  ASSERT_OK(store->Erase(erased));
  // Lookups of stored rows are not changes.
  std::vector<float> looked(50 * 3);
  ASSERT_OK(store->Find(Range(500, 550), DType::kFp32, MutableBytes(looked)));

  auto delta = TakeSnapshot(*store, SnapshotKind::kDelta, 4);
  ASSERT_OK(delta);
  Contents all = ExportAll(*store);
  Contents expected;
  for (const auto& keys : {updated, inserted}) {
    for (uint64_t k : keys) expected[k] = all.at(k);
  }
  EXPECT_EQ(delta->row_count, updated.size() + inserted.size());
  EXPECT_EQ(delta->rows, expected);
  std::vector<uint64_t> erased_sorted = erased;
  std::sort(erased_sorted.begin(), erased_sorted.end());
  EXPECT_EQ(delta->removed, erased_sorted);

  auto empty = TakeSnapshot(*store, SnapshotKind::kDelta);
  ASSERT_OK(empty);
  EXPECT_EQ(empty->row_count, 0u);
  EXPECT_TRUE(empty->removed.empty());
}

TYPED_TEST(StoreSnapshotTest, EvictedRowsAppearAsRemovedKeysInTheDelta) {
  auto store = this->MakeStore(AdamTable(16, EvictionPolicy::kLru));
  const std::vector<uint64_t> first = Range(0, 16);
  Push(*store, first, 1.0f);
  ASSERT_OK(TakeSnapshot(*store, SnapshotKind::kFull));
  Push(*store, Range(100, 104), 1.0f);  // evicts 4 of the first rows
  auto delta = TakeSnapshot(*store, SnapshotKind::kDelta);
  ASSERT_OK(delta);
  Contents all = ExportAll(*store);
  EXPECT_EQ(delta->removed.size(), 4u);
  for (uint64_t k : delta->removed) {
    EXPECT_TRUE(std::find(first.begin(), first.end(), k) != first.end()) << k;
    EXPECT_EQ(all.count(k), 0u) << k;
  }
  EXPECT_EQ(delta->row_count, 4u);
}

TYPED_TEST(StoreSnapshotTest, BasePlusDeltasReplayedIntoAFreshStoreEqualTheStore) {
  const TableConfig config = AdamTable(1500, EvictionPolicy::kLfu);
  auto store = this->MakeStore(config);
  auto replica = this->MakeStore(config);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint64_t> key(0, 3000);
  auto random_keys = [&](size_t n) {
    std::vector<uint64_t> keys(n);
    for (auto& k : keys) k = key(rng);
    return keys;
  };
  auto apply = [&](const Taken& t) {
    ExportedRows rows;
    for (const auto& [k, r] : t.rows) {
      rows.keys.push_back(k);
      rows.values.insert(rows.values.end(), r.values.begin(), r.values.end());
      rows.state.insert(rows.state.end(), r.state.begin(), r.state.end());
      rows.steps.push_back(r.step);
      rows.scores.push_back(0);
    }
    ASSERT_OK(replica->Erase(t.removed));
    ASSERT_OK(replica->Import(rows));
  };
  for (int round = 0; round < 4; ++round) {
    Push(*store, random_keys(800), 0.1f * static_cast<float>(round + 1));
    ASSERT_OK(store->Erase(random_keys(50)));
    auto taken = TakeSnapshot(*store, round == 0 ? SnapshotKind::kFull : SnapshotKind::kDelta);
    ASSERT_OK(taken);
    apply(*taken);
  }
  EXPECT_EQ(ExportAll(*replica), ExportAll(*store));
}

}  // namespace
}  // namespace ember::testing
