// RowSink: where a pipeline step's fetched rows go and where its gradients
// come from. HostRowSink pools on the CPU into the step's host buffers;
// DeviceRowSink stages the rows in pinned memory for one upload and pools
// on the GPU (client/device_step.h). Internal to the client library.
//
// Thread safety: Rows, Deliver, Gradients and Release are called by the
// pipeline's network thread only; the buffers they return are valid until
// the next call of the same kind.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/device_step.h"
#include "client/pipeline_step.h"
#include "client/pipeline_telemetry.h"
#include "ember/step_pipeline.h"

namespace ember {

// Per-pipeline constants a sink needs: the device path's.
using RowSinkShape = DeviceStepShape;

class RowSink {
 public:
  virtual ~RowSink() = default;
  // Per table, memory for step s's unique rows (unique[t].size() x dim
  // floats), to be filled before Deliver.
  virtual absl::StatusOr<std::vector<float*>> Rows(PipelineStep& s) = 0;
  // The rows are in place: pool them (host) or upload them (device).
  virtual absl::Status Deliver(PipelineStep& s, const std::vector<float*>& rows) = 0;
  // Deliver for rows given by address instead of in Rows' memory (a
  // StepMerger's, in the shards' answers): at[tb][u] points at unique row u
  // of table tb, dim floats at any alignment, valid during the call. The
  // host pools straight from them; the device stages them for its upload.
  virtual absl::Status DeliverAt(PipelineStep& s,
                                 const std::vector<std::vector<const char*>>& at) = 0;
  // Per table, step s's gradient per unique key (unique[t].size() x dim):
  // pooling's backward of s.d_pooled (host), or the copy PushFromDevice
  // started (device).
  virtual absl::StatusOr<std::vector<const float*>> Gradients(PipelineStep& s) = 0;
  // Step s's push is built: its buffers may be reused.
  virtual void Release(PipelineStep& s) = 0;
};

// `telemetry` (the "Pool" spans) outlives the sink.
std::unique_ptr<RowSink> NewHostRowSink(RowSinkShape shape, PipelineTelemetry* telemetry);
// Rows on GPU `device`; FAILED_PRECONDITION when the build has no CUDA or
// the device is missing.
absl::StatusOr<std::unique_ptr<RowSink>> NewDeviceRowSink(int device, RowSinkShape shape);

}  // namespace ember
