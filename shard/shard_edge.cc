#include "shard/shard_edge.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ember {

absl::Status ShardEdge::Authorize(const EdgeCall& call, Role needed, absl::string_view why) const {
  // A call whose deadline passed while it queued is not worth starting.
  if (call.deadline < absl::Now()) {
    return absl::DeadlineExceededError(absl::StrCat(call.rpc, ": deadline passed in queue"));
  }
  if (auth_ == nullptr) return absl::OkStatus();
  std::optional<absl::string_view> authorization;
  if (call.authorization.has_value()) authorization = *call.authorization;
  return auth_->Check(authorization, needed, call.rpc, why);
}

absl::StatusOr<ShardEdge::Ticket> ShardEdge::Admit(const EdgeCall& call, size_t bytes) const {
  if (inflight_ == nullptr) return Ticket();
  return inflight_->Acquire(call.peer, bytes, call.rpc);
}

absl::Status ShardEdge::CheckRouting(const EdgeCall& call) const {
  if (!call.routing_epoch.ok()) return call.routing_epoch.status();
  return shard_->CheckRoutingEpoch(*call.routing_epoch, call.rpc);
}

absl::Status ShardEdge::AuthorizeRouted(const EdgeCall& call) const {
  EMBER_RETURN_IF_ERROR(Authorize(call, Role::kTrainer));
  return CheckRouting(call);
}

template <typename Call>
absl::Status ShardEdge::Measured(ShardMetrics::Rpc rpc, Call call) const {
  if (metrics_ == nullptr) return call();
  const absl::Time start = absl::Now();
  const absl::Status status = call();
  metrics_->RecordCall(rpc, status.code(), absl::ToDoubleSeconds(absl::Now() - start));
  return status;
}

absl::Status ShardEdge::Lookup(const EdgeCall& call, const v1::LookupRequest& request,
                               v1::LookupResponse* response) const {
  const v1::TableLookup* inserting = nullptr;
  for (const v1::TableLookup& t : request.tables()) {
    if (!t.read_only()) {
      inserting = &t;
      break;
    }
  }
  EMBER_RETURN_IF_ERROR(inserting == nullptr
                            ? Authorize(call, Role::kReader)
                            : Authorize(call, Role::kTrainer,
                                        absl::StrCat("table '", inserting->table(),
                                                     "' has read_only = false: it inserts rows")));
  EMBER_ASSIGN_OR_RETURN(const Ticket ticket,
                         Admit(call, inflight_ == nullptr ? 0 : request.ByteSizeLong()));
  return Measured(ShardMetrics::Rpc::kLookup, [&] {
    EMBER_RETURN_IF_ERROR(CheckRouting(call));
    return shard_->Lookup(request, response, call.deadline);
  });
}

absl::Status ShardEdge::Push(const EdgeCall& call, const v1::PushRequest& request,
                             v1::PushResponse* response) const {
  EMBER_RETURN_IF_ERROR(Authorize(call, Role::kTrainer));
  EMBER_ASSIGN_OR_RETURN(const Ticket ticket,
                         Admit(call, inflight_ == nullptr ? 0 : request.ByteSizeLong()));
  return Measured(ShardMetrics::Rpc::kPush, [&] {
    EMBER_RETURN_IF_ERROR(CheckRouting(call));
    return shard_->Push(request, response);
  });
}

absl::Status ShardEdge::RegisterWorker(const EdgeCall& call,
                                       const v1::RegisterWorkerRequest& request,
                                       v1::RegisterWorkerResponse* response) const {
  EMBER_RETURN_IF_ERROR(AuthorizeRouted(call));
  return shard_->RegisterWorker(request, response);
}

absl::Status ShardEdge::UnregisterWorker(const EdgeCall& call,
                                         const v1::UnregisterWorkerRequest& request,
                                         v1::UnregisterWorkerResponse* response) const {
  EMBER_RETURN_IF_ERROR(AuthorizeRouted(call));
  shard_->UnregisterWorker(request, response);
  return absl::OkStatus();
}

absl::Status ShardEdge::Exchange::Record(const absl::Status& status) const {
  if (edge_.metrics_ != nullptr) {
    edge_.metrics_->RecordCall(ShardMetrics::Rpc::kExchange, status.code(),
                               absl::ToDoubleSeconds(absl::Now() - start_));
  }
  return status;
}

absl::Status ShardEdge::Exchange::Push(const v1::ExchangeRequest& request,
                                       v1::ExchangeResponse* response, size_t wire_bytes,
                                       GradientPieces in_place) {
  ticket_.reset();
  EMBER_ASSIGN_OR_RETURN(ticket_, edge_.Admit(call_, wire_bytes));
  start_ = absl::Now();
  // The call's epoch was read once; the shard's is compared per message.
  if (absl::Status routed = edge_.CheckRouting(call_); !routed.ok()) return Record(routed);
  const absl::Status pushed = edge_.shard_->ExchangePush(request, response, in_place);
  return pushed.ok() ? pushed : Record(pushed);
}

bool ShardEdge::Exchange::MayWait(const v1::ExchangeRequest& request) const {
  return (request.has_lookup() && edge_.shard_->MayWait(request.lookup())) ||
         (request.has_peek() && edge_.shard_->MayWait(request.peek()));
}

absl::Status ShardEdge::Exchange::Answer(const v1::ExchangeRequest& request,
                                         v1::ExchangeResponse* response, absl::Time deadline) {
  const absl::Status status =
      Record(edge_.shard_->ExchangeLookup(request, response, std::min(deadline, call_.deadline)));
  ticket_.reset();
  return status;
}

}  // namespace ember
