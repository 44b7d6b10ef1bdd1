// EmbeddingStore::Peek and opt::StepStoredRow, the two halves of the early
// fetch at s = 0 (client/early_fetch.h): a peek changes nothing in the
// table, and a peeked row brought forward through a push on the trainer is
// bit for bit the row the store holds after applying that push itself.
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/optimizer_rows.h"
#include "tests/kernels/store_implementations.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

template <typename Factory>
class StorePeekTest : public StoreTestBase<Factory> {
 protected:
  // A store that can peek, or null after marking the test skipped.
  std::unique_ptr<EmbeddingStore> PeekingStore(const TableConfig& config) {
    std::unique_ptr<EmbeddingStore> store = this->MakeStore(config);
    if (store == nullptr || store->CanPeek()) return store;
    std::vector<float> values(config.dim);
    std::vector<float> state(config.dim * OptimizerStateFloatsPerElement(config.optimizer.kind));
    std::vector<uint32_t> steps(OptimizerHasStepCount(config.optimizer.kind) ? 1 : 0);
    std::vector<uint8_t> stored(1);
    const uint64_t key = 1;
    EXPECT_EQ(store
                  ->Peek({&key, 1}, {absl::MakeSpan(values), absl::MakeSpan(state),
                                     absl::MakeSpan(steps), absl::MakeSpan(stored)})
                  .code(),
              absl::StatusCode::kUnimplemented);
    return nullptr;
  }
};
TYPED_TEST_SUITE(StorePeekTest, StoreImplementations, StoreImplementationNames);

// What Peek returned for some keys.
struct Peeked {
  std::vector<float> values, state;
  std::vector<uint32_t> steps;
  std::vector<uint8_t> stored;
};

Peeked PeekAt(EmbeddingStore& store, const std::vector<uint64_t>& keys) {
  const TableConfig& c = store.config();
  Peeked p;
  p.values.resize(keys.size() * c.dim);
  p.state.resize(keys.size() * c.dim * OptimizerStateFloatsPerElement(c.optimizer.kind));
  p.steps.resize(OptimizerHasStepCount(c.optimizer.kind) ? keys.size() : 0);
  p.stored.resize(keys.size());
  EXPECT_OK(store.Peek(keys, {absl::MakeSpan(p.values), absl::MakeSpan(p.state),
                              absl::MakeSpan(p.steps), absl::MakeSpan(p.stored)}));
  return p;
}

TableConfig WithOptimizer(OptimizerKind kind, DType dtype, uint32_t dim) {
  TableConfig c = SmallTable(dim);
  c.name = absl::StrCat("t_", OptimizerName(kind), "_", DTypeName(dtype));
  c.dtype = dtype;
  c.optimizer.kind = kind;
  c.optimizer.learning_rate = 0.05f;
  c.optimizer.l1 = 0.001f;
  c.optimizer.l2 = 0.001f;
  return c;
}

TYPED_TEST(StorePeekTest, PeekedRowsBroughtForwardOnTheTrainerAreBitIdenticalToTheStoresPush) {
  constexpr uint32_t kDim = 13;  // not a multiple of a vector width
  std::mt19937 rng(5);
  std::normal_distribution<float> grad(0.0f, 0.3f);
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kAdam,
                             OptimizerKind::kFtrl, OptimizerKind::kRmsProp}) {
    for (DType dtype : {DType::kFp32, DType::kFp16, DType::kBf16}) {
      const TableConfig config = WithOptimizer(kind, dtype, kDim);
      SCOPED_TRACE(config.name);
      std::unique_ptr<EmbeddingStore> store = this->PeekingStore(config);
      if (store == nullptr) return;
      // Keys 0..39 pushed each round; 40..49 never stored (a push inserts
      // them: the replay starts from the initial row and state Peek gives).
      std::vector<uint64_t> keys(50);
      for (uint64_t k = 0; k < keys.size(); ++k) keys[k] = k * 0x9e3779b97f4a7c15ULL;
      const std::vector<uint64_t> stored_keys(keys.begin(), keys.begin() + 40);
      std::vector<float> rows(stored_keys.size() * kDim);
      ASSERT_OK(store->FindOrInsert(stored_keys, DType::kFp32, MutableBytes(rows)));
      for (int round = 0; round < 12; ++round) {
        Peeked replayed = PeekAt(*store, keys);
        for (size_t i = 0; i < keys.size(); ++i) {
          EXPECT_EQ(replayed.stored[i], round == 0 && i >= 40 ? 0 : 1) << "key " << i;
        }
        std::vector<float> g(keys.size() * kDim);
        for (float& x : g) x = grad(rng);
        const size_t state = kDim * OptimizerStateFloatsPerElement(kind);
        for (size_t i = 0; i < keys.size(); ++i) {
          opt::StepStoredRow(config.optimizer, dtype, g.data() + i * kDim,
                             replayed.values.data() + i * kDim, state > 0 ? replayed.state.data() + i * state : nullptr,
                             replayed.steps.empty() ? nullptr : &replayed.steps[i], kDim);
        }
        ASSERT_OK(store->ApplyGradients(keys, DType::kFp32, Bytes(g)));
        const Peeked after = PeekAt(*store, keys);
        std::vector<float> looked_up(keys.size() * kDim);
        ASSERT_OK(store->Find(keys, DType::kFp32, MutableBytes(looked_up)));
        for (size_t i = 0; i < looked_up.size(); ++i) {
          ASSERT_EQ(absl::bit_cast<uint32_t>(replayed.values[i]),
                    absl::bit_cast<uint32_t>(looked_up[i]))
              << "round " << round << " key " << i / kDim << " element " << i % kDim << ": "
              << replayed.values[i] << " vs " << looked_up[i];
        }
        ASSERT_EQ(replayed.state.size(), after.state.size());
        ASSERT_TRUE(after.state.empty() ||
                    memcmp(replayed.state.data(), after.state.data(),
                           after.state.size() * sizeof(float)) == 0)
            << "round " << round << ": optimizer state differs";
        ASSERT_EQ(replayed.steps, after.steps) << "round " << round;
      }
    }
  }
}

