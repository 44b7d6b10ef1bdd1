#include "ember/step_pipeline.h"

#include <condition_variable>
#include <cstring>
#include <algorithm>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/dedup.h"
#include "client/early_fetch.h"
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

class StepPipeline::Impl {
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
    // With a node shuffle the network thread runs one job at a time in
    // call order (a fetch still waits for this worker's own earlier push, as
    // SSP requires): the ranks then meet in the same collectives in the same
    // order whatever their timing.
    if (options_.node_one_worker && options_.node_transport == nullptr) {
      return absl::InvalidArgumentError(
          "node_one_worker: expected a node_transport to share the worker over, received none");
    }
    if (options_.node_transport != nullptr) {
      NodeShuffle::Owner owner;
      if (options_.node_one_worker) {
        owner = [client = client_, ranks = options_.node_transport->size()](uint64_t key) {
          return client->ShardOf(key) % ranks;
        };
      }
      node_ = std::make_unique<NodeShuffle>(options_.node_transport, table_dim_, std::move(owner));
    }
    telemetry_.emplace(*client_, options_.worker_id, options_.staleness, options_.trace,
                       options_.metrics);
    RowSinkShape shape;
    shape.table_dim = table_dim_;
    shape.feature_table = feature_table_;
    for (const FeatureSpec& f : options_.features) shape.combiner.push_back(f.combiner);
    if (options_.device >= 0) {
      EMBER_ASSIGN_OR_RETURN(sink_, NewDeviceRowSink(options_.device, std::move(shape)));
    } else {
      sink_ = NewHostRowSink(std::move(shape), &*telemetry_);
    }
    // With a merger, every rank's network thread must offer the same
    // exchanges in the same order: the scheduler pairs by call order only.
    if (StepMerger* m = options_.merger) {
      if (node_) {
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
    StepScheduler::Options so;
    so.first_step = options_.first_step;
    so.staleness = options_.staleness;
    so.pairing = node_ ? StepScheduler::Pairing::kOneAtATime
                 : options_.merger != nullptr ? StepScheduler::Pairing::kCallOrder
                                              : StepScheduler::Pairing::kHold;
    so.push_hold = kPushHold;
    so.early_fetch = options_.staleness == 0 && !node_ &&
                     (options_.merger != nullptr ? options_.merger->options().early_fetch
                                                 : options_.early_fetch);
    if (so.early_fetch && options_.merger == nullptr) {
      EMBER_ASSIGN_OR_RETURN(std::vector<EarlyFetch::Table> described,
                             EarlyFetch::Describe(*client_, tables_));
      early_ = std::make_unique<EarlyFetch>(std::move(described), options_.early_fetch_patch);
    }
    early_fetch_ = so.early_fetch;
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
        (!options_.node_one_worker || node_->rank() == 0)) {
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
      std::vector<std::vector<uint8_t>> none(node_->ranks()), recv;
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
              KeyStep(*ahead);
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
      absl::Status status = SendExchange(push.get(), fetch.get());
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

  // The keys a step fetches and pushes, per table.
  const std::vector<std::vector<uint64_t>>& Fetched(const Step& s) const {
    return node_ ? s.owned : s.unique;
  }

  // A prefetched step whose keys are not deduplicated yet, if any.
  Step* StepToKey() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& [step, s] : live_) {
      if (!s->keyed) return s.get();
    }
    return nullptr;
  }

  // Dedup and, without a node shuffle (whose routing is a collective, in
  // call order), the route to shards.
  void KeyStep(Step& s) {
    Dedup(s);
    if (!node_) s.plan.Route(*client_, tables_, table_dim_, s.unique);
  }

  // Deduplicates each table's keys over the features that use it: fills
  // s.unique and s.inverse (once).
  void Dedup(Step& s) {
    if (s.keyed) return;
    s.keyed = true;
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
  }

  // Dedup, then (with a node shuffle) the keys this rank owns, and the
  // route to shards: fills s.unique, s.inverse, s.owned and s.plan. Returns
  // the fetched key count.
  absl::StatusOr<uint64_t> BuildLookup(Step& s) {
    if (node_) {
      Dedup(s);
      EMBER_ASSIGN_OR_RETURN(s.owned, node_->RouteKeys(s.unique));
      s.plan.Route(*client_, tables_, table_dim_, s.owned);
    } else if (!s.keyed) {
      KeyStep(s);
    }
    return s.plan.keys();
  }

