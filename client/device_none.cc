// The client's GPU entry points in a build without CUDA: each says so.
#include "absl/strings/str_cat.h"
#include "client/device_step.h"
#include "client/no_cuda.h"
#include "ember/device.h"

namespace ember {

bool HaveCudaPath() { return false; }

absl::StatusOr<std::unique_ptr<DeviceContext>> NewDeviceContext(int device, DeviceStepShape) {
  return NoCuda(absl::StrCat("device cuda:", device));
}

absl::StatusOr<size_t> DeviceUnique(const uint64_t*, size_t, uint64_t*, uint32_t*, DeviceStream) {
  return NoCuda("DeviceUnique");
}

}  // namespace ember
