#include "ember/step_pipeline.h"

#include <condition_variable>
#include <cstring>
#include <algorithm>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/pipeline_exchanger.h"
#include "client/pipeline_step.h"
#include "client/pipeline_telemetry.h"
#include "client/pooling.h"
#include "client/request_plan.h"
#include "client/row_sink.h"
#include "client/step_scheduler.h"
#include "client/internal/step_merger_impl.h"
#include "ember/step_merger.h"
#include "common/status_macros.h"

namespace ember {
using Step = PipelineStep;

// The steps, the schedule and the trainer's calls; the network thread's
// exchanges are the PipelineExchanger's, which reads the steps through
// the StepBoard this implements.
class StepPipeline::Impl final : private StepBoard {
 public:
  Impl(Client* client, PipelineOptions options) : client_(client), options_(std::move(options)) {}

  absl::Status Init() {
    if (options_.features.empty()) {
      return absl::InvalidArgumentError("features: expected at least one feature, received 0");
    }
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
      feature_names_.push_back(f.name);
    }
    if (options_.node_one_worker && options_.node_transport == nullptr) {
      return absl::InvalidArgumentError(
          "node_one_worker: expected a node_transport to share the worker over, received none");
    }
    telemetry_.emplace(*client_, options_.worker_id, options_.staleness, options_.trace,
                       options_.metrics);
    const bool shuffled = options_.node_transport != nullptr;
    early_fetch_ = options_.staleness == 0 && !shuffled &&
                   (options_.merger != nullptr ? options_.merger->options().early_fetch
                                               : options_.early_fetch);
    exchanger_.emplace(client_, options_, tables_, table_dim_, feature_table_, &*telemetry_,
                       static_cast<StepBoard*>(this));
    EMBER_RETURN_IF_ERROR(exchanger_->Init(early_fetch_));
    // With a merger, every rank's network thread must offer the same
    // exchanges in the same order: the scheduler pairs by call order only.
    if (StepMerger* m = options_.merger) {
      if (shuffled) {
        return absl::InvalidArgumentError(
            "merger: a pipeline uses either a StepMerger or a node_transport, not both");
      }
      if (m->options().staleness != options_.staleness ||
          m->options().first_step != options_.first_step) {
        return absl::InvalidArgumentError(absl::StrCat(
            "merger: expected the merger's staleness ", m->options().staleness, " and first_step ",
            m->options().first_step, ", received staleness ", options_.staleness,
            " and first_step ", options_.first_step));
      }
      EMBER_RETURN_IF_ERROR(internal::MergerImpl(m)->Join(options_.merger_rank, tables_, table_dim_));
    }
    // With a node shuffle the network thread runs one job at a time in
    // call order (a fetch still waits for this worker's own earlier push, as
    // SSP requires): the ranks then meet in the same collectives in the same
    // order whatever their timing.
    StepScheduler::Options so;
    so.first_step = options_.first_step;
    so.staleness = options_.staleness;
    so.pairing = shuffled                      ? StepScheduler::Pairing::kOneAtATime
                 : options_.merger != nullptr ? StepScheduler::Pairing::kCallOrder
                                              : StepScheduler::Pairing::kHold;
    so.push_hold = kPushHold;
    so.early_fetch = early_fetch_;
    // With early fetch, step t + 2 may be prefetched before step t
    // computes: its fetch then goes out with push t the moment Push(t) is
    // called, and its keys are deduplicated while the network is idle.
    depth_ = options_.prefetch_depth >= 0 ? options_.prefetch_depth
             : early_fetch_              ? 2
                                         : std::max(1, options_.staleness);
    so.depth = depth_;
    scheduler_.emplace(so);
    // A node that is one worker registers it once: every other rank's first
    // exchange follows a collective with rank 0, so it is registered by then.
    if (options_.staleness >= 0 && options_.merger == nullptr &&
        (!options_.node_one_worker || exchanger_->node()->rank() == 0)) {
      EMBER_RETURN_IF_ERROR(client_->RegisterWorker(options_.worker_id, options_.first_step));
      registered_ = true;
    }
    return absl::OkStatus();
  }

