// The client's device path: pooling and its backward as CUDA kernels over
// one per-step upload, and DeviceUnique. The per-element math is
// client/pooling_math.h, shared with the host path.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <cub/cub.cuh>

#include "absl/strings/str_cat.h"
#include "client/device_step.h"
#include "client/pooling_math.h"
#include "common/status_macros.h"
#include "common/cuda/cuda_raii.cuh"
#include "common/cuda/grid.cuh"

namespace ember {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(uint64_t n) {
  return static_cast<unsigned>(std::min<uint64_t>(std::max<uint64_t>(1, (n + kThreads - 1) / kThreads),
                                                  65535u * 8));
}

// Where id occurrence k of a table's backward plan reads its gradient.
struct Occurrence {
  uint32_t feature;
  uint32_t example;
};

struct FeaturePointers {
  const float* p[kMaxDeviceFeatures];
};

__global__ void PoolForwardKernel(const int64_t* offsets, const uint32_t* inverse,
                                  const float* weights, Combiner combiner, const float* rows,
                                  uint32_t dim, uint64_t batch, float* pooled) {
  const uint64_t total = batch * dim;
  cuda::ForEachGridIndex(total, [&](uint64_t e) {
    pooled[e] = pool::PooledElement(offsets, inverse, weights, combiner, rows, dim,
                                    static_cast<int64_t>(e / dim), static_cast<uint32_t>(e % dim));
  });
}

// d_rows[u, d] = sum over u's occurrences, in (feature, id) order, of
// coef * d_pooled[feature][example, d]: the host's PoolBackward order, with
// no atomics (deterministic).
__global__ void PoolBackwardKernel(const uint32_t* occ_offsets, const Occurrence* occ,
                                   const float* coef, FeaturePointers d_pooled, uint32_t dim,
                                   uint64_t unique, float* d_rows) {
  const uint64_t total = unique * dim;
  cuda::ForEachGridIndex(total, [&](uint64_t e) {
    const uint64_t u = e / dim;
    const uint32_t d = static_cast<uint32_t>(e % dim);
    float acc = 0.0f;
    for (uint32_t k = occ_offsets[u]; k < occ_offsets[u + 1]; ++k) {
      acc += coef[k] * d_pooled.p[occ[k].feature][static_cast<uint64_t>(occ[k].example) * dim + d];
    }
    d_rows[e] = acc;
  });
}

// Byte layout of one step's upload; the same offsets on host and device.
class Layout {
 public:
  template <typename T>
  size_t Add(size_t count) {
    const size_t at = (bytes_ + 15) & ~size_t{15};
    bytes_ = at + count * sizeof(T);
    return at;
  }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;
};

struct TableSections {
  size_t rows, occ_offsets, occ, coef;
  size_t unique = 0, occurrences = 0;
};
struct FeatureSections {
  size_t offsets, inverse, weights;
  bool weighted = false;
  size_t batch = 0;
};

class CudaDeviceStep final : public DeviceStep {
 public:
  CudaDeviceStep(int device, const DeviceStepShape* shape, cudaStream_t side)
      : device_(device), shape_(shape), side_(side) {}

  absl::Status Init() {
    cuda::DeviceScope scope(device_);
    EMBER_RETURN_IF_ERROR(uploaded_.Create());
    EMBER_RETURN_IF_ERROR(computed_.Create());
    return copied_.Create();
  }

