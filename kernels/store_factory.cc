#include "kernels/store_factory.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#if EMBER_HAVE_CUDA
#include "kernels/cuda/cuda_store.h"
#include "kernels/cuda/device_query.h"
#endif

namespace ember {

std::string StoreDevice::ToString() const {
  return kind == Kind::kCpu ? "cpu" : absl::StrCat("cuda:", index);
}

absl::StatusOr<StoreDevice> ParseStoreDevice(absl::string_view text) {
  StoreDevice d;
  if (text == "cpu") return d;
  int index = -1;
  if (absl::StartsWith(text, "cuda:") && absl::SimpleAtoi(text.substr(5), &index) && index >= 0) {
    d.kind = StoreDevice::Kind::kCuda;
    d.index = index;
    return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("field 'device': expected \"cpu\" or \"cuda:N\", received \"", text, "\""));
}

absl::Status CheckStoreDevice(const StoreDevice& device) {
  if (device.kind == StoreDevice::Kind::kCpu) return absl::OkStatus();
#if EMBER_HAVE_CUDA
  const int count = cuda::DeviceCount();
  if (device.index < count) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("device ", device.ToString(),
                                                    ": this machine has ", count,
                                                    " usable CUDA devices"));
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "device ", device.ToString(), ": this build has no CUDA (EMBER_ENABLE_CUDA=OFF)"));
#endif
}

absl::StatusOr<std::unique_ptr<EmbeddingStore>> NewStore(const TableConfig& config,
                                                         const StoreDevice& device) {
  if (device.kind == StoreDevice::Kind::kCpu) return NewCpuStore(config);
  if (config.ttl.enabled()) {
    return absl::UnimplementedError(absl::StrCat("table '", config.name, "' field 'ttl': the ",
                                                 device.ToString(), " store has no TTL yet; "
                                                 "use --device=cpu or no ttl"));
  }
#if EMBER_HAVE_CUDA
  return NewCudaStore(config, device.index);
#else
  return CheckStoreDevice(device);
#endif
}

}  // namespace ember
