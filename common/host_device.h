// EMBER_HD marks small functions that host (g++) and device (nvcc) code both
// compile, so that the CPU and CUDA stores share one definition of the math.
#pragma once

#if defined(__CUDACC__)
#define EMBER_HD __host__ __device__ __forceinline__
#else
#define EMBER_HD inline
#endif
