// The CUDA device query: skips with a message where there is no GPU.
#include "gtest/gtest.h"
#include "kernels/cuda/device_query.h"

namespace ember::cuda {
namespace {

TEST(DeviceQueryTest, DescribesEveryVisibleGpu) {
  const int n = DeviceCount();
  if (n == 0) GTEST_SKIP() << "no CUDA device or driver on this machine: GPU checks skipped";
  for (int d = 0; d < n; ++d) {
    const std::string description = DeviceDescription(d);
    EXPECT_EQ(description.rfind("cuda:" + std::to_string(d), 0), 0u) << description;
  }
}

TEST(DeviceQueryTest, AnInvalidDeviceIsReportedUnavailable) {
  EXPECT_EQ(DeviceDescription(1 << 20).rfind("unavailable", 0), 0u);
}

}  // namespace
}  // namespace ember::cuda
