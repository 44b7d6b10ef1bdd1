// Serves a metrics::Registry as Prometheus text on GET /metrics (civetweb),
// on its own port beside the gRPC one.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"

class CivetServer;

namespace ember {

class MetricsHttpServer {
 public:
  // Listens on address:port (port 0: a free one). `registry` must outlive
  // the server. UNAVAILABLE when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& address,
                                                                   int port,
                                                                   metrics::Registry* registry);
  // Stops serving; takes up to 2 s (civetweb's accept loop polls that long).
  ~MetricsHttpServer();

  int port() const { return port_; }

 private:
  class Handler;
  MetricsHttpServer() = default;
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<CivetServer> server_;
  int port_ = 0;
};

}  // namespace ember
