// The standard gRPC health check (grpc.health.v1.Health/Check) of one shard,
// as a client: for container health checks, exec probes and tests. No
// health stub is generated here (Debian ships none); the request and
// response are three bytes of protobuf, encoded by hand.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/tls.h"

namespace ember {

// OK when the server at `address` ("host:port") answers SERVING for
// `service`: "" for the whole server, or a service's full name
// ("ember.v1.EmbeddingService", "ember.v1.AdminService"). Otherwise
// UNAVAILABLE (or the call's own code: NOT_FOUND for a service the server
// does not know, DEADLINE_EXCEEDED) with a message naming the address, the
// service and what was received.
// `tls`: how to reach a shard that serves TLS (plaintext by default).
absl::Status CheckHealth(const std::string& address, absl::Duration timeout,
                         const std::string& service = "", const ClientTlsOptions& tls = {});

}  // namespace ember