  // Hands the shards' rows to the sink, which pools them per feature.
  // `over_peek`: the lookup asked for changed rows only (EarlyFetch::
  // AskChanged); the others are the early fetch's.
  absl::Status FinishLookup(Step& s, const std::vector<ExchangeAnswer>& responses,
                            bool over_peek = false) {
    const size_t tables = tables_.size();
    uint64_t received = 0;
    if (!node_) {  // by address, from where they arrived
      rows_at_.resize(tables);
      for (size_t tb = 0; tb < tables; ++tb) rows_at_[tb].resize(s.unique[tb].size());
      if (over_peek) {
        const std::vector<const float*> peeked = early_->PeekedRows();
        for (size_t tb = 0; tb < tables; ++tb) {
          if (peeked[tb] == nullptr) continue;
          for (size_t u = 0; u < rows_at_[tb].size(); ++u) {
            rows_at_[tb][u] = reinterpret_cast<const char*>(peeked[tb] + u * table_dim_[tb]);
          }
        }
      }
      uint64_t rows = 0;
      for (uint32_t sh = 0; sh < client_->shard_count(); ++sh) {
        if (!s.plan.HasKeys(sh)) continue;
        EMBER_RETURN_IF_ERROR(
            over_peek ? s.plan.ChangedRowAddresses(sh, responses[sh], &rows_at_, &received, &rows)
                      : s.plan.RowAddresses(sh, responses[sh], &rows_at_, &received));
      }
      CountBytes(s, 0, received, 0);
      if (over_peek) telemetry_->Refetched(rows, s.plan.keys());
      return sink_->DeliverAt(s, rows_at_);
    }
    EMBER_ASSIGN_OR_RETURN(const std::vector<float*> rows, sink_->Rows(s));
    // With a node shuffle the shards answer for the owned keys, which go
    // to scratch first, and the ranks then trade rows.
    std::vector<float*> into = rows;
    fetched_scratch_.resize(tables);
    for (size_t tb = 0; tb < tables; ++tb) {
      fetched_scratch_[tb].resize(s.owned[tb].size() * table_dim_[tb]);
      into[tb] = fetched_scratch_[tb].data();
    }
    for (uint32_t sh = 0; sh < client_->shard_count(); ++sh) {
      if (!s.plan.HasKeys(sh)) continue;
      EMBER_RETURN_IF_ERROR(s.plan.ScatterRows(sh, responses[sh], into, &received));
    }
    const uint64_t before = node_->bytes_sent() + node_->bytes_received();
    std::vector<absl::Span<const float>> owned_rows(fetched_scratch_.begin(),
                                                    fetched_scratch_.end());
    EMBER_RETURN_IF_ERROR(node_->ShareRows(owned_rows, rows));
    CountBytes(s, 0, 0, node_->bytes_sent() + node_->bytes_received() - before);
    CountBytes(s, 0, received, 0);
    return sink_->Deliver(s, rows);
  }

  // One PushRequest per shard (every shard, so that its clock advances) of
  // the step's gradients, routed by its plan (with a node shuffle: the
  // node's sums for the keys this rank owns). Returns the payload bytes.
  // `grads`: sink_->Gradients(s).
  absl::StatusOr<uint64_t> BuildPush(Step& s, std::vector<const float*> grads,
                                     std::vector<v1::PushRequest>* requests) {
    const uint32_t shards = client_->shard_count();
    const size_t tables = tables_.size();
    if (node_) {
      // Trade gradients: this rank pushes the node's sums for its own keys.
      const uint64_t before = node_->bytes_sent() + node_->bytes_received();
      std::vector<absl::Span<const float>> mine(tables);
      for (size_t tb = 0; tb < tables; ++tb) {
        mine[tb] = absl::MakeConstSpan(grads[tb], s.unique[tb].size() * table_dim_[tb]);
      }
      owned_grads_scratch_.resize(tables);  // network thread only
      std::vector<float*> owned(tables);
      for (size_t tb = 0; tb < tables; ++tb) {
        owned_grads_scratch_[tb].resize(node_->owned_floats(tb));
        owned[tb] = owned_grads_scratch_[tb].data();
      }
      EMBER_RETURN_IF_ERROR(node_->ReduceGradients(mine, owned));
      for (size_t tb = 0; tb < tables; ++tb) grads[tb] = owned[tb];
      CountBytes(s, 0, 0, node_->bytes_sent() + node_->bytes_received() - before);
    }
    requests->assign(shards, {});
    uint64_t sent = 0;
    for (uint32_t sh = 0; sh < shards; ++sh) {
      if (!Talks(sh)) continue;
      v1::PushRequest& r = (*requests)[sh];
      r.set_worker_id(options_.worker_id);
      r.set_step(s.step);
      sent += s.plan.FillPush(sh, grads, &r);
    }
    sink_->Release(s);
    return sent;
  }

