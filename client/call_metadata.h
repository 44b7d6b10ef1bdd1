// CallMetadata: what a gRPC channel adds to every call it makes to a shard:
// the bearer token (if any) and the routing epoch the client routes by.
//
// The epoch is learnt after the channel exists (Client::Connect reads it
// from the shards), so it is set once then and read by every call after;
// 0 sends none, and the shard checks nothing.
//
// Thread-safe: AddTo may run on any thread, concurrently with
// set_routing_epoch.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "common/wire.h"
#include "grpcpp/client_context.h"

namespace ember {

class CallMetadata {
 public:
  explicit CallMetadata(std::string auth_token) : auth_token_(std::move(auth_token)) {}

  void set_routing_epoch(uint64_t epoch) { routing_epoch_.store(epoch, std::memory_order_relaxed); }

  void AddTo(grpc::ClientContext* context) const {
    if (!auth_token_.empty()) context->AddMetadata("authorization", "Bearer " + auth_token_);
    const uint64_t epoch = routing_epoch_.load(std::memory_order_relaxed);
    if (epoch != 0) context->AddMetadata(kRoutingEpochMetadata, std::to_string(epoch));
  }

 private:
  const std::string auth_token_;
  std::atomic<uint64_t> routing_epoch_{0};
};

}  // namespace ember
