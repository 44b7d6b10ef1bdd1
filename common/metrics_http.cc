#include "common/metrics_http.h"

#include <CivetServer.h>

#include "absl/strings/str_cat.h"

namespace ember {

class MetricsHttpServer::Handler : public CivetHandler {
 public:
  explicit Handler(metrics::Registry* registry) : registry_(registry) {}
  bool handleGet(CivetServer*, mg_connection* conn) override {
    const std::string body = registry_->Expose();
    mg_printf(conn,
              "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
              "Content-Length: %zu\r\nConnection: close\r\n\r\n",
              body.size());
    mg_write(conn, body.data(), body.size());
    return true;
  }

 private:
  metrics::Registry* registry_;
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, int port, metrics::Registry* registry) {
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  const std::vector<std::string> options = {
      "listening_ports", absl::StrCat(address, ":", port), "num_threads", "2",
      "request_timeout_ms", "10000"};
  try {
    s->server_ = std::make_unique<CivetServer>(options);
  } catch (const CivetException& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics_port: cannot listen on ", address, ":", port, ": ", e.what()));
  }
  s->handler_ = std::make_unique<Handler>(registry);
  s->server_->addHandler("/metrics", s->handler_.get());
  const std::vector<int> ports = s->server_->getListeningPorts();
  s->port_ = ports.empty() ? port : ports[0];
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (server_) server_->close();
}

}  // namespace ember