  // One Exchange per shard carrying `push` (gradients of an earlier step)
  // and/or `fetch` (the rows of a later one). Marks the steps whose rows
  // it delivers ready. With early fetch, the step after `push` (peeked
  // while it computed) is brought forward and ready before the exchange
  // goes out, and `fetch` may be a peek, ready only once its own patch is.
  absl::Status SendExchange(Step* push, Step* fetch) {
    if (options_.merger != nullptr) return SendMerged(push, fetch);
    const uint32_t shards = client_->shard_count();
    std::vector<v1::ExchangeRequest> requests(shards);
    Step* refetch = nullptr;  // the step after the push, fetched after it after all
    if (push) {
      const absl::Time backward = absl::Now();
      EMBER_ASSIGN_OR_RETURN(const std::vector<const float*> grads, sink_->Gradients(*push));
      telemetry_->Span(/*network=*/true, "Backward", backward, push->step);
      if (early_ && early_->pending() == push->step + 1) {
        Step* next = LiveStep(push->step + 1);
        EMBER_ASSIGN_OR_RETURN(const bool patched, PatchNext(*next, grads));
        if (!patched) refetch = next;
        // The lookup's effects (or, to refetch, its rows) after the push, as
        // plain s = 0 has them.
        for (uint32_t sh = 0; sh < shards; ++sh) {
          if (!next->plan.HasKeys(sh)) continue;
          v1::LookupRequest* r = requests[sh].mutable_lookup();
          if (refetch) {
            CountBytes(*next, next->plan.FillLookup(sh, /*read_only=*/false, r), 0, 0);
            early_->AskChanged(sh, next->plan, r);
          } else {
            CountBytes(*next, early_->FillEffects(sh, next->plan, r), 0, 0);
          }
          if (r->tables_size() == 0) {  // nothing for the lookup to do here
            requests[sh].clear_lookup();
            continue;
          }
          SetClock(next->step, r);
        }
      }
      std::vector<v1::PushRequest> pushes;
      EMBER_ASSIGN_OR_RETURN(const uint64_t bytes, BuildPush(*push, grads, &pushes));
      CountBytes(*push, bytes, 0, 0);
      for (uint32_t sh = 0; sh < shards; ++sh) {
        if (Talks(sh)) requests[sh].mutable_push()->Swap(&pushes[sh]);
      }
    }
    bool peek = false;
    if (fetch) {
      EMBER_ASSIGN_OR_RETURN(const uint64_t unique_keys, BuildLookup(*fetch));
      // A peek unless the push before the fetched step is applied by now.
      peek = early_ && !(push && push->step == fetch->step - 1) && PushedUpto() < fetch->step - 1;
      uint64_t sent = 0;
      if (peek) {
        early_->FillPeek(fetch->step, Fetched(*fetch), fetch->plan,
                         Fetched(*LiveStep(fetch->step - 1)), options_.worker_id, &requests);
        for (const auto& r : requests) {
          for (const v1::TableLookup& t : r.peek().tables()) sent += t.keys().size();
        }
      } else {
        for (uint32_t sh = 0; sh < shards; ++sh) {
          if (!fetch->plan.HasKeys(sh)) continue;
          v1::LookupRequest* r = requests[sh].mutable_lookup();
          sent += fetch->plan.FillLookup(sh, /*read_only=*/false, r);
          SetClock(fetch->step, r);
        }
      }
      CountBytes(*fetch, sent, 0, 0);
      CountFetch(*fetch, unique_keys, push);
    }
    std::vector<ExchangeAnswer> responses;
    std::vector<ShardCall> calls;
    const absl::Time start = absl::Now();
    absl::Status status =
        client_->Exchange(HandOver(&requests), &responses, telemetry_->tracing() ? &calls : nullptr);
    telemetry_->ExchangeSpans(start, shards, push ? &push->step : nullptr,
                              fetch ? &fetch->step : nullptr, status.ok(), calls);
    EMBER_RETURN_IF_ERROR(status);
    if (refetch) {  // only the rows changed since the peek, over it
      EMBER_RETURN_IF_ERROR(FinishLookup(*refetch, responses, /*over_peek=*/true));
      early_->Drop();
      MarkReady(*refetch);
    }
    if (fetch && peek) {
      EMBER_RETURN_IF_ERROR(early_->Receive(fetch->step, fetch->plan, responses));
      CountBytes(*fetch, 0, early_->peek_bytes(), 0);
      telemetry_->Peeked(early_->peek_bytes());
    } else if (fetch) {
      EMBER_RETURN_IF_ERROR(FinishLookup(*fetch, responses));
      MarkReady(*fetch);
    }
    return absl::OkStatus();
  }

