// The EdgeCall (shard/shard_edge.h) of a gRPC call: what the shard edge
// needs of it, read from its context once.
#pragma once

#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"
#include "shard/shard_edge.h"

namespace ember {

// Its "authorization" metadata, peer, ember-routing-epoch metadata (an
// unreadable one refuses the call with INVALID_ARGUMENT naming it) and
// deadline. `rpc` must outlive the result.
EdgeCall ReadEdgeCall(const grpc::ServerContextBase& context, absl::string_view rpc);

}  // namespace ember