  absl::Status Prefetch(int64_t step, Batch batch) {
    const absl::Time start = absl::Now();
    EMBER_RETURN_IF_ERROR(ValidateBatch(batch, feature_names_));
    telemetry_->Span(/*network=*/false, "Prefetch", start, step);
    auto s = std::make_shared<Step>();
    s->step = step;
    s->batch = std::move(batch);
    s->keys = CountKeys(s->batch);
    s->prefetched = absl::Now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      EMBER_RETURN_IF_ERROR(error_);
      EMBER_RETURN_IF_ERROR(scheduler_->CheckPrefetch(step));
      scheduler_->OnPrefetch(absl::Now());
      live_[step] = s;
    }
    telemetry_->Prefetched(s->keys);
    cv_.notify_all();
    return absl::OkStatus();
  }

  absl::StatusOr<StepView> Wait(int64_t step) {
    EMBER_RETURN_IF_ERROR(CheckMode(/*device=*/false, "Wait"));
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Step> s, AwaitStep(step));
    StepView view;
    view.step = step;
    view.batch_size = static_cast<int64_t>(s->batch.features[0].offsets.size()) - 1;
    for (auto& p : s->pooled) view.pooled.push_back(absl::MakeSpan(p));
    return view;
  }

  absl::StatusOr<DeviceStepView> WaitOnDevice(int64_t step, DeviceStream stream) {
    EMBER_RETURN_IF_ERROR(CheckMode(/*device=*/true, "WaitOnDevice"));
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Step> s, AwaitStep(step));
    DeviceStepView view;
    view.step = step;
    view.batch_size = static_cast<int64_t>(s->batch.features[0].offsets.size()) - 1;
    EMBER_ASSIGN_OR_RETURN(view.pooled, s->dev->Forward(stream));
    return view;
  }

  absl::Status Push(int64_t step, const std::vector<absl::Span<const float>>& d_pooled) {
    const absl::Time start = absl::Now();
    EMBER_RETURN_IF_ERROR(CheckMode(/*device=*/false, "Push"));
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Step> s, StepToPush(step, d_pooled.size()));
    const size_t batch = s->batch.features[0].offsets.size() - 1;
    for (size_t f = 0; f < d_pooled.size(); ++f) {
      if (d_pooled[f].size() != batch * dim(f)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "feature '", feature_names_[f], "' (table '", tables_[feature_table_[f]],
            "') field 'd_pooled': expected ", batch * dim(f), " floats (batch ", batch,
            " x dim ", dim(f), "), received ", d_pooled[f].size()));
      }
    }
    // The gradients go into the step's pooled buffers (same shapes; the
    // view is invalid from here on), so a push allocates nothing, and
    // gradients written in place over the view are not copied at all.
    s->d_pooled = std::move(s->pooled);
    s->pooled.clear();
    s->d_pooled.resize(d_pooled.size());
    for (size_t f = 0; f < d_pooled.size(); ++f) {
      s->d_pooled[f].resize(d_pooled[f].size());
      if (s->d_pooled[f].data() != d_pooled[f].data()) {
        memmove(s->d_pooled[f].data(), d_pooled[f].data(), d_pooled[f].size() * sizeof(float));
      }
    }
    QueuePush(std::move(s), start);
    return absl::OkStatus();
  }

  absl::Status PushFromDevice(int64_t step, const std::vector<const float*>& d_pooled,
                              DeviceStream stream) {
    const absl::Time start = absl::Now();
    EMBER_RETURN_IF_ERROR(CheckMode(/*device=*/true, "PushFromDevice"));
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Step> s, StepToPush(step, d_pooled.size()));
    for (size_t f = 0; f < d_pooled.size(); ++f) {
      if (d_pooled[f] == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "feature '", feature_names_[f], "' field 'd_pooled': expected a device pointer, received null"));
      }
    }
    EMBER_RETURN_IF_ERROR(s->dev->Backward(d_pooled, stream));
    QueuePush(std::move(s), start);
    return absl::OkStatus();
  }

  absl::Status Flush() {
    std::unique_lock<std::mutex> lock(mu_);
    ++flushers_;  // held pushes go out now
    cv_.notify_all();
    cv_.wait(lock, [&] { return scheduler_->pushes_in_flight() == 0; });
    --flushers_;
    return error_;
  }

  absl::Status Close() {
    if (closed_) return close_status_;
    closed_ = true;
    close_status_ = Flush();
    {
      // Fetches still queued are dropped (their steps will never be waited).
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (net_.joinable()) net_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.ok()) error_ = absl::FailedPreconditionError("the pipeline is closed");
    }
    if (options_.node_one_worker && close_status_.ok()) {
      // Every rank's last push is applied before rank 0 unregisters the
      // node's worker (a push of an unregistered worker would be refused).
      std::vector<std::vector<uint8_t>> none(exchanger_->node()->ranks()), recv;
      close_status_ = options_.node_transport->AllToAll(none, &recv);
    }
    if (registered_) {
      absl::Status s = client_->UnregisterWorker(options_.worker_id);
      if (close_status_.ok()) close_status_ = s;
    }
    return close_status_;
  }

  void Start() { net_ = std::thread([this] { NetLoop(); }); }

  size_t num_features() const { return feature_table_.size(); }
  uint32_t dim(size_t feature) const { return table_dim_[feature_table_.at(feature)]; }
  int depth() const { return depth_; }
  PipelineStats Stats() const { return telemetry_->Stats(); }

 private:
  // Host and device pipelines each have their own Wait / Push.
  absl::Status CheckMode(bool device, absl::string_view call) const {
    if (device == (options_.device >= 0)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        device ? absl::StrCat(call, ": this pipeline pools on the host (PipelineOptions::device "
                              "is -1): use Wait / Push")
               : absl::StrCat(call, ": this pipeline delivers rows on cuda:", options_.device,
                              ": use WaitOnDevice / PushFromDevice"));
  }

  // Wait's rules and the wait itself; the step, fetched and pooled.
  absl::StatusOr<std::shared_ptr<Step>> AwaitStep(int64_t step) {
    std::unique_lock<std::mutex> lock(mu_);
    EMBER_RETURN_IF_ERROR(scheduler_->CheckWait(step));
    std::shared_ptr<Step> s = live_.at(step);
    const absl::Time start = absl::Now();
    // An early-fetched step is ready once the push before it is sent: a
    // push held for a fetch to pair with goes now, as on Flush.
    const bool nudge = early_fetch_ && !s->ready;
    if (nudge) {
      ++flushers_;
      cv_.notify_all();
    }
    cv_.wait(lock, [&] { return s->ready || !error_.ok(); });
    if (nudge) --flushers_;
    telemetry_->Span(/*network=*/false, "Wait", start, step);
    scheduler_->OnWait();
    // The fetch took `fetch`; the trainer saw `waited` of it.
    telemetry_->Waited(absl::ToDoubleSeconds(absl::Now() - start),
                       absl::ToDoubleSeconds(s->ready_at - s->prefetched), error_.ok());
    EMBER_RETURN_IF_ERROR(error_);
    return s;
  }

  // Push's rules: the step to push, if `features` gradients may be pushed now.
  absl::StatusOr<std::shared_ptr<Step>> StepToPush(int64_t step, size_t features) {
    std::lock_guard<std::mutex> lock(mu_);
    EMBER_RETURN_IF_ERROR(error_);
    EMBER_RETURN_IF_ERROR(scheduler_->CheckPush(step));
    if (features != feature_table_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("Push: expected gradients for ",
                                                     feature_table_.size(), " features, received ",
                                                     features));
    }
    return live_.at(step);
  }

  void QueuePush(std::shared_ptr<Step> s, absl::Time start) {
    telemetry_->Span(/*network=*/false, "Push", start, s->step);
    {
      std::lock_guard<std::mutex> lock(mu_);
      scheduler_->OnPush(absl::Now());
    }
    cv_.notify_all();
  }

  // How long a push waits for the next fetch to share its round trip. The
  // trainer's next Prefetch normally follows Push at once; the bound keeps a
  // trainer that pauses from holding back other workers' lookups.
  static constexpr absl::Duration kPushHold = absl::Milliseconds(2);

  static uint64_t CountKeys(const Batch& b) {
    uint64_t n = 0;
    for (const FeatureBatch& f : b.features) n += f.keys.size();
    return n;
  }

  // The network thread: one exchange at a time, as the scheduler pairs them
  // (StepScheduler::Pairing).
  void NetLoop() {
    for (;;) {
      std::shared_ptr<Step> push, fetch;
      StepScheduler::Exchange exchange;
      {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
          StepScheduler::Decision d = scheduler_->Next(absl::Now(), flushers_ > 0, stopping_);
          using Kind = StepScheduler::Decision::Kind;
          if (d.kind == Kind::kWait) {
            if (Step* ahead = StepToKey()) {  // use the idle time
              lock.unlock();
              exchanger_->KeyStep(*ahead);
              lock.lock();
              continue;
            }
            cv_.wait(lock);
            continue;
          }
          if (d.kind == Kind::kWaitUntil) {
            cv_.wait_until(lock, absl::ToChronoTime(d.until));
            continue;
          }
          if (d.kind == Kind::kStop) {
            for (int64_t step : d.dropped) live_.at(step)->ready = true;  // never waited
            cv_.notify_all();
            if (!d.exchange.push) return;
          }
          exchange = d.exchange;
          break;
        }
        if (exchange.push) push = live_.at(*exchange.push);
        if (exchange.fetch) fetch = live_.at(*exchange.fetch);
      }
      absl::Status status = exchanger_->Send(push.get(), fetch.get());
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!status.ok() && error_.ok()) {
          error_ = status;
          telemetry_->Failed();
        }
        if (push) live_.erase(push->step);
        scheduler_->OnSent(exchange, status.ok());
      }
      if (push) telemetry_->Pushed(status.ok(), push->bytes);
      cv_.notify_all();
    }
  }

  // A prefetched step whose keys are not deduplicated yet, if any.
  Step* StepToKey() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& [step, s] : live_) {
      if (!s->keyed) return s.get();
    }
    return nullptr;
  }

  void MarkReady(Step& s) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      s.ready = true;
      s.ready_at = absl::Now();
    }
    cv_.notify_all();
  }

  Step* LiveStep(int64_t step) override {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.at(step).get();
  }

  int64_t PushedUpto() override {
    std::lock_guard<std::mutex> lock(mu_);
    return scheduler_->pushed_upto();
  }
  Client* const client_;
  const PipelineOptions options_;
  int depth_ = 1;
  std::vector<std::string> tables_;      // distinct tables, first-use order
  std::vector<uint32_t> table_dim_;
  std::vector<int> feature_table_;       // feature -> index in tables_
  std::vector<std::string> feature_names_;
  bool registered_ = false;
  bool closed_ = false;
  absl::Status close_status_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<StepScheduler> scheduler_ ABSL_GUARDED_BY(mu_);
  // Steps from Prefetch until their push is sent (or dropped at Close).
  absl::flat_hash_map<int64_t, std::shared_ptr<Step>> live_ ABSL_GUARDED_BY(mu_);
  int flushers_ ABSL_GUARDED_BY(mu_) = 0;  // Flush calls, and Waits of early-fetched steps
  bool early_fetch_ = false;  // set by Init
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The first failure; every later call returns it.
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::optional<PipelineTelemetry> telemetry_;
  std::optional<PipelineExchanger> exchanger_;  // the network thread's
  std::thread net_;
};

