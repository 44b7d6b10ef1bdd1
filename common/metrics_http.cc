#include "common/metrics_http.h"

#include <CivetServer.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/secret_compare.h"
#include "common/status_macros.h"

namespace ember {

namespace {

absl::StatusOr<std::string> ReadText(const std::string& path, absl::string_view flag) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, " '", path, "': cannot read"));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

class MetricsHttpServer::Handler : public CivetHandler {
 public:
  Handler(metrics::Registry* registry, std::string token)
      : registry_(registry), token_(std::move(token)) {}
  bool handleGet(CivetServer*, mg_connection* conn) override {
    if (!token_.empty()) {
      const char* header = mg_get_header(conn, "Authorization");
      const absl::string_view presented = header == nullptr ? "" : header;
      if (!absl::StartsWith(presented, "Bearer ") || !SameSecret(token_, presented.substr(7))) {
        static constexpr char kDenied[] = "expected 'Authorization: Bearer <token>'\n";
        mg_printf(conn,
                  "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\n"
                  "Content-Type: text/plain\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                  sizeof(kDenied) - 1, kDenied);
        return true;
      }
    }
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
  const std::string token_;  // empty: none asked
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, int port, metrics::Registry* registry,
    const MetricsHttpOptions& http) {
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  std::string token;
  if (!http.bearer_token_file.empty()) {
    EMBER_ASSIGN_OR_RETURN(std::string text,
                           ReadText(http.bearer_token_file, "metrics_bearer_token_file"));
    token = std::string(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
    if (token.size() < 16) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics_bearer_token_file '", http.bearer_token_file,
                       "': expected a token of at least 16 characters on its first line, received ",
                       token.size()));
    }
  }
  const std::vector<std::string> options = {
      "listening_ports", absl::StrCat(address, ":", port), "num_threads", "2",
      "request_timeout_ms", "10000"};
  try {
    s->server_ = std::make_unique<CivetServer>(options);
  } catch (const CivetException& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics_port: cannot listen on ", address, ":", port, ": ", e.what()));
  }
  s->handler_ = std::make_unique<Handler>(registry, std::move(token));
  s->server_->addHandler("/metrics", s->handler_.get());
  const std::vector<int> ports = s->server_->getListeningPorts();
  s->port_ = ports.empty() ? port : ports[0];
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (server_) server_->close();
}

}  // namespace ember