  absl::Status Prepare(const Batch& batch, const std::vector<size_t>& unique,
                       const std::vector<std::vector<uint32_t>>& inverse) override {
    cuda::DeviceScope scope(device_);
    const size_t tables = shape_->table_dim.size();
    const size_t features = shape_->feature_table.size();
    batch_ = batch.features[0].offsets.size() - 1;
    Layout layout;
    tables_.assign(tables, {});
    features_.assign(features, {});
    for (size_t f = 0; f < features; ++f) {
      tables_[shape_->feature_table[f]].occurrences += batch.features[f].keys.size();
    }
    for (size_t t = 0; t < tables; ++t) {
      TableSections& s = tables_[t];
      s.unique = unique[t];
      s.rows = layout.Add<float>(s.unique * shape_->table_dim[t]);
      s.occ_offsets = layout.Add<uint32_t>(s.unique + 1);
      s.occ = layout.Add<Occurrence>(s.occurrences);
      s.coef = layout.Add<float>(s.occurrences);
    }
    for (size_t f = 0; f < features; ++f) {
      FeatureSections& s = features_[f];
      const FeatureBatch& fb = batch.features[f];
      s.batch = batch_;
      s.offsets = layout.Add<int64_t>(fb.offsets.size());
      s.inverse = layout.Add<uint32_t>(fb.keys.size());
      s.weighted = !fb.weights.empty();
      s.weights = layout.Add<float>(fb.weights.size());
    }
    upload_bytes_ = layout.bytes();
    EMBER_RETURN_IF_ERROR(host_.Reserve(std::max<size_t>(upload_bytes_, 1)));
    EMBER_RETURN_IF_ERROR(upload_.Reserve(std::max<size_t>(upload_bytes_, 1)));
    uint8_t* h = host_.get<uint8_t>();
    for (size_t f = 0; f < features; ++f) {
      const FeatureBatch& fb = batch.features[f];
      std::memcpy(h + features_[f].offsets, fb.offsets.data(), fb.offsets.size() * 8);
      std::memcpy(h + features_[f].inverse, inverse[f].data(), inverse[f].size() * 4);
      std::memcpy(h + features_[f].weights, fb.weights.data(), fb.weights.size() * 4);
    }
    // The backward plan: each unique key's occurrences, in (feature, id)
    // order, with the coefficient the host's PoolBackward would use.
    for (size_t t = 0; t < tables; ++t) {
      TableSections& s = tables_[t];
      uint32_t* off = reinterpret_cast<uint32_t*>(h + s.occ_offsets);
      std::fill(off, off + s.unique + 1, 0u);
      for (size_t f = 0; f < features; ++f) {
        if (shape_->feature_table[f] != static_cast<int>(t)) continue;
        for (uint32_t u : inverse[f]) ++off[u + 1];
      }
      for (size_t u = 0; u < s.unique; ++u) off[u + 1] += off[u];
      cursor_.assign(off, off + s.unique);
      Occurrence* occ = reinterpret_cast<Occurrence*>(h + s.occ);
      float* coef = reinterpret_cast<float*>(h + s.coef);
      for (size_t f = 0; f < features; ++f) {
        if (shape_->feature_table[f] != static_cast<int>(t)) continue;
        const FeatureBatch& fb = batch.features[f];
        const float* w = fb.weights.empty() ? nullptr : fb.weights.data();
        for (size_t i = 0; i + 1 < fb.offsets.size(); ++i) {
          const float scale =
              pool::CombinerScale(w, fb.offsets[i], fb.offsets[i + 1], shape_->combiner[f]);
          for (int64_t j = fb.offsets[i]; j < fb.offsets[i + 1]; ++j) {
            const uint32_t k = cursor_[inverse[f][j]]++;
            occ[k] = {static_cast<uint32_t>(f), static_cast<uint32_t>(i)};
            coef[k] = pool::BackwardCoefficient(w, j, scale);
          }
        }
      }
    }
    // Outputs: pooled rows per feature, gradients per table.
    size_t pooled = 0, grads = 0;
    pooled_at_.assign(features, 0);
    grads_at_.assign(tables, 0);
    for (size_t f = 0; f < features; ++f) {
      pooled_at_[f] = pooled;
      pooled += batch_ * shape_->table_dim[shape_->feature_table[f]];
    }
    for (size_t t = 0; t < tables; ++t) {
      grads_at_[t] = grads;
      grads += tables_[t].unique * shape_->table_dim[t];
    }
    EMBER_RETURN_IF_ERROR(pooled_.Reserve(std::max<size_t>(pooled, 1) * 4));
    EMBER_RETURN_IF_ERROR(grads_.Reserve(std::max<size_t>(grads, 1) * 4));
    EMBER_RETURN_IF_ERROR(host_grads_.Reserve(std::max<size_t>(grads, 1) * 4));
    grad_floats_ = grads;
    return absl::OkStatus();
  }

  size_t upload_bytes() const override { return upload_bytes_; }
  size_t download_bytes() const override { return grad_floats_ * 4; }

  float* StagedRows(size_t table) override {
    return reinterpret_cast<float*>(host_.get<uint8_t>() + tables_[table].rows);
  }

