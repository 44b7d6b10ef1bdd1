// NCCL transports for NodeShuffle: the GPUs of one trainer node shuffle
// their blocks with NCCL point-to-point calls (grouped send/recv, an
// all-to-all) instead of through host threads.
//
// Blocks arrive and leave in host memory, as NodeShuffle keeps them: each
// AllToAll copies the sizes and then the payload to the device, exchanges
// them over NCCL (NVLink or PCIe between the node's GPUs) and copies the
// result back, on a stream of its own. That costs two copies per call
// beside the in-process transport; it is the transport for ranks that are
// separate processes, where threads cannot meet.
//
// Available when the build has CUDA (EMBER_ENABLE_CUDA); otherwise the
// factories return FAILED_PRECONDITION saying so.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ember/node_shuffle.h"

namespace ember {

// One process driving several GPUs (one thread per GPU): transports for
// `devices`, rank i on devices[i] (ncclCommInitAll).
absl::StatusOr<std::vector<std::unique_ptr<ShuffleTransport>>> NewNcclTransports(
    const std::vector<int>& devices);

// One process per GPU: rank 0 creates an id (opaque bytes), sends it to the
// other ranks by any means (a file, the launcher's environment), and every
// rank calls NewNcclTransport with it.
absl::StatusOr<std::string> NewNcclUniqueId();
absl::StatusOr<std::unique_ptr<ShuffleTransport>> NewNcclTransport(const std::string& unique_id,
                                                                     uint32_t rank, uint32_t size,
                                                                     int device);

}  // namespace ember
