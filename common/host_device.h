// EMBER_HD marks small functions that host (g++) and device (nvcc) code both
// compile, so that the CPU and CUDA stores share one definition of the math.
// EMBER_HD_INLINE is EMBER_HD that the host compiler must inline too: for
// dispatchers called inside a function compiled for several vector units
// (common/vector_dispatch.h), where a call that is not inlined would run
// the baseline code.
#pragma once

#if defined(__CUDACC__)
#define EMBER_HD __host__ __device__ __forceinline__
#define EMBER_HD_INLINE __host__ __device__ __forceinline__
#else
#define EMBER_HD inline
#define EMBER_HD_INLINE inline __attribute__((always_inline))
#endif
