// ShardEdge: what every transport to a shard does around the shard core,
// once, with no network in it. The gRPC services (server/) and the trainer's
// in-process channel (client/in_process_channel.cc) both call it, so a
// further transport (shared memory, a standby's replica stream) is one
// channel and one listener that read an EdgeCall and call the edge.
//
// Around each call, in this order: a deadline already passed is refused
// (DEADLINE_EXCEEDED), the caller's role is checked against the tokens
// (shard/token_auth.h), the request's bytes are admitted against the
// in-flight limits (shard/inflight_limit.h), the routing epoch is checked
// (Shard::CheckRoutingEpoch), the core runs, and Lookup, Push and Exchange
// are counted in the shard's metrics with their status and latency. Errors
// are absl::Status; the transport converts them once at its own edge.
//
// Exchanges run in halves (Exchange below): the push never waits, the
// lookup may (the SSP clock). A transport that sends to several shards, or
// runs several exchanges on one thread, must run every push before any
// lookup: a lookup may wait for another worker that can only get past its
// own exchange once this caller's pushes are applied.
//
// Thread safety: every method may be called concurrently; an Exchange
// object is one caller's at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ember/v1/embedding_service.pb.h"
#include "shard/inflight_limit.h"
#include "shard/shard.h"
#include "shard/shard_metrics.h"
#include "shard/token_auth.h"

namespace ember {

// What a transport read of one call before it runs.
struct EdgeCall {
  // The method, for refusals, limits and metrics ("Lookup", "ExchangeStream").
  absl::string_view rpc;
  // The "authorization" metadata as sent; nullopt: none. Read only when
  // the shard has tokens.
  std::optional<std::string> authorization;
  // The connection, for the per-connection in-flight limit.
  std::string peer;
  // The routing epoch the caller routed by (0: not sent, not checked), or
  // why it could not be read (the call is then refused with it).
  absl::StatusOr<uint64_t> routing_epoch = uint64_t{0};
  // The call's deadline, which also bounds a lookup's wait for the clock.
  absl::Time deadline = absl::InfiniteFuture();
};

class ShardEdge {
 public:
  using Ticket = std::shared_ptr<const InflightLimit::Ticket>;

  // `shard` must outlive the edge, and so must `metrics` (null: none),
  // `auth` (null: every call may make every call) and `inflight` (null: no
  // limit).
  ShardEdge(Shard* shard, ShardMetrics* metrics, const TokenAuth* auth = nullptr,
            InflightLimit* inflight = nullptr)
      : shard_(shard), metrics_(metrics), auth_(auth), inflight_(inflight) {}

  Shard& shard() const { return *shard_; }
  ShardMetrics* metrics() const { return metrics_; }

  // The deadline (not passed while queued) and the role `needed`; `why`
  // (may be empty) says why the call needs it.
  absl::Status Authorize(const EdgeCall& call, Role needed, absl::string_view why = "") const;
  // A ticket for `bytes` of request (null without a limit), or
  // RESOURCE_EXHAUSTED naming the limit.
  absl::StatusOr<Ticket> Admit(const EdgeCall& call, size_t bytes) const;
  // ABORTED (or UNAVAILABLE) when the call was routed by another epoch.
  absl::Status CheckRouting(const EdgeCall& call) const;

  // The calls, each whole (the request's bytes admitted as serialised).
  // A lookup that inserts no row (every table read_only) is a reader's;
  // one that inserts, a trainer's.
  absl::Status Lookup(const EdgeCall& call, const v1::LookupRequest& request,
                      v1::LookupResponse* response) const;
  absl::Status Push(const EdgeCall& call, const v1::PushRequest& request,
                    v1::PushResponse* response) const;
  // A client of an older routing must not change the clock of the cluster
  // that replaced it (a pipeline closing after its cluster moved): both
  // check the routing epoch.
  absl::Status RegisterWorker(const EdgeCall& call, const v1::RegisterWorkerRequest& request,
                              v1::RegisterWorkerResponse* response) const;
  absl::Status UnregisterWorker(const EdgeCall& call, const v1::UnregisterWorkerRequest& request,
                                v1::UnregisterWorkerResponse* response) const;

  // The exchanges of one call (a unary Exchange: one; a stream: one per
  // message), in halves: Open once, then per message Push, then Answer
  // (which may wait when MayWait). Each message is counted once, with the
  // status that ended it.
  class Exchange {
   public:
    Exchange(const ShardEdge& edge, EdgeCall call) : edge_(edge), call_(std::move(call)) {}
    const EdgeCall& call() const { return call_; }
    // The deadline and the trainer role.
    absl::Status Open() const { return edge_.Authorize(call_, Role::kTrainer); }
    // Admits `wire_bytes` (held until Answer returns), checks the routing
    // and applies the push (`in_place`: see Shard::Push; its pieces must
    // stay unchanged through the call). Never waits.
    absl::Status Push(const v1::ExchangeRequest& request, v1::ExchangeResponse* response,
                      size_t wire_bytes, GradientPieces in_place = {});
    // Whether Answer may wait for slower workers (SSP); after Push.
    bool MayWait(const v1::ExchangeRequest& request) const;
    // The lookup, bounded by `deadline` (at most the call's); counts the
    // message. Its error says the push was applied.
    absl::Status Answer(const v1::ExchangeRequest& request, v1::ExchangeResponse* response,
                        absl::Time deadline);

   private:
    absl::Status Record(const absl::Status& status) const;

    const ShardEdge& edge_;
    const EdgeCall call_;
    Ticket ticket_;     // the message's in-flight bytes, from Push to Answer
    absl::Time start_;  // of the message's Push
  };

 private:
  // The trainer role, then the routing (the worker registration calls).
  absl::Status AuthorizeRouted(const EdgeCall& call) const;
  // Runs `call`, then counts it per method and status code with its latency.
  template <typename Call>
  absl::Status Measured(ShardMetrics::Rpc rpc, Call call) const;

  Shard* const shard_;
  ShardMetrics* const metrics_;
  const TokenAuth* const auth_;
  InflightLimit* const inflight_;
};

}  // namespace ember
