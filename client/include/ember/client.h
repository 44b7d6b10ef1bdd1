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
#include "common/tls.h"
#include "ember/exchange_answer.h"
#include "ember/shard_channel.h"
#include "ember/v1/admin_service.pb.h"
#include "ember/v1/embedding_service.pb.h"

namespace ember {

class TrainerMetrics;

// Shards in the trainer's own process (client/in_process_channel.h): the
// same shard code as ember-server's, called without a network. For a job
// on one machine with one trainer process; several trainer processes
// (one per GPU, as PyTorch DDP runs) cannot share them and use shard
// servers (docs/client.md, "Shards in the trainer's process").
struct InProcessOptions {
  // Shards to start; 0: none (the shards are ClientOptions::shards' servers).
  uint32_t shards = 0;
  // Where their tables live: "cpu" or "cuda:N" for every shard, or a
  // comma-separated list, shard i on entry i % its length ("cuda:0,cuda:1,
  // cuda:2,cuda:3": one shard per GPU, the model-parallel layout of one node).
  // A device that is not there fails Connect with FAILED_PRECONDITION.
  std::string device = "cpu";
  // N > 0: an exchange's shards run at once, all but one on a pool that
  // keeps N threads (and adds more while all are busy), as shard servers
  // would run them; 0: every call on the calling thread, shard after shard.
  // The pool gave 0.90 against 0.73 of efficiency at 1 ms of compute, 4
  // merged pipelines, 2 cores, at about the same CPU per step
  // (docs/measurements/2026-12-06-in-process-shards.md).
  uint32_t threads = 1;
  // Most rows per shard over all its tables (ShardOptions::max_rows); 0: no limit.
  uint64_t max_rows = 0;
  // Shard i checkpoints into InProcessCheckpointDir(checkpoint_dir, i), the
  // format of ember-server's --checkpoint_dir; empty: no checkpoints.
  std::string checkpoint_dir;
  // Time between periodic checkpoints; zero: only Client::Checkpoint.
  absl::Duration checkpoint_interval = absl::ZeroDuration();
  // "latest" (each shard's newest checkpoint that verifies; none is fine)
  // or a cluster checkpoint's id under checkpoint_dir; empty: start empty.
  std::string restore_from;
};

// Shard `shard`'s checkpoint directory under an in-process job's
// `checkpoint_dir`: "<checkpoint_dir>/shard-<shard>". A shard server given
// it as --checkpoint_dir restores the in-process shard's checkpoints, and
// the other way round.
std::string InProcessCheckpointDir(const std::string& checkpoint_dir, uint32_t shard);

// ClientOptions::shards = {"inproc:N"}: N shards in this process.
inline constexpr char kInProcessPrefix[] = "inproc:";

struct ClientOptions {
  // "host:port" of every shard, in shard-index order. The one entry
  // "inproc:N" stands for in_process.shards = N (the spelling the tools'
  // --shards flags take).
  std::vector<std::string> shards;
  // Shards in this process instead of servers (in_process.shards > 0:
  // `shards` must then be empty or "inproc:N" with the same N). TLS, tokens
  // and exchange_streams do not apply to them.
  InProcessOptions in_process;
  // Deadline of each RPC attempt (a lookup's wait for slower workers counts).
  absl::Duration rpc_timeout = absl::Seconds(10);
  // How long Connect waits for every shard to answer GetShardInfo.
  absl::Duration connect_timeout = absl::Seconds(10);
  // UNAVAILABLE calls are retried while less than this has passed since the
  // first attempt, waiting initial_backoff, doubling up to max_backoff.
  absl::Duration retry_budget = absl::Seconds(30);
  absl::Duration initial_backoff = absl::Milliseconds(10);
  absl::Duration max_backoff = absl::Seconds(1);
  // Exchange over one long-lived ExchangeStream per shard and concurrent
  // caller (no per-call setup per step); false: one unary Exchange per call.
  // A shard without ExchangeStream (older servers) gets unary calls either way.
  bool exchange_streams = true;
  // TLS or mutual TLS to the shards (common/tls.h); plaintext by default.
  ClientTlsOptions tls;
  // Sent as "authorization: Bearer <auth_token>" on every call, for shards
  // started with --auth_tokens_file; empty: none. Use it over TLS: the
  // token is otherwise readable on the network.
  std::string auth_token;
  // Not owned; outlives the Client. Every RPC attempt is recorded there
  // (ember_trainer_rpc_duration_seconds and _attempts_total per shard).
  TrainerMetrics* metrics = nullptr;

  absl::Status Validate() const;
};

// A cluster-wide checkpoint (Client::Checkpoint).
struct CheckpointOptions {
  // The checkpoint's name on every shard (see CheckpointRequest.id); empty:
  // "cluster-<step>-<unix milliseconds>".
  std::string id;
  // The cut on every shard. Unset: the latest step any worker has applied
  // on any shard; if a worker gets past it before every shard has cut, the
  // cut moves two steps further (up to 3 tries). With no registered worker
  // on any shard, each shard cuts at what it has applied (step -1).
  std::optional<int64_t> step;
  // Deltas on each shard's previous checkpoint (CheckpointRequest.incremental).
  bool incremental = false;
  // Deadline of each shard's call: the wait for the cut plus the write.
  absl::Duration timeout = absl::Minutes(5);
};

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
