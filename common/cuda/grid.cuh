// Grid-stride iteration for the element-wise kernels of the CUDA files: the
// grid may be smaller than the work (launches cap their block count).
#pragma once

#include <cstdint>

namespace ember::cuda {

// Calls fn(e) for every e in [0, total) handled by this thread.
template <typename Fn>
__device__ void ForEachGridIndex(uint64_t total, Fn fn) {
  for (uint64_t e = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    fn(e);
  }
}

}  // namespace ember::cuda
