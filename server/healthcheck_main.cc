// ember-healthcheck: exits 0 when a shard answers the gRPC health check with
// SERVING, 1 otherwise (the reason on stderr). For Docker HEALTHCHECK,
// compose and Kubernetes exec probes on clusters without gRPC probes.
//   ember-healthcheck [--address=127.0.0.1:50051] --timeout=2s
//   [--service=ember.v1.EmbeddingService]
// Without --address: 127.0.0.1 on $EMBER_PORT (default 50051), the port the
// images' entrypoint (deploy/docker/ember-shard) serves on, so that an
// image's HEALTHCHECK follows the shard to whatever port it is given.
//     [--tls [--tls_ca=ca.pem] [--tls_cert=client.pem --tls_key=client.key]]
// (the TLS flags: common/tls_flags.h)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/time.h"
#include "common/tls_flags.h"
#include "server/health_check.h"

ABSL_FLAG(std::string, address, "",
          "The shard's gRPC host:port; empty: 127.0.0.1 on $EMBER_PORT (default 50051).");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(2), "Deadline of the check.");
ABSL_FLAG(std::string, service, "",
          "The service to check (e.g. ember.v1.EmbeddingService); empty: the whole server.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string address = absl::GetFlag(FLAGS_address);
  if (address.empty()) {
    const char* port = std::getenv("EMBER_PORT");
    address = std::string("127.0.0.1:") + (port != nullptr && *port != '\0' ? port : "50051");
  }
  const absl::Status s =
      ember::CheckHealth(address, absl::GetFlag(FLAGS_timeout), absl::GetFlag(FLAGS_service),
                         ember::ClientTlsFromFlags());
  if (!s.ok()) {
    std::fprintf(stderr, "ember-healthcheck: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s: SERVING\n", address.c_str());
  return 0;
}
