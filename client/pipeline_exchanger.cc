#include "client/pipeline_exchanger.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/internal/step_merger_impl.h"
#include "common/status_macros.h"
#include "ember/step_merger.h"

namespace ember {

using Step = PipelineStep;

PipelineExchanger::PipelineExchanger(Client* client, const PipelineOptions& options,
                                     const std::vector<std::string>& tables,
                                     const std::vector<uint32_t>& table_dim,
                                     const std::vector<int>& feature_table,
                                     PipelineTelemetry* telemetry, StepBoard* board)
    : client_(client),
      options_(options),
      clock_{options.staleness, options.worker_id},
      tables_(tables),
      table_dim_(table_dim),
      feature_table_(feature_table),
      telemetry_(telemetry),
      board_(board) {}

absl::Status PipelineExchanger::Init(bool early_fetch) {
  if (options_.node_transport != nullptr) {
    NodeShuffle::Owner owner;
    if (options_.node_one_worker) {
      owner = [client = client_, ranks = options_.node_transport->size()](uint64_t key) {
        return client->ShardOf(key) % ranks;
      };
    }
    node_ = std::make_unique<NodeShuffle>(options_.node_transport, table_dim_, std::move(owner));
  }
  RowSinkShape shape;
  shape.table_dim = table_dim_;
  shape.feature_table = feature_table_;
  for (const FeatureSpec& f : options_.features) shape.combiner.push_back(f.combiner);
  if (options_.device >= 0) {
    EMBER_ASSIGN_OR_RETURN(sink_, NewDeviceRowSink(options_.device, std::move(shape)));
  } else {
    sink_ = NewHostRowSink(std::move(shape), telemetry_);
  }
  if (early_fetch && options_.merger == nullptr) {
    EMBER_ASSIGN_OR_RETURN(std::vector<EarlyFetch::Table> described,
                           EarlyFetch::Describe(*client_, tables_));
    early_ = std::make_unique<EarlyFetch>(std::move(described), options_.early_fetch_patch);
  }
  return absl::OkStatus();
}

const std::vector<std::vector<uint64_t>>& PipelineExchanger::Fetched(const Step& s) const {
  return node_ ? s.owned : s.unique;
}

void PipelineExchanger::KeyStep(Step& s) {
  Dedup(s);
  if (!node_) s.plan.Route(*client_, tables_, table_dim_, s.unique);
}

void PipelineExchanger::Dedup(Step& s) {
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

absl::StatusOr<uint64_t> PipelineExchanger::BuildLookup(Step& s) {
  if (node_) {
    Dedup(s);
    EMBER_ASSIGN_OR_RETURN(s.owned, node_->RouteKeys(s.unique));
    s.plan.Route(*client_, tables_, table_dim_, s.owned);
  } else if (!s.keyed) {
    KeyStep(s);
  }
  return s.plan.keys();
}

absl::Status PipelineExchanger::FinishLookup(Step& s, const std::vector<ExchangeAnswer>& responses,
                                             bool over_peek) {
  const size_t tables = tables_.size();
  uint64_t received = 0;
  if (!node_) {  // by address, from where they arrived
    std::vector<const float*> peeked;
    if (over_peek) peeked = early_->PeekedRows();
    uint64_t rows = 0;
    EMBER_RETURN_IF_ERROR(s.plan.CollectRowAddresses(responses, over_peek ? &peeked : nullptr,
                                                     &rows_at_, &received, &rows));
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
  std::vector<absl::Span<const float>> owned_rows(fetched_scratch_.begin(), fetched_scratch_.end());
  EMBER_RETURN_IF_ERROR(node_->ShareRows(owned_rows, rows));
  CountBytes(s, 0, 0, node_->bytes_sent() + node_->bytes_received() - before);
  CountBytes(s, 0, received, 0);
  return sink_->Deliver(s, rows);
}

absl::StatusOr<uint64_t> PipelineExchanger::BuildPush(Step& s, std::vector<const float*> grads,
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

absl::Status PipelineExchanger::Send(Step* push, Step* fetch) {
  if (options_.merger != nullptr) return SendMerged(push, fetch);
  const uint32_t shards = client_->shard_count();
  std::vector<v1::ExchangeRequest> requests(shards);
  Step* refetch = nullptr;  // the step after the push, fetched after it after all
  if (push) {
    const absl::Time backward = absl::Now();
    EMBER_ASSIGN_OR_RETURN(const std::vector<const float*> grads, sink_->Gradients(*push));
    telemetry_->Span(/*network=*/true, "Backward", backward, push->step);
    if (early_ && early_->pending() == push->step + 1) {
      Step* next = board_->LiveStep(push->step + 1);
      EMBER_ASSIGN_OR_RETURN(const bool patched, PatchNext(*next, grads));
      if (!patched) refetch = next;
      CountBytes(*next, early_->FillAfterPush(next->step, patched, next->plan, clock_, &requests),
                 0, 0);
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
    peek = early_ && !(push && push->step == fetch->step - 1) &&
           board_->PushedUpto() < fetch->step - 1;
    const uint64_t sent = peek ? early_->FillPeek(fetch->step, Fetched(*fetch), fetch->plan,
                                                  Fetched(*board_->LiveStep(fetch->step - 1)),
                                                  options_.worker_id, &requests)
                               : fetch->plan.FillLookups(fetch->step, clock_, &requests);
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
    board_->MarkReady(*refetch);
  }
  if (fetch && peek) {
    EMBER_RETURN_IF_ERROR(early_->Receive(fetch->step, fetch->plan, responses));
    CountBytes(*fetch, 0, early_->peek_bytes(), 0);
    telemetry_->Peeked(early_->peek_bytes());
  } else if (fetch) {
    EMBER_RETURN_IF_ERROR(FinishLookup(*fetch, responses));
    board_->MarkReady(*fetch);
  }
  return absl::OkStatus();
}

bool PipelineExchanger::Talks(uint32_t sh) const {
  return !options_.node_one_worker || sh % node_->ranks() == node_->rank();
}

absl::StatusOr<bool> PipelineExchanger::PatchNext(Step& next,
                                                  const std::vector<const float*>& grads) {
  if (!early_->Patchable()) {
    telemetry_->Refetching();
    return false;
  }
  const absl::Time start = absl::Now();
  EMBER_ASSIGN_OR_RETURN(const std::vector<const float*> rows, early_->Patch(grads));
  telemetry_->Span(/*network=*/true, "Update", start, next.step);
  next.plan.PointAt(rows, &rows_at_);
  EMBER_RETURN_IF_ERROR(DeliverPatched(next, rows_at_, early_->rows_patched(), start));
  // The trainer just woken comes first: on a busy core it would otherwise
  // wait for this thread to build and send the exchange.
  std::this_thread::yield();
  return true;
}

absl::Status PipelineExchanger::DeliverPatched(Step& s,
                                               const std::vector<std::vector<const char*>>& at,
                                               uint64_t rows, absl::Time start) {
  EMBER_RETURN_IF_ERROR(sink_->DeliverAt(s, at));
  telemetry_->Patched(rows);
  telemetry_->Span(/*network=*/true, "Patch", start, s.step, absl::StrCat("\"rows\":", rows));
  board_->MarkReady(s);
  return absl::OkStatus();
}

absl::Status PipelineExchanger::SendMerged(Step* push, Step* fetch) {
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
    return DeliverPatched(*board_->LiveStep(step), part.patched_at, rows, start);
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
    Step* s = fetch && *part.rows_step == fetch->step ? fetch : board_->LiveStep(*part.rows_step);
    EMBER_RETURN_IF_ERROR(sink_->DeliverAt(*s, part.rows_at));
    board_->MarkReady(*s);
  }
  return absl::OkStatus();
}

void PipelineExchanger::CountBytes(Step& s, uint64_t sent, uint64_t received,
                                   uint64_t node_shuffle) {
  s.bytes += sent + received + node_shuffle;
  telemetry_->Bytes(sent, received, node_shuffle);
}

void PipelineExchanger::CountFetch(const Step& fetch, uint64_t unique_keys, const Step* push) {
  const int64_t applied = push != nullptr ? push->step : board_->PushedUpto();
  telemetry_->Fetching(unique_keys, fetch.keys, fetch.step - 1 - applied);
}

}  // namespace ember
