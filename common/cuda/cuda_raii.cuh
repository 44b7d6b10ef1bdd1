// CUDA error checking and RAII owners of device memory, pinned host memory,
// streams and events. Included by .cu files only: headers that host code
// includes carry no CUDA types.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ember::cuda {

// INTERNAL naming the failed call and where it was made; OK for cudaSuccess.
// An out-of-memory error is RESOURCE_EXHAUSTED, so a caller can tell a table
// that does not fit from a broken device.
inline absl::Status CudaStatus(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  std::string msg = absl::StrCat(call, " failed: ", cudaGetErrorName(err), " (",
                                 cudaGetErrorString(err), ") at ", file, ":", line);
  return err == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(msg)
                                          : absl::InternalError(msg);
}

// The one CUDA error check: returns the failure as an absl::Status.
#define EMBER_CUDA_RETURN_IF_ERROR(call)                                                   \
  do {                                                                                     \
    if (::absl::Status _ember_cuda_status =                                                \
            ::ember::cuda::CudaStatus((call), #call, __FILE__, __LINE__);                  \
        !_ember_cuda_status.ok()) {                                                        \
      return _ember_cuda_status;                                                           \
    }                                                                                      \
  } while (0)

// Device memory of one device, uninitialised. Grows on demand (contents are
// not kept), so per-call scratch is allocated once and reused.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Free(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Free();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  // Ensures at least `bytes` (a little more when growing, to amortise).
  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    return Allocate(bytes + bytes / 4);
  }
  // Exactly `bytes`, zeroed in `stream` order (a plain cudaMemset would run
  // on the legacy stream, which non-blocking streams do not wait for); the
  // old contents are dropped.
  absl::Status AllocateZeroed(size_t bytes, cudaStream_t stream) {
    if (absl::Status s = Allocate(bytes); !s.ok()) return s;
    if (bytes != 0) EMBER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ptr_, 0, bytes, stream));
    return absl::OkStatus();
  }

  template <typename T = void>
  T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  absl::Status Allocate(size_t bytes) {
    Free();
    if (bytes == 0) return absl::OkStatus();
    EMBER_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr_, bytes));
    bytes_ = bytes;
    return absl::OkStatus();
  }
  void Free() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory: the only host memory an async copy overlaps with.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Free(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    Free();
    EMBER_CUDA_RETURN_IF_ERROR(cudaMallocHost(&ptr_, bytes + bytes / 4));
    bytes_ = bytes + bytes / 4;
    return absl::OkStatus();
  }
  template <typename T = void>
  T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void Free() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A non-blocking stream (it does not synchronise with the legacy default
// stream), created on the current device.
class Stream {
 public:
  Stream() = default;
  ~Stream() {
    if (s_ != nullptr) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  absl::Status Create() {
    EMBER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    return absl::OkStatus();
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// An event without timing, for ordering one stream after another.
class Event {
 public:
  Event() = default;
  ~Event() {
    if (e_ != nullptr) cudaEventDestroy(e_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  absl::Status Create() {
    EMBER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming));
    return absl::OkStatus();
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// Makes `device` current for the scope: gRPC and trainer threads reach a
// store from whichever device they last used.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() {
    int now = 0;
    cudaGetDevice(&now);
    if (now != previous_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace ember::cuda
