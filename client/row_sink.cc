#include "client/row_sink.h"

#include <cstring>

#include "client/pooling.h"
#include "common/status_macros.h"

namespace ember {
namespace {

class HostRowSink final : public RowSink {
 public:
  HostRowSink(RowSinkShape shape, PipelineTelemetry* telemetry)
      : shape_(std::move(shape)), telemetry_(telemetry) {}

  absl::StatusOr<std::vector<float*>> Rows(PipelineStep& s) override {
    const size_t tables = shape_.table_dim.size();
    std::vector<float*> rows(tables);
    rows_.resize(tables);
    for (size_t tb = 0; tb < tables; ++tb) {
      rows_[tb].resize(s.unique[tb].size() * shape_.table_dim[tb]);
      rows[tb] = rows_[tb].data();
    }
    return rows;
  }

  absl::Status Deliver(PipelineStep& s, const std::vector<float*>& rows) override {
    Pool(s, [&](size_t f, int tb, float* pooled) {
      const FeatureBatch& fb = s.batch.features[f];
      PoolForward(fb.offsets, s.inverse[f], fb.weights, shape_.combiner[f], rows[tb],
                  shape_.table_dim[tb], pooled);
    });
    return absl::OkStatus();
  }

  absl::Status DeliverAt(PipelineStep& s,
                         const std::vector<std::vector<const char*>>& at) override {
    Pool(s, [&](size_t f, int tb, float* pooled) {
      const FeatureBatch& fb = s.batch.features[f];
      PoolForwardAt(fb.offsets, s.inverse[f], fb.weights, shape_.combiner[f], at[tb].data(),
                    shape_.table_dim[tb], pooled);
    });
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<const float*>> Gradients(PipelineStep& s) override {
    const size_t tables = shape_.table_dim.size();
    std::vector<const float*> grads(tables);
    grads_.resize(tables);
    // Not zeroed first: PoolBackwardInto zeroes the rows each call reaches
    // for the first time (the features visit a table's ids in the order
    // Dedup numbered them, so each row is zeroed once, just before use).
    std::vector<uint32_t> written(tables, 0);
    for (size_t tb = 0; tb < tables; ++tb) {
      grads_[tb].resize(s.unique[tb].size() * shape_.table_dim[tb]);
      grads[tb] = grads_[tb].data();
    }
    for (size_t f = 0; f < shape_.feature_table.size(); ++f) {
      const FeatureBatch& fb = s.batch.features[f];
      const int tb = shape_.feature_table[f];
      PoolBackwardInto(fb.offsets, s.inverse[f], fb.weights, shape_.combiner[f],
                       s.d_pooled[f].data(), shape_.table_dim[tb], grads_[tb].data(),
                       &written[tb]);
    }
    for (size_t tb = 0; tb < tables; ++tb) {
      const size_t dim = shape_.table_dim[tb];
      std::fill(grads_[tb].begin() + written[tb] * dim, grads_[tb].end(), 0.0f);
    }
    return grads;
  }

  void Release(PipelineStep& s) override {
    // Push moved the step's pooled buffers into d_pooled; the next steps
    // pool into them. A few sets cover the steps in flight.
    if (spare_.size() < kMaxSpare && !s.d_pooled.empty()) spare_.push_back(std::move(s.d_pooled));
    s.d_pooled.clear();
  }

 private:
  // Pools every feature f of s: pool(f, table, pooled) writes its
  // [batch, dim] floats.
  template <typename PoolFeature>
  void Pool(PipelineStep& s, PoolFeature pool) {
    const absl::Time start = absl::Now();
    // Buffers of an earlier step, so that a step allocates and zero-fills
    // nothing (pooling writes every element).
    if (!spare_.empty()) {
      s.pooled = std::move(spare_.back());
      spare_.pop_back();
    }
    s.pooled.resize(shape_.feature_table.size());
    for (size_t f = 0; f < shape_.feature_table.size(); ++f) {
      const int tb = shape_.feature_table[f];
      s.pooled[f].resize((s.batch.features[f].offsets.size() - 1) * shape_.table_dim[tb]);
      pool(f, tb, s.pooled[f].data());
    }
    telemetry_->Span(/*network=*/true, "Pool", start, s.step);
  }

  static constexpr size_t kMaxSpare = 8;
  const RowSinkShape shape_;
  PipelineTelemetry* const telemetry_;
  std::vector<std::vector<std::vector<float>>> spare_;  // per feature, for reuse
  std::vector<std::vector<float>> rows_;   // the latest step's unique rows
  std::vector<std::vector<float>> grads_;  // the latest push's gradients
};

class DeviceRowSink final : public RowSink {
 public:
  DeviceRowSink(RowSinkShape shape, std::unique_ptr<DeviceContext> context)
      : shape_(std::move(shape)), context_(std::move(context)) {}

  absl::StatusOr<std::vector<float*>> Rows(PipelineStep& s) override {
    const size_t tables = shape_.table_dim.size();
    if (!free_.empty()) {
      s.dev = std::move(free_.back());
      free_.pop_back();
    } else {
      EMBER_ASSIGN_OR_RETURN(s.dev, context_->NewStep());
    }
    std::vector<size_t> unique(tables);
    for (size_t tb = 0; tb < tables; ++tb) unique[tb] = s.unique[tb].size();
    EMBER_RETURN_IF_ERROR(s.dev->Prepare(s.batch, unique, s.inverse));
    std::vector<float*> rows(tables);
    for (size_t tb = 0; tb < tables; ++tb) rows[tb] = s.dev->StagedRows(tb);
    return rows;
  }

  absl::Status Deliver(PipelineStep& s, const std::vector<float*>&) override {
    return s.dev->Upload();
  }

  absl::Status DeliverAt(PipelineStep& s,
                         const std::vector<std::vector<const char*>>& at) override {
    EMBER_ASSIGN_OR_RETURN(const std::vector<float*> staged, Rows(s));
    for (size_t tb = 0; tb < at.size(); ++tb) {
      const size_t row_bytes = size_t{shape_.table_dim[tb]} * sizeof(float);
      char* dst = reinterpret_cast<char*>(staged[tb]);
      for (size_t u = 0; u < at[tb].size(); ++u) memcpy(dst + u * row_bytes, at[tb][u], row_bytes);
    }
    return s.dev->Upload();
  }

  absl::StatusOr<std::vector<const float*>> Gradients(PipelineStep& s) override {
    return s.dev->Gradients();
  }

  void Release(PipelineStep& s) override {
    if (s.dev) free_.push_back(std::move(s.dev));
  }

 private:
  const RowSinkShape shape_;
  std::unique_ptr<DeviceContext> context_;
  std::vector<std::unique_ptr<DeviceStep>> free_;  // device steps to reuse
};

}  // namespace

std::unique_ptr<RowSink> NewHostRowSink(RowSinkShape shape, PipelineTelemetry* telemetry) {
  return std::make_unique<HostRowSink>(std::move(shape), telemetry);
}

absl::StatusOr<std::unique_ptr<RowSink>> NewDeviceRowSink(int device, RowSinkShape shape) {
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<DeviceContext> context, NewDeviceContext(device, shape));
  return std::make_unique<DeviceRowSink>(std::move(shape), std::move(context));
}

}  // namespace ember
