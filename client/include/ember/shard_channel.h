// ShardChannel: the way from a trainer to the shards of one cluster.
//
// A Client (ember/client.h) does its routing, its checks and its
// conveniences over one channel; the pipelines, the step merger and the C
// and Python layers reach the shards only through a Client. Two channels
// exist: gRPC to shard servers (client/grpc_channel.h: streams, retries,
// TLS, tokens) and shards in the trainer's own process
// (client/in_process_channel.h). A further one (shared memory between the
// processes of one machine, say) implements this interface and is chosen in
// Client::Connect; nothing above the Client changes.
//
// Every call takes one request per shard (requests[i] for shard i) and runs
// them on all shards concurrently or in any order: a caller must not rely on
// one shard's call ending before another's starts. `responses` is resized
// to shard_count(); shards skipped (`active` false) leave theirs empty. The
// error of a failed call starts with ShardName(shard) and the method, then
// the shard's own message (which names the table, the field, and expected
// vs. received values); the shards' statuses are the same on every channel.
//
// Thread safety: every method may be called concurrently, from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "ember/exchange_answer.h"
#include "ember/v1/admin_service.pb.h"
#include "ember/v1/embedding_service.pb.h"

namespace ember {

// Counters of one channel over all shards; monotonic.
struct ClientStats {
  uint64_t rpcs = 0;      // attempts started
  uint64_t retries = 0;   // attempts that were retries after UNAVAILABLE
  uint64_t failures = 0;  // calls that returned an error to the caller
};

// One attempt of a call to one shard, as Exchange reports it (timelines).
struct ShardCall {
  uint32_t shard = 0;
  int attempt = 0;  // 0: the first; k > 0: the k-th retry after UNAVAILABLE
  absl::Time start;
  absl::Time end;
  absl::StatusCode code = absl::StatusCode::kOk;
};

// One Exchange over every shard (EmbeddingService.Exchange).
struct ExchangeCall {
  // requests[i] goes to shard i; null, or one with neither a push, a lookup
  // nor a peek, skips the shard.
  absl::Span<const std::shared_ptr<const v1::ExchangeRequest>> requests;
  // The requests are the channel's to keep past the call (the gRPC channel
  // then sends their large fields from their own memory while they are on
  // the wire); false: the channel reads them only during the call.
  bool handed_over = false;

  // Per shard: whether its request is sent (the rule of `requests` above).
  std::vector<bool> Active() const {
    std::vector<bool> active(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const v1::ExchangeRequest* r = requests[i].get();
      active[i] = r != nullptr && (r->has_push() || r->has_lookup() || r->has_peek());
    }
    return active;
  }
};

class ShardChannel {
 public:
  virtual ~ShardChannel() = default;

  virtual uint32_t shard_count() const = 0;
  // "shard 1 (127.0.0.1:5001)", "shard 1 (in-process)": how messages name it.
  virtual std::string ShardName(uint32_t shard) const = 0;
  // Whether the shards run in this process (their CPU is the process's).
  virtual bool in_process() const = 0;
  // Client::Connect: the routing epoch the shards reported, sent with every
  // later call (the ember-routing-epoch metadata) so that a shard at another
  // epoch refuses it (ABORTED) instead of serving it. Shards in this process
  // need none (nothing reshards them under the client).
  virtual void SetRoutingEpoch(uint64_t epoch) { (void)epoch; }

  // `wait_for_ready`: a shard that is not reachable yet is waited for until
  // `timeout` instead of failing at once (a cluster that is starting).
  virtual absl::Status GetShardInfo(absl::Duration timeout, bool wait_for_ready,
                                    std::vector<v1::GetShardInfoResponse>* responses) = 0;
  virtual absl::Status CreateTable(absl::Span<const v1::CreateTableRequest> requests,
                                   std::vector<v1::CreateTableResponse>* responses) = 0;
  virtual absl::Status ListTables(const std::vector<bool>& active,
                                  std::vector<v1::ListTablesResponse>* responses) = 0;
  virtual absl::Status Lookup(absl::Span<const v1::LookupRequest> requests,
                              const std::vector<bool>& active,
                              std::vector<v1::LookupResponse>* responses) = 0;
  virtual absl::Status Push(absl::Span<const v1::PushRequest> requests,
                            std::vector<v1::PushResponse>* responses) = 0;
  // `calls`, if given, gets every attempt appended (retries included).
  virtual absl::Status Exchange(const ExchangeCall& call, std::vector<ExchangeAnswer>* answers,
                                std::vector<ShardCall>* calls) = 0;
  virtual absl::Status RegisterWorker(absl::Span<const v1::RegisterWorkerRequest> requests,
                                      std::vector<v1::RegisterWorkerResponse>* responses) = 0;
  virtual absl::Status UnregisterWorker(absl::Span<const v1::UnregisterWorkerRequest> requests,
                                        std::vector<v1::UnregisterWorkerResponse>* responses) = 0;
  // `timeout` bounds each shard's call: its wait for the cut and its write.
  virtual absl::Status Checkpoint(absl::Span<const v1::CheckpointRequest> requests,
                                  absl::Duration timeout,
                                  std::vector<v1::CheckpointResponse>* responses) = 0;

  virtual ClientStats Stats() const = 0;
};

}  // namespace ember