  absl::Status Upload() override {
    cuda::DeviceScope scope(device_);
    EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(upload_.get(), host_.get(), upload_bytes_,
                                               cudaMemcpyHostToDevice, side_));
    EMBER_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploaded_.get(), side_));
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<const float*>> Forward(DeviceStream stream) override {
    cuda::DeviceScope scope(device_);
    EMBER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, uploaded_.get(), 0));
    const uint8_t* d = upload_.get<uint8_t>();
    std::vector<const float*> out(features_.size());
    for (size_t f = 0; f < features_.size(); ++f) {
      const size_t t = shape_->feature_table[f];
      const uint32_t dim = shape_->table_dim[t];
      const FeatureSections& s = features_[f];
      float* pooled = pooled_.get<float>() + pooled_at_[f];
      PoolForwardKernel<<<Blocks(batch_ * dim), kThreads, 0, stream>>>(
          reinterpret_cast<const int64_t*>(d + s.offsets),
          reinterpret_cast<const uint32_t*>(d + s.inverse),
          s.weighted ? reinterpret_cast<const float*>(d + s.weights) : nullptr,
          shape_->combiner[f], reinterpret_cast<const float*>(d + tables_[t].rows), dim, batch_,
          pooled);
      EMBER_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      out[f] = pooled;
    }
    return out;
  }

  absl::Status Backward(const std::vector<const float*>& d_pooled, DeviceStream stream) override {
    cuda::DeviceScope scope(device_);
    FeaturePointers ptrs{};
    for (size_t f = 0; f < d_pooled.size(); ++f) ptrs.p[f] = d_pooled[f];
    const uint8_t* d = upload_.get<uint8_t>();
    for (size_t t = 0; t < tables_.size(); ++t) {
      const TableSections& s = tables_[t];
      const uint32_t dim = shape_->table_dim[t];
      PoolBackwardKernel<<<Blocks(s.unique * dim), kThreads, 0, stream>>>(
          reinterpret_cast<const uint32_t*>(d + s.occ_offsets),
          reinterpret_cast<const Occurrence*>(d + s.occ),
          reinterpret_cast<const float*>(d + s.coef), ptrs, dim, s.unique,
          grads_.get<float>() + grads_at_[t]);
      EMBER_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
    // The copy to the host runs on the side stream, after the kernels: the
    // trainer's stream goes on at once.
    EMBER_CUDA_RETURN_IF_ERROR(cudaEventRecord(computed_.get(), stream));
    EMBER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_, computed_.get(), 0));
    EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_grads_.get(), grads_.get(),
                                               grad_floats_ * 4, cudaMemcpyDeviceToHost, side_));
    EMBER_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_.get(), side_));
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<const float*>> Gradients() override {
    EMBER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(copied_.get()));
    std::vector<const float*> out(tables_.size());
    for (size_t t = 0; t < tables_.size(); ++t) out[t] = host_grads_.get<float>() + grads_at_[t];
    return out;
  }

 private:
  const int device_;
  const DeviceStepShape* shape_;
  cudaStream_t side_;
  size_t batch_ = 0;
  std::vector<TableSections> tables_;
  std::vector<FeatureSections> features_;
  std::vector<uint32_t> cursor_;
  std::vector<size_t> pooled_at_, grads_at_;
  size_t upload_bytes_ = 0, grad_floats_ = 0;
  cuda::PinnedBuffer host_, host_grads_;
  cuda::DeviceBuffer upload_, pooled_, grads_;
  cuda::Event uploaded_, computed_, copied_;
};

class CudaDeviceContext final : public DeviceContext {
 public:
  CudaDeviceContext(int device, DeviceStepShape shape) : device_(device), shape_(std::move(shape)) {}
  absl::Status Init() {
    cuda::DeviceScope scope(device_);
    return side_.Create();
  }
  absl::StatusOr<std::unique_ptr<DeviceStep>> NewStep() override {
    auto step = std::make_unique<CudaDeviceStep>(device_, &shape_, side_.get());
    EMBER_RETURN_IF_ERROR(step->Init());
    return std::unique_ptr<DeviceStep>(std::move(step));
  }

 private:
  const int device_;
  const DeviceStepShape shape_;
  cuda::Stream side_;
};

