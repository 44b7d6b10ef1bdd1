// The client's GPU entry points in a build without CUDA: each says so.
#include "absl/strings/str_cat.h"
#include "client/device_step.h"
#include "ember/device.h"
#include "ember/nccl_transport.h"

namespace ember {
namespace {
absl::Status NoCuda(absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": this build has no CUDA (EMBER_ENABLE_CUDA=OFF)"));
}
}  // namespace

bool HaveCudaPath() { return false; }

absl::StatusOr<std::unique_ptr<DeviceContext>> NewDeviceContext(int device, DeviceStepShape) {
  return NoCuda(absl::StrCat("device cuda:", device));
}

absl::StatusOr<size_t> DeviceUnique(const uint64_t*, size_t, uint64_t*, uint32_t*, DeviceStream) {
  return NoCuda("DeviceUnique");
}

absl::StatusOr<std::vector<std::unique_ptr<ExchangeTransport>>> NewNcclTransports(
    const std::vector<int>&) {
  return NoCuda("NCCL transport");
}
absl::StatusOr<std::string> NewNcclUniqueId() { return NoCuda("NCCL transport"); }
absl::StatusOr<std::unique_ptr<ExchangeTransport>> NewNcclTransport(const std::string&, uint32_t,
                                                                     uint32_t, int) {
  return NoCuda("NCCL transport");
}

}  // namespace ember
