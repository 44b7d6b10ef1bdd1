#include "ember/nccl_transport.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/cuda/cuda_raii.cuh"

namespace ember {
namespace {

absl::Status NcclStatus(ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed: ", ncclGetErrorString(r)));
}

class NcclTransport final : public ShuffleTransport {
 public:
  NcclTransport(ncclComm_t comm, uint32_t rank, uint32_t size, int device)
      : comm_(comm), rank_(rank), size_(size), device_(device) {}
  ~NcclTransport() override {
    cuda::DeviceScope scope(device_);
    ncclCommDestroy(comm_);
  }

  absl::Status Init() {
    cuda::DeviceScope scope(device_);
    return stream_.Create();
  }

  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }

  absl::Status AllToAll(const std::vector<std::vector<uint8_t>>& send,
                        std::vector<std::vector<uint8_t>>* recv) override {
    if (send.size() != size_) {
      return absl::InvalidArgumentError(absl::StrCat("NCCL transport: field 'send': expected ",
                                                     size_, " blocks, received ", send.size()));
    }
    cuda::DeviceScope scope(device_);
    cudaStream_t s = stream_.get();
    // Round 1: block sizes.
    EMBER_RETURN_IF_ERROR(host_.Reserve(2 * size_ * sizeof(uint64_t)));
    EMBER_RETURN_IF_ERROR(sizes_.Reserve(2 * size_ * sizeof(uint64_t)));
    uint64_t* send_sizes = host_.get<uint64_t>();
    uint64_t* recv_sizes = send_sizes + size_;
    uint64_t send_total = 0;
    for (uint32_t r = 0; r < size_; ++r) send_total += send_sizes[r] = send[r].size();
    uint64_t* d_sizes = sizes_.get<uint64_t>();
    EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_sizes, send_sizes, size_ * sizeof(uint64_t),
                                               cudaMemcpyHostToDevice, s));
    EMBER_RETURN_IF_ERROR(Exchange(d_sizes, d_sizes + size_, [](uint32_t) { return 1; },
                                   [](uint32_t) { return 1; }, [](uint32_t r) { return r; },
                                   [](uint32_t r) { return r; }, ncclUint64));
    EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(recv_sizes, d_sizes + size_,
                                               size_ * sizeof(uint64_t), cudaMemcpyDeviceToHost, s));
    EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    // Round 2: the payload, packed per peer.
    std::vector<uint64_t> send_at(size_ + 1, 0), recv_at(size_ + 1, 0);
    for (uint32_t r = 0; r < size_; ++r) {
      send_at[r + 1] = send_at[r] + send_sizes[r];
      recv_at[r + 1] = recv_at[r] + recv_sizes[r];
    }
    EMBER_RETURN_IF_ERROR(staging_.Reserve(std::max<uint64_t>(1, send_total + recv_at[size_])));
    EMBER_RETURN_IF_ERROR(payload_.Reserve(std::max<uint64_t>(1, send_total + recv_at[size_])));
    uint8_t* h = staging_.get<uint8_t>();
    for (uint32_t r = 0; r < size_; ++r) {
      if (!send[r].empty()) std::memcpy(h + send_at[r], send[r].data(), send[r].size());
    }
    uint8_t* d = payload_.get<uint8_t>();
    EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, h, send_total, cudaMemcpyHostToDevice, s));
    uint8_t* d_recv = d + send_total;
    EMBER_RETURN_IF_ERROR(Exchange(
        d, d_recv, [&](uint32_t r) { return send_sizes[r]; },
        [&](uint32_t r) { return recv_sizes[r]; }, [&](uint32_t r) { return send_at[r]; },
        [&](uint32_t r) { return recv_at[r]; }, ncclUint8));
    EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + send_total, d_recv, recv_at[size_],
                                               cudaMemcpyDeviceToHost, s));
    EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    recv->assign(size_, {});
    for (uint32_t r = 0; r < size_; ++r) {
      (*recv)[r].assign(h + send_total + recv_at[r], h + send_total + recv_at[r + 1]);
    }
    return absl::OkStatus();
  }

 private:
  // One grouped round of sends and receives with every peer (itself
  // included): counts and offsets per peer, in elements of `type`.
  template <typename SendCount, typename RecvCount, typename SendAt, typename RecvAt>
  absl::Status Exchange(const void* send, void* recv, SendCount send_count, RecvCount recv_count,
                        SendAt send_at, RecvAt recv_at, ncclDataType_t type) {
    const size_t elem = type == ncclUint64 ? 8 : 1;
    EMBER_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart"));
    for (uint32_t r = 0; r < size_; ++r) {
      if (send_count(r) != 0) {
        EMBER_RETURN_IF_ERROR(NcclStatus(
            ncclSend(static_cast<const uint8_t*>(send) + send_at(r) * elem, send_count(r), type,
                     static_cast<int>(r), comm_, stream_.get()),
            "ncclSend"));
      }
      if (recv_count(r) != 0) {
        EMBER_RETURN_IF_ERROR(NcclStatus(
            ncclRecv(static_cast<uint8_t*>(recv) + recv_at(r) * elem, recv_count(r), type,
                     static_cast<int>(r), comm_, stream_.get()),
            "ncclRecv"));
      }
    }
    return NcclStatus(ncclGroupEnd(), "ncclGroupEnd");
  }

  ncclComm_t comm_;
  const uint32_t rank_, size_;
  const int device_;
  cuda::Stream stream_;
  cuda::PinnedBuffer host_, staging_;
  cuda::DeviceBuffer sizes_, payload_;
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<ShuffleTransport>>> NewNcclTransports(
    const std::vector<int>& devices) {
  if (devices.empty()) {
    return absl::InvalidArgumentError("NCCL transport: field 'devices': expected at least one");
  }
  std::vector<ncclComm_t> comms(devices.size());
  EMBER_RETURN_IF_ERROR(NcclStatus(
      ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()),
      "ncclCommInitAll"));
  std::vector<std::unique_ptr<ShuffleTransport>> out;
  for (size_t r = 0; r < devices.size(); ++r) {
    auto t = std::make_unique<NcclTransport>(comms[r], static_cast<uint32_t>(r),
                                             static_cast<uint32_t>(devices.size()), devices[r]);
    EMBER_RETURN_IF_ERROR(t->Init());
    out.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<std::string> NewNcclUniqueId() {
  ncclUniqueId id;
  EMBER_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<ShuffleTransport>> NewNcclTransport(const std::string& unique_id,
                                                                     uint32_t rank, uint32_t size,
                                                                     int device) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL transport: field 'unique_id': expected ",
                                                   sizeof(id.internal), " bytes, received ",
                                                   unique_id.size()));
  }
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  cuda::DeviceScope scope(device);
  ncclComm_t comm;
  EMBER_RETURN_IF_ERROR(NcclStatus(
      ncclCommInitRank(&comm, static_cast<int>(size), id, static_cast<int>(rank)),
      "ncclCommInitRank"));
  auto t = std::make_unique<NcclTransport>(comm, rank, size, device);
  EMBER_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<ShuffleTransport>(std::move(t));
}

}  // namespace ember
