// The in-process ShardChannel (ember/shard_channel.h): N shards in the
// trainer's own process, each the same Shard (shard/shard.h) an
// ember-server runs, with its checkpointer and TTL clock
// (shard/shard_host.h), called directly: no serialisation, no gRPC, no
// socket. Statuses and their messages are the shards' own, prefixed with
// "shard i (in-process) <method>: " as the gRPC channel prefixes them with
// the shard's address.
//
// A call runs on the calling thread, shard after shard: an exchange applies
// its push on every shard first, then runs the lookups (which may wait for
// other workers' pushes, made on their own threads). With
// InProcessOptions::threads, an exchange's shards run at once instead, all
// but one on a pool (shard/work_pool.h), each its push then its lookup, as
// shard servers run them. A checkpoint runs on every shard at once (each
// waits for its cut). Nothing is retried: an in-process shard is never
// UNAVAILABLE.
//
// Internal to the client library (Client::Connect builds it for
// ClientOptions::in_process).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "ember/client_options.h"
#include "ember/shard_channel.h"

namespace ember {

// OK if `device` names places for in-process shards' tables ("cpu",
// "cuda:N", or a comma-separated list of them); INVALID_ARGUMENT naming
// in_process.device otherwise.
absl::Status CheckInProcessDevice(const std::string& device);

// Starts options.in_process.shards shards (restoring them first when asked).
absl::StatusOr<std::unique_ptr<ShardChannel>> NewInProcessChannel(const ClientOptions& options);

}  // namespace ember
