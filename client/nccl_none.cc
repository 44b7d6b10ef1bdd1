// The NCCL transport in a build without CUDA: each factory says so.
#include "client/no_cuda.h"
#include "ember/nccl_transport.h"

namespace ember {

absl::StatusOr<std::vector<std::unique_ptr<ShuffleTransport>>> NewNcclTransports(
    const std::vector<int>&) {
  return NoCuda("NCCL transport");
}
absl::StatusOr<std::string> NewNcclUniqueId() { return NoCuda("NCCL transport"); }
absl::StatusOr<std::unique_ptr<ShuffleTransport>> NewNcclTransport(const std::string&, uint32_t,
                                                                     uint32_t, int) {
  return NoCuda("NCCL transport");
}

}  // namespace ember
