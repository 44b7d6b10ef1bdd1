#include "kernels/cuda/device_query.h"

#include <cuda_runtime.h>

#include <cstdio>

namespace ember::cuda {

int DeviceCount() {
  int count = 0;
  // Without a GPU this returns cudaErrorInsufficientDriver (35) or
  // cudaErrorNoDevice; both mean "no GPU here".
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return count;
}

std::string DeviceDescription(int device) {
  cudaDeviceProp prop;
  cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) return std::string("unavailable: ") + cudaGetErrorName(err);
  char buf[sizeof(prop.name) + 96];
  std::snprintf(buf, sizeof(buf), "cuda:%d %s, %.1f GiB, sm_%d%d", device, prop.name,
                prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), prop.major, prop.minor);
  return buf;
}

}  // namespace ember::cuda
