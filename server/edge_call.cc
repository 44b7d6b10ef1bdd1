#include "server/edge_call.h"

#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/wire.h"

namespace ember {
namespace {

// The call's routing epoch (ember-routing-epoch): 0 when it sends none,
// which the shard does not check.
absl::StatusOr<uint64_t> CallRoutingEpoch(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find(kRoutingEpochMetadata);
  if (it == metadata.end()) return 0;
  const absl::string_view value(it->second.data(), it->second.size());
  uint64_t epoch = 0;
  if (!absl::SimpleAtoi(value, &epoch)) {
    return absl::InvalidArgumentError(absl::StrCat("metadata '", kRoutingEpochMetadata,
                                                   "': expected a decimal number, received '",
                                                   value, "'"));
  }
  return epoch;
}

}  // namespace

EdgeCall ReadEdgeCall(const grpc::ServerContextBase& context, absl::string_view rpc) {
  EdgeCall call;
  call.rpc = rpc;
  const auto& metadata = context.client_metadata();
  if (const auto it = metadata.find("authorization"); it != metadata.end()) {
    call.authorization.emplace(it->second.data(), it->second.size());
  }
  call.peer = context.peer();
  call.routing_epoch = CallRoutingEpoch(context);
  if (context.deadline() != std::chrono::system_clock::time_point::max()) {
    call.deadline = absl::FromChrono(context.deadline());
  }
  return call;
}

}  // namespace ember
