// ember::Client: the trainer's connection to every shard of a cluster, the
// shards being servers (reached over gRPC) or in the trainer's own process
// (ClientOptions::in_process); the rest of the library sees only the Client,
// which reaches the shards through one ShardChannel (ember/shard_channel.h).
//
// It routes keys with the function the shards check (common/key_router.h),
// sends one RPC per shard, to all shards in parallel, with a deadline on
// every call, and retries calls that fail with UNAVAILABLE (shard down or
// restarting) with exponential backoff until a time budget is spent. Errors
// name the shard and its address; the shard's own message names the table,
// the field and the expected vs. received values.
//
// Thread safety: every method may be called concurrently; one Client is meant
// to be shared by all step pipelines of a trainer process.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/key_router.h"
#include "ember/client_options.h"
#include "ember/exchange_answer.h"
#include "ember/shard_channel.h"
#include "ember/v1/admin_service.pb.h"
#include "ember/v1/embedding_service.pb.h"

namespace ember {

struct ClusterCheckpoint {
  int64_t step = -1;
  std::string id;
  std::vector<v1::CheckpointResponse> shards;  // shard i's answer at i
};

class Client {
 public:
  // Connects to every shard (starts them, for in-process shards), checks
  // that shard i reports index i of shards.size() and that all report the
  // same routing (common/key_router.h), and routes keys by it.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  // The same over a channel of the caller's (`options.shards` and
  // `options.in_process` are not used then; the other fields are).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(std::unique_ptr<ShardChannel> channel,
                                                         const ClientOptions& options);
  // Connects to the cluster as it is now, after a move changed its shard
  // count (a call refused with ABORTED: docs/operations.md, "Changing the
  // shard count online"): the addresses come from the shards of
  // `options.shards` (GetShardInfo.cluster_addresses of the newest routing
  // epoch; the given ones if no shard names any), and while the shards
  // disagree (a move committing) it tries again until connect_timeout.
  static absl::StatusOr<std::unique_ptr<Client>> ConnectToCluster(const ClientOptions& options);
  ~Client();

  uint32_t shard_count() const;
  const ClientOptions& options() const;
  // The shard that owns `key`.
  uint32_t ShardOf(uint64_t key) const;
  // The cluster's routing epoch as the shards reported it at Connect (all
  // the same); every Lookup, Push and Exchange carries it, and a shard
  // resharded since refuses them with ABORTED: connect again to route by
  // its new shard count and routing. 0 for shards older than epochs.
  uint64_t routing_epoch() const { return routing_epoch_; }
  // "shard 1 (127.0.0.1:5001)", "shard 1 (in-process)", for messages.
  std::string ShardName(uint32_t shard) const;
  // Whether the shards run in this process.
  bool in_process() const;

  // Creates the table on every shard (idempotent for an identical definition).
  absl::Status CreateTable(const v1::TableConfig& config);
  // Tables as shard 0 knows them (every shard holds the same definitions).
  absl::StatusOr<std::vector<v1::TableInfo>> ListTables();
  // Stored rows of `table`, summed over shards.
  absl::StatusOr<uint64_t> StoredRows(const std::string& table);

  // requests[i] is sent to shard i, all in parallel; a shard whose request
  // has no tables and no step is skipped. responses is resized to match.
  absl::Status Lookup(absl::Span<const v1::LookupRequest> requests,
                      std::vector<v1::LookupResponse>* responses);
  // requests[i] is sent to shard i, all in parallel (empty ones too: they
  // advance the worker's clock).
  absl::Status Push(absl::Span<const v1::PushRequest> requests,
                    std::vector<v1::PushResponse>* responses);
  // requests[i] is sent to shard i, all in parallel; a shard whose request
  // has neither a push nor a lookup is skipped. See EmbeddingService.Exchange.
  // `calls`, if given, gets every attempt appended (retries included).
  absl::Status Exchange(absl::Span<const v1::ExchangeRequest> requests,
                        std::vector<v1::ExchangeResponse>* responses,
                        std::vector<ShardCall>* calls = nullptr);
  // The same for requests handed over (none null): on exchange streams their
  // large fields (keys, gradients) are sent from the requests' own memory,
  // not copied into gRPC's buffers; the library keeps each request alive
  // until gRPC is done with it, which may be after this call returns, so
  // they must not change.
  absl::Status Exchange(std::vector<std::shared_ptr<const v1::ExchangeRequest>> requests,
                        std::vector<v1::ExchangeResponse>* responses,
                        std::vector<ShardCall>* calls = nullptr);
  // The same with each shard's answer as an ExchangeAnswer: on exchange
  // streams the lookups' rows stay in gRPC's receive buffers, for a caller
  // that reads each row once (ember/exchange_answer.h); the overloads above
  // copy them into the responses' `rows` fields.
  absl::Status Exchange(std::vector<std::shared_ptr<const v1::ExchangeRequest>> requests,
                        std::vector<ExchangeAnswer>* answers,
                        std::vector<ShardCall>* calls = nullptr);
  // On every shard.
  absl::Status RegisterWorker(uint32_t worker_id, int64_t first_step);
  absl::Status UnregisterWorker(uint32_t worker_id);

  // Takes a checkpoint of every shard at one step, all shards in parallel,
  // all under the same id: together they are one consistent state of the
  // cluster (restore every shard with --restore_from=<dir>/<id>). If a shard
  // fails, the call fails naming it; the shards that succeeded keep their
  // part, which is not a cluster checkpoint on its own.
  absl::StatusOr<ClusterCheckpoint> Checkpoint(const CheckpointOptions& options = {});
  // The step up to which every shard has applied `worker_id`'s pushes (the
  // smallest over the shards; -1 where it is not registered): where a
  // trainer that connected again after a move resumes (first_step = this + 1).
  absl::StatusOr<int64_t> AppliedStep(uint32_t worker_id);
  // Every shard's GetShardInfo, shard i's at i.
  absl::StatusOr<std::vector<v1::GetShardInfoResponse>> ShardInfos();

  // Convenience for tools and tests: rows of `keys` (dim floats each, in key
  // order) of one table, routed to their shards.
  absl::StatusOr<std::vector<float>> LookupRows(const std::string& table,
                                                absl::Span<const uint64_t> keys,
                                                bool read_only = true);

  ClientStats Stats() const;

 private:
  Client(std::unique_ptr<ShardChannel> channel, const ClientOptions& options);
  absl::Status Exchange(const ExchangeCall& call, std::vector<ExchangeAnswer>* answers,
                        std::vector<ShardCall>* calls);
  absl::Status CheckShardCount(absl::string_view method, size_t requests) const;

  const ClientOptions options_;
  const std::unique_ptr<ShardChannel> channel_;
  KeyRouter router_;  // the shards' routing, set by Connect
  uint64_t routing_epoch_ = 0;  // set by Connect
};

}  // namespace ember
