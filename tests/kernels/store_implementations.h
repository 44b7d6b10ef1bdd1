// The store implementations the typed suites run against. The CUDA store
// joins this list when it exists; a factory whose device is missing makes
// the suite skip with a message.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/embedding_store.h"

namespace ember::testing {

struct CpuStoreFactory {
  static constexpr const char* kName = "cpu";
  // Empty when the store can run here, else why not.
  static std::string Unavailable() { return ""; }
  static absl::StatusOr<std::unique_ptr<EmbeddingStore>> Make(const TableConfig& c) {
    return NewCpuStore(c);
  }
};

using StoreImplementations = ::testing::Types<CpuStoreFactory>;

// Fixture base: skips when the implementation cannot run on this machine.
template <typename Factory>
class StoreTestBase : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = Factory::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  }
  std::unique_ptr<EmbeddingStore> MakeStore(const TableConfig& config) {
    auto store = Factory::Make(config);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }
};

// A small fp32 table with SGD and a uniform initializer.
inline TableConfig SmallTable(uint32_t dim = 4, uint64_t capacity = 0,
                              EvictionPolicy eviction = EvictionPolicy::kNone) {
  TableConfig c;
  c.name = "t";
  c.dim = dim;
  c.initializer.kind = InitializerKind::kUniform;
  c.initializer.min = -0.5f;
  c.initializer.max = 0.5f;
  c.initializer.seed = 42;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.learning_rate = 0.5f;
  c.capacity = capacity;
  c.eviction = eviction;
  return c;
}

}  // namespace ember::testing