__global__ void HeadFlagsKernel(const uint64_t* sorted, size_t n, uint32_t* flags) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) flags[i] = (i == 0 || sorted[i] != sorted[i - 1]) ? 1u : 0u;
}

// ids[i] is the inclusive count of heads up to sorted position i.
__global__ void ScatterUniqueKernel(const uint64_t* sorted, const uint32_t* positions,
                                    const uint32_t* ids, size_t n, uint64_t* unique,
                                    uint32_t* inverse) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const uint32_t id = ids[i] - 1;
  inverse[positions[i]] = id;
  if (i == 0 || sorted[i] != sorted[i - 1]) unique[id] = sorted[i];
}

__global__ void IotaKernel(uint32_t* out, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = static_cast<uint32_t>(i);
}

}  // namespace

bool HaveCudaPath() { return true; }

absl::StatusOr<std::unique_ptr<DeviceContext>> NewDeviceContext(int device,
                                                                 DeviceStepShape shape) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("device cuda:", device, ": this machine has ", count, " usable CUDA devices"));
  }
  if (shape.feature_table.size() > kMaxDeviceFeatures) {
    return absl::InvalidArgumentError(absl::StrCat("features: a device pipeline pools at most ",
                                                   kMaxDeviceFeatures, ", received ",
                                                   shape.feature_table.size()));
  }
  auto ctx = std::make_unique<CudaDeviceContext>(device, std::move(shape));
  EMBER_RETURN_IF_ERROR(ctx->Init());
  return std::unique_ptr<DeviceContext>(std::move(ctx));
}

absl::StatusOr<size_t> DeviceUnique(const uint64_t* keys, size_t n, uint64_t* unique,
                                    uint32_t* inverse, DeviceStream stream) {
  if (n == 0) return size_t{0};
  if (n > 0x7fffffffu) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceUnique: field 'n': expected at most 2^31-1 keys, received ", n));
  }
  cuda::DeviceBuffer positions, sorted_positions, sorted_keys, ids, temp;
  EMBER_RETURN_IF_ERROR(positions.Reserve(n * 4));
  EMBER_RETURN_IF_ERROR(sorted_positions.Reserve(n * 4));
  EMBER_RETURN_IF_ERROR(sorted_keys.Reserve(n * 8));
  EMBER_RETURN_IF_ERROR(ids.Reserve(n * 4));
  const int count = static_cast<int>(n);
  const unsigned blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  IotaKernel<<<blocks, kThreads, 0, stream>>>(positions.get<uint32_t>(), n);
  EMBER_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  size_t bytes = 0;
  EMBER_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, keys, sorted_keys.get<uint64_t>(), positions.get<uint32_t>(),
      sorted_positions.get<uint32_t>(), count, 0, 64, stream));
  size_t scan_bytes = 0;
  EMBER_CUDA_RETURN_IF_ERROR(cub::DeviceScan::InclusiveSum(
      nullptr, scan_bytes, ids.get<uint32_t>(), ids.get<uint32_t>(), count, stream));
  EMBER_RETURN_IF_ERROR(temp.Reserve(std::max(bytes, scan_bytes)));
  bytes = temp.bytes();
  EMBER_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(
      temp.get(), bytes, keys, sorted_keys.get<uint64_t>(), positions.get<uint32_t>(),
      sorted_positions.get<uint32_t>(), count, 0, 64, stream));
  HeadFlagsKernel<<<blocks, kThreads, 0, stream>>>(sorted_keys.get<uint64_t>(), n,
                                                   ids.get<uint32_t>());
  EMBER_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  scan_bytes = temp.bytes();
  EMBER_CUDA_RETURN_IF_ERROR(cub::DeviceScan::InclusiveSum(
      temp.get(), scan_bytes, ids.get<uint32_t>(), ids.get<uint32_t>(), count, stream));
  ScatterUniqueKernel<<<blocks, kThreads, 0, stream>>>(sorted_keys.get<uint64_t>(),
                                                       sorted_positions.get<uint32_t>(),
                                                       ids.get<uint32_t>(), n, unique, inverse);
  EMBER_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  uint32_t u = 0;
  EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&u, ids.get<uint32_t>() + n - 1, 4,
                                             cudaMemcpyDeviceToHost, stream));
  EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return static_cast<size_t>(u);
}

}  // namespace ember
