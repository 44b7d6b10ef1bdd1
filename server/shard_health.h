// ShardHealth: the grpc.health.v1 serving statuses of a shard on gRPC's
// async API (--rpc_mode=async), which answers Health/Check from them itself.
//
// gRPC's default health service runs on the callback API, whose threads
// would then take turns polling with the completion threads (see
// server/async_service.h). The statuses behave as the default service's:
// "" (the server) starts SERVING, names are added by SetServingStatus, the
// no-name SetServingStatus sets every one, and after Shutdown all are
// NOT_SERVING for good. Watch is not served (UNIMPLEMENTED, which gRPC's
// client-side health checking takes as "no health checking").
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "common/rw_mutex.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"

namespace ember {

class ShardHealth final : public grpc::HealthCheckServiceInterface {
 public:
  static constexpr char kCheckMethod[] = "/grpc.health.v1.Health/Check";

  ShardHealth();

  void SetServingStatus(const std::string& service_name, bool serving) override;
  void SetServingStatus(bool serving) override;
  void Shutdown() override;

  // Answers one serialised HealthCheckRequest with a serialised
  // HealthCheckResponse; NOT_FOUND for a service never named here,
  // INVALID_ARGUMENT for bytes that are not a request.
  grpc::Status Check(const grpc::ByteBuffer& request, grpc::ByteBuffer* response) const;

 private:
  mutable RwMutex mu_;
  absl::flat_hash_map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ember
