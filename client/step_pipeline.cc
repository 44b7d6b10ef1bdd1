#include "ember/step_pipeline.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/dedup.h"
#include "client/pooling.h"
#include "client/serial_worker.h"
#include "common/status_macros.h"

namespace ember {
namespace {

// Everything one step needs from prefetch to push.
struct Step {
  int64_t step = 0;
  Batch batch;
  std::vector<std::vector<uint64_t>> unique;   // per table
  std::vector<std::vector<uint32_t>> inverse;  // per feature: unique index of each id
  // members[shard][table]: indices of the table's unique keys owned by shard.
  std::vector<std::vector<std::vector<uint32_t>>> members;
  // The lookup sent to each shard; the push takes its packed keys over.
  std::vector<v1::LookupRequest> lookups;
  std::vector<std::vector<float>> pooled;    // per feature, [batch, dim]
  std::vector<std::vector<float>> d_pooled;  // per feature, copied by Push
  bool ready = false;
  absl::Status status;
};

}  // namespace

class StepPipeline::Impl {
 public:
  Impl(Client* client, PipelineOptions options) : client_(client), options_(std::move(options)) {}

  absl::Status Init() {
    if (options_.features.empty()) {
      return absl::InvalidArgumentError("features: expected at least one feature, received 0");
    }
    depth_ = options_.prefetch_depth >= 0 ? options_.prefetch_depth
                                          : std::max(1, options_.staleness);
    if (options_.first_step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("first_step: expected >= 0, received ", options_.first_step));
    }
    EMBER_ASSIGN_OR_RETURN(std::vector<v1::TableInfo> infos, client_->ListTables());
    absl::flat_hash_map<std::string, uint32_t> dims;
    for (const v1::TableInfo& t : infos) dims[t.config().name()] = t.config().dim();
    absl::flat_hash_map<std::string, int> table_index;
    for (const FeatureSpec& f : options_.features) {
      auto dim = dims.find(f.table);
      if (dim == dims.end()) {
        return absl::NotFoundError(absl::StrCat("feature '", f.name, "': table '", f.table,
                                                "' not found on the cluster"));
      }
      auto [it, inserted] = table_index.try_emplace(f.table, static_cast<int>(tables_.size()));
      if (inserted) {
        tables_.push_back(f.table);
        table_dim_.push_back(dim->second);
      }
      feature_table_.push_back(it->second);
      feature_dim_.push_back(dim->second);
      feature_names_.push_back(f.name);
    }
    next_prefetch_ = next_wait_ = next_push_ = options_.first_step;
    if (options_.staleness >= 0) {
      EMBER_RETURN_IF_ERROR(client_->RegisterWorker(options_.worker_id, options_.first_step));
      registered_ = true;
    }
    return absl::OkStatus();
  }