StepPipeline::StepPipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StepPipeline::~StepPipeline() {
  if (impl_) (void)impl_->Close();
}

absl::StatusOr<std::unique_ptr<StepPipeline>> StepPipeline::Create(Client* client,
                                                                   PipelineOptions options) {
  auto impl = std::make_unique<Impl>(client, std::move(options));
  EMBER_RETURN_IF_ERROR(impl->Init());
  impl->Start();
  return std::unique_ptr<StepPipeline>(new StepPipeline(std::move(impl)));
}

absl::Status StepPipeline::Prefetch(int64_t step, Batch batch) {
  return impl_->Prefetch(step, std::move(batch));
}
absl::StatusOr<StepView> StepPipeline::Wait(int64_t step) { return impl_->Wait(step); }
absl::Status StepPipeline::Push(int64_t step, const std::vector<absl::Span<const float>>& d_pooled) {
  return impl_->Push(step, d_pooled);
}
absl::StatusOr<DeviceStepView> StepPipeline::WaitOnDevice(int64_t step, DeviceStream stream) {
  return impl_->WaitOnDevice(step, stream);
}
absl::Status StepPipeline::PushFromDevice(int64_t step, const std::vector<const float*>& d_pooled,
                                          DeviceStream stream) {
  return impl_->PushFromDevice(step, d_pooled, stream);
}
absl::Status StepPipeline::Flush() { return impl_->Flush(); }
absl::Status StepPipeline::Close() { return impl_->Close(); }
size_t StepPipeline::num_features() const { return impl_->num_features(); }
uint32_t StepPipeline::dim(size_t feature) const { return impl_->dim(feature); }
int StepPipeline::prefetch_depth() const { return impl_->depth(); }
PipelineStats StepPipeline::Stats() const { return impl_->Stats(); }

}  // namespace ember