TYPED_TEST(StorePeekTest,
           PeekChangesNoScoreAdmissionCountOrRowAndAnswersAbsentKeysAsAnInsertWould) {
  TableConfig config = SmallTable(4, /*capacity=*/64, EvictionPolicy::kLfu);
  config.admission.min_count = 2;
  config.admission.sketch_width = 1024;
  std::unique_ptr<EmbeddingStore> store = this->PeekingStore(config);
  if (store == nullptr) return;
  const std::vector<uint64_t> keys = {11, 12, 13};
  std::vector<float> rows(keys.size() * 4);
  // Twice: admitted and stored at the second lookup.
  ASSERT_OK(store->FindOrInsert(keys, DType::kFp32, MutableBytes(rows)));
  ASSERT_OK(store->FindOrInsert(keys, DType::kFp32, MutableBytes(rows)));
  ExportCursor cursor;
  ExportedRows before;
  ASSERT_OK(store->Export(&cursor, 100, &before));
  const StoreStats stats_before = store->Stats();

  const std::vector<uint64_t> absent = {99};
  for (int i = 0; i < 5; ++i) {
    const Peeked p = PeekAt(*store, {11, 12, 13, 99});
    EXPECT_EQ(p.stored, (std::vector<uint8_t>{1, 1, 1, 0}));
    std::vector<float> initial(4);
    ASSERT_OK(store->Find(absent, DType::kFp32, MutableBytes(initial)));
    EXPECT_EQ(0, memcmp(p.values.data() + 3 * 4, initial.data(), 4 * sizeof(float)));
  }
  cursor = {};
  ExportedRows after;
  ASSERT_OK(store->Export(&cursor, 100, &after));
  EXPECT_EQ(after.keys, before.keys);
  EXPECT_EQ(after.scores, before.scores) << "a peek must not count as an access for LFU";
  EXPECT_EQ(after.values, before.values);
  const StoreStats stats_after = store->Stats();
  EXPECT_EQ(stats_after.rows, stats_before.rows);
  EXPECT_EQ(stats_after.inserts, stats_before.inserts);
  // Five peeks of key 99 did not count for admission: its first lookup
  // still only counts once, and stores nothing.
  std::vector<float> one(4);
  ASSERT_OK(store->FindOrInsert(absent, DType::kFp32, MutableBytes(one)));
  EXPECT_EQ(store->Stats().rows, stats_before.rows);
}

TYPED_TEST(StorePeekTest, PeekRefusesBuffersOfTheWrongSizeNamingTheField) {
  const TableConfig config = WithOptimizer(OptimizerKind::kAdam, DType::kFp32, 4);
  std::unique_ptr<EmbeddingStore> store = this->PeekingStore(config);
  if (store == nullptr) return;
  const std::vector<uint64_t> keys = {1, 2};
  std::vector<float> values(8), state(16), short_state(15);
  std::vector<uint32_t> steps(2);
  std::vector<uint8_t> stored(2);
  const absl::Status bad = store->Peek(keys, {absl::MakeSpan(values), absl::MakeSpan(short_state),
                                              absl::MakeSpan(steps), absl::MakeSpan(stored)});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("'state': expected 16 elements, received 15"), std::string::npos)
      << bad;
  EXPECT_OK(store->Peek(keys, {absl::MakeSpan(values), absl::MakeSpan(state), absl::MakeSpan(steps),
                               absl::MakeSpan(stored)}));
}

}  // namespace
}  // namespace ember::testing