  absl::Status Prefetch(int64_t step, Batch batch) {
    EMBER_RETURN_IF_ERROR(ValidateBatch(batch, feature_names_));
    auto s = std::make_shared<Step>();
    s->step = step;
    s->batch = std::move(batch);
    {
      std::lock_guard<std::mutex> lock(mu_);
      EMBER_RETURN_IF_ERROR(error_);
      if (step != next_prefetch_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "Prefetch: expected step ", next_prefetch_, ", received ", step));
      }
      if (next_prefetch_ - next_push_ > depth_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "Prefetch of step ", step, ": prefetch depth is ", depth_, " and step ", next_push_,
            " is not pushed yet"));
      }
      ++next_prefetch_;
      steps_.push_back(s);
      stats_.keys += CountKeys(s->batch);
    }
    fetcher_.Schedule([this, s] { Finish(s, Fetch(*s)); });
    return absl::OkStatus();
  }

  absl::StatusOr<StepView> Wait(int64_t step) {
    std::unique_lock<std::mutex> lock(mu_);
    if (step != next_wait_ || step >= next_prefetch_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Wait: expected step ", next_wait_,
          next_wait_ >= next_prefetch_ ? " (prefetch it first)" : "", ", received ", step));
    }
    std::shared_ptr<Step> s = steps_[step - steps_.front()->step];
    const absl::Time start = absl::Now();
    cv_.wait(lock, [&] { return s->ready || !error_.ok(); });
    const double waited = absl::ToDoubleSeconds(absl::Now() - start);
    stats_.wait_seconds += waited;
    stats_.max_wait_seconds = std::max(stats_.max_wait_seconds, waited);
    ++stats_.steps_waited;
    ++next_wait_;
    EMBER_RETURN_IF_ERROR(error_);
    StepView view;
    view.step = step;
    view.batch_size = static_cast<int64_t>(s->batch.features[0].offsets.size()) - 1;
    for (const auto& p : s->pooled) view.pooled.push_back(p);
    return view;
  }

  absl::Status Push(int64_t step, const std::vector<absl::Span<const float>>& d_pooled) {
    std::shared_ptr<Step> s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      EMBER_RETURN_IF_ERROR(error_);
      if (step != next_push_ || step >= next_wait_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "Push: expected step ", next_push_, next_push_ >= next_wait_ ? " (wait for it first)" : "",
            ", received ", step));
      }
      s = steps_.front();
    }
    const size_t batch = s->batch.features[0].offsets.size() - 1;
    if (d_pooled.size() != feature_dim_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("Push: expected gradients for ",
                                                     feature_dim_.size(), " features, received ",
                                                     d_pooled.size()));
    }
    for (size_t f = 0; f < d_pooled.size(); ++f) {
      if (d_pooled[f].size() != batch * feature_dim_[f]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "feature '", feature_names_[f], "' (table '", tables_[feature_table_[f]],
            "') field 'd_pooled': expected ", batch * feature_dim_[f], " floats (batch ", batch,
            " x dim ", feature_dim_[f], "), received ", d_pooled[f].size()));
      }
    }
    s->d_pooled.resize(d_pooled.size());
    for (size_t f = 0; f < d_pooled.size(); ++f) {
      s->d_pooled[f].assign(d_pooled[f].begin(), d_pooled[f].end());
    }
    s->pooled.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      steps_.pop_front();
      ++next_push_;
      ++pushes_in_flight_;
    }
    pusher_.Schedule([this, s] { FinishPush(SendGradients(*s)); });
    return absl::OkStatus();
  }

  absl::Status Flush() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pushes_in_flight_ == 0; });
    return error_;
  }

  absl::Status Close() {
    if (closed_) return close_status_;
    closed_ = true;
    close_status_ = Flush();
    if (registered_) {
      absl::Status s = client_->UnregisterWorker(options_.worker_id);
      if (close_status_.ok()) close_status_ = s;
    }
    return close_status_;
  }

  uint32_t dim(size_t feature) const { return feature_dim_.at(feature); }
  int depth() const { return depth_; }
  PipelineStats Stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  static uint64_t CountKeys(const Batch& b) {
    uint64_t n = 0;
    for (const FeatureBatch& f : b.features) n += f.keys.size();
    return n;
  }

  // Dedup per table, route, one Lookup per shard, scatter, pool.
  absl::Status Fetch(Step& s) {
    const uint32_t shards = client_->shard_count();
    const size_t tables = tables_.size();
    s.unique.assign(tables, {});
    s.inverse.assign(feature_table_.size(), {});
    for (size_t tb = 0; tb < tables; ++tb) {
      dedup_.Clear();
      for (size_t f = 0; f < feature_table_.size(); ++f) {
        if (feature_table_[f] == static_cast<int>(tb)) {
          dedup_.Add(s.batch.features[f].keys, &s.inverse[f]);
        }
      }
      s.unique[tb] = dedup_.unique();
    }
    s.members.assign(shards, std::vector<std::vector<uint32_t>>(tables));
    uint64_t unique_keys = 0;
    for (size_t tb = 0; tb < tables; ++tb) {
      const std::vector<uint64_t>& keys = s.unique[tb];
      unique_keys += keys.size();
      for (uint32_t u = 0; u < keys.size(); ++u) s.members[client_->ShardOf(keys[u])][tb].push_back(u);
    }
    // Keys are packed straight into the requests; Push later moves them into
    // its own requests, so each key is copied onto the wire once.
    s.lookups.assign(shards, {});
    uint64_t sent = 0;
    for (uint32_t sh = 0; sh < shards; ++sh) {
      v1::LookupRequest& r = s.lookups[sh];
      for (size_t tb = 0; tb < tables; ++tb) {
        const std::vector<uint32_t>& m = s.members[sh][tb];
        if (m.empty()) continue;
        v1::TableLookup* t = r.add_tables();
        t->set_table(tables_[tb]);
        t->set_dtype(v1::DTYPE_FP32);
        std::string* bytes = t->mutable_keys();
        bytes->resize(m.size() * 8);
        for (size_t j = 0; j < m.size(); ++j) memcpy(bytes->data() + j * 8, &s.unique[tb][m[j]], 8);
        sent += bytes->size();
      }
      if (options_.staleness >= 0 && r.tables_size() > 0) {
        r.set_step(s.step);
        r.set_staleness(static_cast<uint32_t>(options_.staleness));
        r.set_worker_id(options_.worker_id);
      }
    }
    std::vector<v1::LookupResponse> responses;
    EMBER_RETURN_IF_ERROR(client_->Lookup(s.lookups, &responses));

    std::vector<std::vector<float>>& rows = rows_scratch_;  // fetch thread only
    rows.resize(tables);
    for (size_t tb = 0; tb < tables; ++tb) rows[tb].resize(s.unique[tb].size() * table_dim_[tb]);
    uint64_t received = 0;
    for (uint32_t sh = 0; sh < shards; ++sh) {
      int entry = 0;
      for (size_t tb = 0; tb < tables; ++tb) {
        const std::vector<uint32_t>& m = s.members[sh][tb];
        if (m.empty()) continue;
        const size_t dim = table_dim_[tb];
        const v1::TableRows& r = responses[sh].tables(entry++);
        if (r.rows().size() != m.size() * dim * 4) {
          return absl::InternalError(absl::StrCat(
              client_->ShardName(sh), " table '", tables_[tb], "' field 'rows': expected ",
              m.size() * dim * 4, " bytes, received ", r.rows().size()));
        }
        received += r.rows().size();
        for (size_t j = 0; j < m.size(); ++j) {
          memcpy(&rows[tb][m[j] * dim], r.rows().data() + j * dim * 4, dim * 4);
        }
      }
    }
    s.pooled.resize(feature_table_.size());
    for (size_t f = 0; f < feature_table_.size(); ++f) {
      const FeatureBatch& fb = s.batch.features[f];
      const int tb = feature_table_[f];
      s.pooled[f].resize((fb.offsets.size() - 1) * table_dim_[tb]);
      PoolForward(fb.offsets, s.inverse[f], fb.weights, options_.features[f].combiner,
                  rows[tb].data(), table_dim_[tb], s.pooled[f].data());
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.unique_keys += unique_keys;
    stats_.bytes_sent += sent;
    stats_.bytes_received += received;
    return absl::OkStatus();
  }

  // Backward of pooling into per-unique-key gradients, one Push per shard.
  absl::Status SendGradients(Step& s) {
    const uint32_t shards = client_->shard_count();
    const size_t tables = tables_.size();
    std::vector<std::vector<float>>& grads = grads_scratch_;  // push thread only
    grads.resize(tables);
    for (size_t tb = 0; tb < tables; ++tb) grads[tb].assign(s.unique[tb].size() * table_dim_[tb], 0);
    for (size_t f = 0; f < feature_table_.size(); ++f) {
      const FeatureBatch& fb = s.batch.features[f];
      const int tb = feature_table_[f];
      PoolBackward(fb.offsets, s.inverse[f], fb.weights, options_.features[f].combiner,
                   s.d_pooled[f].data(), table_dim_[tb], grads[tb].data());
    }
    std::vector<v1::PushRequest> requests(shards);
    uint64_t sent = 0;
    for (uint32_t sh = 0; sh < shards; ++sh) {
      v1::PushRequest& r = requests[sh];
      r.set_worker_id(options_.worker_id);
      r.set_step(s.step);
      int entry = 0;
      for (size_t tb = 0; tb < tables; ++tb) {
        const std::vector<uint32_t>& m = s.members[sh][tb];
        if (m.empty()) continue;
        const size_t dim = table_dim_[tb];
        v1::TableGradients* t = r.add_tables();
        t->set_table(tables_[tb]);
        t->mutable_keys()->swap(*s.lookups[sh].mutable_tables(entry++)->mutable_keys());
        t->set_dtype(v1::DTYPE_FP32);
        std::string* g = t->mutable_gradients();
        g->resize(m.size() * dim * 4);
        for (size_t j = 0; j < m.size(); ++j) {
          memcpy(g->data() + j * dim * 4, &grads[tb][m[j] * dim], dim * 4);
        }
        sent += t->keys().size() + g->size();
      }
    }
    std::vector<v1::PushResponse> responses;
    EMBER_RETURN_IF_ERROR(client_->Push(requests, &responses));
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_sent += sent;
    return absl::OkStatus();
  }

  void Finish(const std::shared_ptr<Step>& s, absl::Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      s->status = status;
      s->ready = true;
      if (!status.ok() && error_.ok()) error_ = status;
    }
    cv_.notify_all();
  }

  void FinishPush(absl::Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --pushes_in_flight_;
      ++stats_.steps_pushed;
      if (!status.ok() && error_.ok()) error_ = status;
    }
    cv_.notify_all();
  }

  Client* const client_;
  const PipelineOptions options_;
  int depth_ = 1;
  std::vector<std::string> tables_;      // distinct tables, first-use order
  std::vector<uint32_t> table_dim_;
  std::vector<int> feature_table_;       // feature -> index in tables_
  std::vector<uint32_t> feature_dim_;
  std::vector<std::string> feature_names_;
  KeyDeduplicator dedup_;                          // fetch thread only
  std::vector<std::vector<float>> rows_scratch_;   // fetch thread only
  std::vector<std::vector<float>> grads_scratch_;  // push thread only
  bool registered_ = false;
  bool closed_ = false;
  absl::Status close_status_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Step>> steps_;  // prefetched, not pushed, in step order
  int64_t next_prefetch_ = 0, next_wait_ = 0, next_push_ = 0;
  int pushes_in_flight_ = 0;
  absl::Status error_;  // the first failure; every later call returns it
  PipelineStats stats_;

 public:
  // Declared last: destroyed first, so their threads stop before the state
  // above goes away.
  SerialWorker fetcher_;
  SerialWorker pusher_;
};

StepPipeline::StepPipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StepPipeline::~StepPipeline() {
  if (impl_) (void)impl_->Close();
}

absl::StatusOr<std::unique_ptr<StepPipeline>> StepPipeline::Create(Client* client,
                                                                   PipelineOptions options) {
  auto impl = std::make_unique<Impl>(client, std::move(options));
  EMBER_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<StepPipeline>(new StepPipeline(std::move(impl)));
}

absl::Status StepPipeline::Prefetch(int64_t step, Batch batch) {
  return impl_->Prefetch(step, std::move(batch));
}
absl::StatusOr<StepView> StepPipeline::Wait(int64_t step) { return impl_->Wait(step); }
absl::Status StepPipeline::Push(int64_t step, const std::vector<absl::Span<const float>>& d_pooled) {
  return impl_->Push(step, d_pooled);
}
absl::Status StepPipeline::Flush() { return impl_->Flush(); }
absl::Status StepPipeline::Close() { return impl_->Close(); }
uint32_t StepPipeline::dim(size_t feature) const { return impl_->dim(feature); }
int StepPipeline::prefetch_depth() const { return impl_->depth(); }
PipelineStats StepPipeline::Stats() const { return impl_->Stats(); }

}  // namespace ember
