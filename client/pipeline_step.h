// PipelineStep: everything one StepPipeline step holds from Prefetch to the
// end of its push. Internal to the client library.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "client/device_step.h"
#include "client/request_plan.h"
#include "ember/batch.h"

namespace ember {

struct PipelineStep {
  int64_t step = 0;
  Batch batch;
  std::vector<std::vector<uint64_t>> unique;   // per table
  std::vector<std::vector<uint32_t>> inverse;  // per feature: unique index of each id
  // With a node shuffle: per table, the keys this rank fetches and pushes
  // for the whole node. Without, the fetched keys are `unique`.
  std::vector<std::vector<uint64_t>> owned;
  // Which shard serves each fetched key; the push goes the same way.
  RequestPlan plan;
  std::vector<std::vector<float>> pooled;    // per feature, [batch, dim] (host sink)
  std::vector<std::vector<float>> d_pooled;  // per feature, copied by Push (host sink)
  std::unique_ptr<DeviceStep> dev;           // the step on the GPU (device sink)
  bool ready = false;  // the fetch finished (or failed: see the pipeline's error)
  // unique and inverse are built (and, without a node shuffle, the plan):
  // the network thread does it ahead when it has nothing else to do.
  // Network thread only.
  bool keyed = false;
  // For the metrics: when Prefetch queued it and when its rows were ready;
  // its ids; the bytes its fetch, push and node shuffle moved.
  absl::Time prefetched;
  absl::Time ready_at;
  uint64_t keys = 0;
  uint64_t bytes = 0;
};

}  // namespace ember
