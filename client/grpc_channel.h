// The gRPC ShardChannel (ember/shard_channel.h): shard servers reached over
// gRPC, one channel per shard; exchanges on long-lived ExchangeStreams
// (client/exchange_stream.h) or unary calls, every call with a deadline and
// UNAVAILABLE retried with backoff within ClientOptions' budget.
//
// Internal to the client library (Client::Connect builds it).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "ember/client_options.h"
#include "ember/shard_channel.h"

namespace ember {

// Channels to options.shards ("host:port" each); connects lazily (the
// first call, or Client::Connect's GetShardInfo, waits for the shards).
absl::StatusOr<std::unique_ptr<ShardChannel>> NewGrpcChannel(const ClientOptions& options);

}  // namespace ember
