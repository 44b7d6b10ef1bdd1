// The store implementations the typed suites run against. A factory whose
// device is missing (no GPU here, or a build without CUDA) makes the suite
// skip with a message saying so.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/embedding_store.h"
#if EMBER_HAVE_CUDA
#include "kernels/cuda/cuda_store.h"
#include "kernels/cuda/device_query.h"
#endif

namespace ember::testing {

struct CpuStoreFactory {
  static constexpr const char* kName = "cpu";
  // Empty when the store can run here, else why not.
  static std::string Unavailable() { return ""; }
  static absl::StatusOr<std::unique_ptr<EmbeddingStore>> Make(const TableConfig& c) {
    return NewCpuStore(c);
  }
};

// The CUDA store on device 0.
struct CudaStoreFactory {
  static constexpr const char* kName = "cuda";
  static std::string Unavailable() {
#if EMBER_HAVE_CUDA
    if (cuda::DeviceCount() == 0) return "no CUDA device here: the CUDA store runs on a GPU machine";
    return "";
#else
    return "built without CUDA (EMBER_ENABLE_CUDA=OFF): no CUDA store to test";
#endif
  }
  static absl::StatusOr<std::unique_ptr<EmbeddingStore>> Make(
      [[maybe_unused]] const TableConfig& c) {
#if EMBER_HAVE_CUDA
    return NewCudaStore(c, 0);
#else
    return absl::UnimplementedError("built without CUDA");
#endif
  }
};

using StoreImplementations = ::testing::Types<CpuStoreFactory, CudaStoreFactory>;

// gtest names for the typed suites: StoreTest/cpu, StoreTest/cuda.
struct StoreImplementationNames {
  template <typename T>
  static std::string GetName(int) {
    return T::kName;
  }
};

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