  // Whether this pipeline sends to shard `sh` at all: a node that is one
  // worker talks to each shard from one rank (its keys' owner).
  bool Talks(uint32_t sh) const {
    return !options_.node_one_worker || sh % node_->ranks() == node_->rank();
  }

  // The consistency fields of a lookup of `step` (none when asynchronous).
  void SetClock(int64_t step, v1::LookupRequest* r) const {
    if (options_.staleness < 0) return;
    r->set_step(step);
    r->set_staleness(static_cast<uint32_t>(options_.staleness));
    r->set_worker_id(options_.worker_id);
  }

  // Early fetch: brings `next`'s peeked rows forward through the push whose
  // per-key gradients are `grads` and delivers them (next is then ready),
  // or, when others may change them, leaves `next` to be fetched after the
  // push (false).
  absl::StatusOr<bool> PatchNext(Step& next, const std::vector<const float*>& grads) {
    if (!early_->Patchable()) {
      telemetry_->Refetching();
      return false;
    }
    const absl::Time start = absl::Now();
    EMBER_ASSIGN_OR_RETURN(const std::vector<const float*> rows, early_->Patch(grads));
    telemetry_->Span(/*network=*/true, "Update", start, next.step);
    const std::vector<std::vector<uint64_t>>& keys = Fetched(next);
    rows_at_.resize(tables_.size());
    for (size_t tb = 0; tb < tables_.size(); ++tb) {
      rows_at_[tb].resize(keys[tb].size());
      for (size_t u = 0; u < keys[tb].size(); ++u) {
        rows_at_[tb][u] = reinterpret_cast<const char*>(rows[tb] + u * table_dim_[tb]);
      }
    }
    EMBER_RETURN_IF_ERROR(DeliverPatched(next, rows_at_, early_->rows_patched(), start));
    // The trainer just woken comes first: on a busy core it would otherwise
    // wait for this thread to build and send the exchange.
    std::this_thread::yield();
    return true;
  }

  // Delivers a step's rows brought forward (`rows` of them patched, from
  // `start`): the step is ready.
  absl::Status DeliverPatched(Step& s, const std::vector<std::vector<const char*>>& at,
                              uint64_t rows, absl::Time start) {
    EMBER_RETURN_IF_ERROR(sink_->DeliverAt(s, at));
    telemetry_->Patched(rows);
    telemetry_->Span(/*network=*/true, "Patch", start, s.step, absl::StrCat("\"rows\":", rows));
    MarkReady(s);
    return absl::OkStatus();
  }

