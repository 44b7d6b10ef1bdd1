// Device-memory helpers of the trainer library. No CUDA headers needed: a
// stream is passed as DeviceStream (CUDA's cudaStream_t; nullptr is the
// legacy default stream).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

struct CUstream_st;

namespace ember {

using DeviceStream = CUstream_st*;

// True when this build of the library has its CUDA path (EMBER_ENABLE_CUDA).
bool HaveCudaPath();

// Unique keys and inverse of `keys` (n, device memory), for trainers whose
// ids are already on the GPU: unique[0, u) receives the distinct keys in
// increasing order and inverse[i] the index of keys[i] among them; returns
// u. All three buffers are device memory of the current device with room
// for n entries. Runs on `stream` and waits for it (u comes back to the
// host: it sizes everything after). FAILED_PRECONDITION without CUDA.
absl::StatusOr<size_t> DeviceUnique(const uint64_t* keys, size_t n, uint64_t* unique,
                                    uint32_t* inverse, DeviceStream stream);

}  // namespace ember
