// ember-healthcheck: exits 0 when a shard answers the gRPC health check with
// SERVING, 1 otherwise (the reason on stderr). For Docker HEALTHCHECK,
// compose and Kubernetes exec probes on clusters without gRPC probes.
//   ember-healthcheck --address=127.0.0.1:50051 --timeout=2s [--service=ember.v1.EmbeddingService]
//     [--tls [--tls_ca=ca.pem] [--tls_cert=client.pem --tls_key=client.key]]
// (the TLS flags: common/tls_flags.h)
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/time.h"
#include "common/tls_flags.h"
#include "server/health_check.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "The shard's gRPC host:port.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(2), "Deadline of the check.");
ABSL_FLAG(std::string, service, "",
          "The service to check (e.g. ember.v1.EmbeddingService); empty: the whole server.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status s =
      ember::CheckHealth(absl::GetFlag(FLAGS_address), absl::GetFlag(FLAGS_timeout),
                         absl::GetFlag(FLAGS_service), ember::ClientTlsFromFlags());
  if (!s.ok()) {
    std::fprintf(stderr, "ember-healthcheck: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s: SERVING\n", absl::GetFlag(FLAGS_address).c_str());
  return 0;
}