  void MarkReady(Step& s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      s.ready = true;
      s.ready_at = absl::Now();
    }
    cv_.notify_all();
  }

  Step* LiveStep(int64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.at(step).get();
  }

  int64_t PushedUpto() {
    std::lock_guard<std::mutex> lock(mu_);
    return scheduler_->pushed_upto();
  }

  // SendExchange through the node's StepMerger: this rank's part of one
  // merged Exchange per shard.
  absl::Status SendMerged(Step* push, Step* fetch) {
    internal::StepMergerImpl::Part part;
    if (push) {
      part.push_step = push->step;
      const absl::Time backward = absl::Now();
      EMBER_ASSIGN_OR_RETURN(part.grads, sink_->Gradients(*push));
      telemetry_->Span(/*network=*/true, "Backward", backward, push->step);
    }
    if (fetch) {
      Dedup(*fetch);
      part.fetch_step = fetch->step;
      part.keys = &fetch->unique;
    }
    // Early fetch: the step after the push, brought forward by the merger,
    // is delivered from this thread while the merged exchange is out.
    part.on_patched = [&](int64_t step, uint64_t rows, absl::Time start) {
      return DeliverPatched(*LiveStep(step), part.patched_at, rows, start);
    };
    const absl::Time start = absl::Now();
    absl::Status status = internal::MergerImpl(options_.merger)->Merge(options_.merger_rank, &part);
    telemetry_->Span(/*network=*/true, "Merged exchange", start, fetch ? fetch->step : push->step);
    if (push && part.sum_end != absl::Time()) {  // this rank led the round
      telemetry_->SpanEnded(/*network=*/true, "Sum", part.sum_start, part.sum_end, push->step);
      if (part.update_end != absl::Time()) {
        telemetry_->SpanEnded(/*network=*/true, "Update", part.update_start, part.update_end,
                              push->step + 1);
      }
    }
    if (push) {
      CountBytes(*push, part.bytes_sent, 0, 0);
      sink_->Release(*push);
    }
    if (fetch) {
      uint64_t unique_keys = 0;
      for (const auto& u : fetch->unique) unique_keys += u.size();
      CountFetch(*fetch, unique_keys, push);
      CountBytes(*fetch, 0, part.bytes_received, 0);
    }
    if (part.refetched) {
      telemetry_->Refetching();
      if (status.ok()) telemetry_->Refetched(part.refetched_rows, part.refetched_keys);
    }
    if (part.peek_bytes > 0) telemetry_->Peeked(part.peek_bytes);
    EMBER_RETURN_IF_ERROR(status);
    if (part.rows_step) {  // the fetched step, or the step after the push refetched
      Step* s = fetch && *part.rows_step == fetch->step ? fetch : LiveStep(*part.rows_step);
      EMBER_RETURN_IF_ERROR(sink_->DeliverAt(*s, part.rows_at));
      MarkReady(*s);
    }
    return absl::OkStatus();
  }

  // Adds payload bytes of step `s` to the stats, the metrics and the step.
  void CountBytes(Step& s, uint64_t sent, uint64_t received, uint64_t node_shuffle) {
    s.bytes += sent + received + node_shuffle;
    telemetry_->Bytes(sent, received, node_shuffle);
  }

  // A fetch about to go out (with `push`, if any, applied just before it):
  // its unique keys, and its staleness, the own earlier steps whose pushes
  // it will not see.
  void CountFetch(const Step& fetch, uint64_t unique_keys, const Step* push) {
    int64_t applied;
    {
      std::lock_guard<std::mutex> lock(mu_);
      applied = push != nullptr ? push->step : scheduler_->pushed_upto();
    }
    telemetry_->Fetching(unique_keys, fetch.keys, fetch.step - 1 - applied);
  }

  Client* const client_;
  const PipelineOptions options_;
  int depth_ = 1;
  std::vector<std::string> tables_;      // distinct tables, first-use order
  std::vector<uint32_t> table_dim_;
  std::vector<int> feature_table_;       // feature -> index in tables_
  std::vector<std::string> feature_names_;
  KeyDeduplicator dedup_;                          // network thread only
  std::vector<std::vector<float>> fetched_scratch_;  // network thread only
  std::vector<std::vector<const char*>> rows_at_;    // network thread only
  std::vector<std::vector<float>> owned_grads_scratch_;  // network thread only
  std::unique_ptr<NodeShuffle> node_;             // used by the network thread only
  std::unique_ptr<RowSink> sink_;                  // used by the network thread only
  std::unique_ptr<EarlyFetch> early_;              // network thread only; null: no early fetch
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
