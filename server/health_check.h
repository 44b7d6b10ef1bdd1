// The standard gRPC health check (grpc.health.v1.Health/Check) of one shard,
// as a client: for container health checks, exec probes and tests. No
// health stub is generated here (Debian ships none); the request and
// response are three bytes of protobuf, encoded by hand.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ember {

// OK when the server at `address` ("host:port") answers SERVING for the
// whole server (service ""). Otherwise UNAVAILABLE (or the call's own code,
// e.g. DEADLINE_EXCEEDED) with a message naming the address and what was
// received.
absl::Status CheckHealth(const std::string& address, absl::Duration timeout);

}  // namespace ember
