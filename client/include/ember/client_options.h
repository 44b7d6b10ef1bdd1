// The options of ember::Client (ember/client.h) and of its cluster
// checkpoints: how a trainer reaches its shards (servers, TLS, tokens,
// deadlines and retries) or runs them in its own process. Plain values,
// copied by the Client at Connect; the channels (client/grpc_channel.h,
// client/in_process_channel.h) read them without the Client itself.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/tls_options.h"

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

}  // namespace ember
