// The GPU half of a StepPipeline that delivers rows in device memory
// (PipelineOptions::device >= 0). Internal to the client library; the CUDA
// implementation is client/cuda/device_step.cu, and builds without CUDA get
// a factory that says so (client/device_none.cc).
//
// A step's life on the device:
//   network thread  Prepare   lays the step out in pinned host memory: the
//                             unique rows (filled by the caller through
//                             StagedRows), each feature's offsets, inverse
//                             and weights, and the backward plan;
//                   Upload    one host-to-device copy of all of it on the
//                             side stream, then an event;
//   trainer thread  Forward   the trainer's stream waits for that event and
//                             pools each feature into device memory;
//                   Backward  pooling's backward on the trainer's stream, then
//                             the per-key gradients go to pinned memory on
//                             the side stream (off the trainer's path);
//   network thread  Gradients waits for that copy and returns them.
// A DeviceStep is reused for later steps once Gradients returned.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "ember/batch.h"
#include "ember/device.h"

namespace ember {

// Per-pipeline constants of every step.
struct DeviceStepShape {
  std::vector<uint32_t> table_dim;    // per table
  std::vector<int> feature_table;     // per feature: index into table_dim
  std::vector<Combiner> combiner;     // per feature
};

class DeviceStep {
 public:
  virtual ~DeviceStep() = default;
  // `unique[t]`: unique key count of table t; `inverse[f]`: each id's index
  // among its table's unique keys. The batch is validated.
  virtual absl::Status Prepare(const Batch& batch, const std::vector<size_t>& unique,
                               const std::vector<std::vector<uint32_t>>& inverse) = 0;
  // Pinned memory for table t's unique rows (unique[t] x dim floats).
  virtual float* StagedRows(size_t table) = 0;
  virtual absl::Status Upload() = 0;
  // Device pointers to each feature's pooled [batch, dim] rows, valid until
  // the step is pushed; ordered on `stream`.
  virtual absl::StatusOr<std::vector<const float*>> Forward(DeviceStream stream) = 0;
  // `d_pooled[f]`: device memory, [batch, dim(f)], read in `stream` order.
  virtual absl::Status Backward(const std::vector<const float*>& d_pooled,
                                DeviceStream stream) = 0;
  // Per table, unique[t] x dim gradients in pinned host memory.
  virtual absl::StatusOr<std::vector<const float*>> Gradients() = 0;
  // Bytes of the prepared step's upload and of its gradients' download.
  virtual size_t upload_bytes() const = 0;
  virtual size_t download_bytes() const = 0;
};

class DeviceContext {
 public:
  virtual ~DeviceContext() = default;
  virtual absl::StatusOr<std::unique_ptr<DeviceStep>> NewStep() = 0;
};

// Most features a device pipeline pools (the backward kernel takes their
// gradient pointers by value).
inline constexpr size_t kMaxDeviceFeatures = 64;

// FAILED_PRECONDITION when the build has no CUDA or `device` is missing.
absl::StatusOr<std::unique_ptr<DeviceContext>> NewDeviceContext(int device,
                                                                 DeviceStepShape shape);

}  // namespace ember
