// Many threads on one store: lookups, pushes, inserts, erases and evictions
// at once. Run it under the ThreadSanitizer build (EMBER_TSAN=ON) too.
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/store_implementations.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

constexpr int kThreads = 8;
// ThreadSanitizer slows every access ~10x: fewer rounds keep it to seconds.
#if defined(__SANITIZE_THREAD__)
constexpr int kRounds = 30;
#else
constexpr int kRounds = 300;
#endif
constexpr uint32_t kDim = 4;

template <typename Factory>
class StoreStressTest : public StoreTestBase<Factory> {};
TYPED_TEST_SUITE(StoreStressTest, StoreImplementations, StoreImplementationNames);

// Every push adds exactly 1 to each element of its keys (SGD, lr 1, g = -1),
// so after the run each row must equal the number of pushes it received, and
// any lookup must see all elements of a row equal (no torn rows).
TYPED_TEST(StoreStressTest, ConcurrentPushesAndLookupsLoseNoUpdateAndTearNoRow) {
  TableConfig c = SmallTable(kDim);
  c.initializer.kind = InitializerKind::kZeros;
  c.optimizer.learning_rate = 1.0f;
  auto store = this->MakeStore(c);
  constexpr uint64_t kKeys = 3000;
  std::vector<std::vector<uint32_t>> pushes(kThreads, std::vector<uint32_t>(kKeys));
  std::atomic<int> torn{0}, errors{0};

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);  // fixed seeds
      std::vector<uint64_t> keys;
      std::vector<float> buf;
      for (int round = 0; round < kRounds; ++round) {
        keys.clear();
        const int n = 1 + static_cast<int>(rng() % 200);
        for (int i = 0; i < n; ++i) keys.push_back(rng() % kKeys);
        buf.assign(keys.size() * kDim, -1.0f);
        if (t % 2 == 0 || round % 3 == 0) {
          if (!store->ApplyGradients(keys, DType::kFp32, Bytes(buf)).ok()) ++errors;
          for (uint64_t k : keys) ++pushes[t][k];
        } else {
          auto r = round % 2 ? store->Find(keys, DType::kFp32, MutableBytes(buf))
                             : store->FindOrInsert(keys, DType::kFp32, MutableBytes(buf));
          if (!r.ok()) ++errors;
          for (size_t i = 0; i < keys.size(); ++i) {
            for (uint32_t j = 1; j < kDim; ++j) {
              if (buf[i * kDim + j] != buf[i * kDim]) ++torn;
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(torn.load(), 0);

  std::vector<uint64_t> all(kKeys);
  for (uint64_t k = 0; k < kKeys; ++k) all[k] = k;
  std::vector<float> rows(kKeys * kDim);
  ASSERT_OK(store->Find(all, DType::kFp32, MutableBytes(rows)));
  for (uint64_t k = 0; k < kKeys; ++k) {
    uint32_t expected = 0;
    for (int t = 0; t < kThreads; ++t) expected += pushes[t][k];
    ASSERT_EQ(rows[k * kDim], static_cast<float>(expected)) << "key " << k;
  }
}

TYPED_TEST(StoreStressTest, ConcurrentInsertsEvictionsAndErasesKeepTheBooksBalanced) {
  const uint64_t capacity = 16 * 1024;
  auto store = this->MakeStore(SmallTable(kDim, capacity, EvictionPolicy::kLru));
  std::atomic<uint64_t> erased{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(2000 + t);
      std::vector<uint64_t> keys;
      std::vector<float> buf;
      for (int round = 0; round < kRounds; ++round) {
        keys.clear();
        for (int i = 0; i < 256; ++i) keys.push_back(rng() % (4 * capacity));
        buf.assign(keys.size() * kDim, 0.5f);
        absl::Status s;
        switch (round % 3) {
          case 0: s = store->FindOrInsert(keys, DType::kFp32, MutableBytes(buf)).status(); break;
          case 1: s = store->ApplyGradients(keys, DType::kFp32, Bytes(buf)).status(); break;
          case 2: {
            auto n = store->Erase(absl::MakeSpan(keys).subspan(0, 32));
            s = n.status();
            if (n.ok()) erased += *n;
            break;
          }
        }
        if (!s.ok()) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  StoreStats st = store->Stats();
  EXPECT_LE(st.rows, capacity);
  EXPECT_GT(st.evictions, 0u);
  EXPECT_EQ(st.rows + st.evictions + erased.load(), st.inserts);
  // Every stored row is still findable under its key.
  ExportCursor cursor;
  ExportedRows batch;
  size_t exported = 0;
  while (!cursor.done) {
    ASSERT_OK(store->Export(&cursor, 4096, &batch));
    std::vector<uint8_t> found(batch.keys.size());
    std::vector<float> rows(batch.keys.size() * kDim);
    ASSERT_OK(store->Find(batch.keys, DType::kFp32, MutableBytes(rows), found.data()));
    for (uint8_t f : found) ASSERT_EQ(f, 1);
    EXPECT_EQ(rows, batch.values);
    exported += batch.keys.size();
  }
  EXPECT_EQ(exported, st.rows);
}

}  // namespace
}  // namespace ember::testing
