// Serves a metrics::Registry as Prometheus text on GET /metrics (civetweb),
// on its own port beside the gRPC one.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"

class CivetServer;

namespace ember {

// Who may scrape: with a bearer token, every scrape must send it
// (Prometheus' scrape config: `authorization: {credentials_file: ...}`).
// The endpoint speaks plain HTTP (see docs/operations.md: Debian's civetweb
// does not serve TLS with the system's OpenSSL 3).
struct MetricsHttpOptions {
  // A file whose first line is the token every scrape must send as
  // "Authorization: Bearer <token>" (else 401); at least 16 characters.
  // Empty: no token asked.
  std::string bearer_token_file;
};

class MetricsHttpServer {
 public:
  // Listens on address:port (port 0: a free one). `registry` must outlive
  // the server. UNAVAILABLE when the port cannot be bound; INVALID_ARGUMENT
  // (naming the flag and the file) for an unreadable or short token file.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, int port, metrics::Registry* registry,
      const MetricsHttpOptions& options = {});
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
