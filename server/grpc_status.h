// The one conversion from absl::Status to grpc::Status, used at the RPC edge.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace ember {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace ember
