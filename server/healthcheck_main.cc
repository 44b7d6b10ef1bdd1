// ember-healthcheck: exits 0 when a shard answers the gRPC health check with
// SERVING, 1 otherwise (the reason on stderr). For Docker HEALTHCHECK,
// compose and Kubernetes exec probes on clusters without gRPC probes.
//   ember-healthcheck --address=127.0.0.1:50051 --timeout=2s [--service=ember.v1.EmbeddingService]
//     [--tls [--tls_ca=ca.pem] [--tls_cert=client.pem --tls_key=client.key]]
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/time.h"
#include "server/health_check.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "The shard's gRPC host:port.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(2), "Deadline of the check.");
ABSL_FLAG(std::string, service, "",
          "The service to check (e.g. ember.v1.EmbeddingService); empty: the whole server.");

ABSL_FLAG(bool, tls, false, "Reach the shard over TLS.");
ABSL_FLAG(std::string, tls_ca, "", "With --tls: PEM CA of the shard's certificate (default: system roots).");
ABSL_FLAG(std::string, tls_cert, "", "With --tls: PEM client certificate, for shards that require one.");
ABSL_FLAG(std::string, tls_key, "", "With --tls: PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_server_name, "",
          "With --tls: the name the shard's certificate must carry, if not the address's host.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ember::ClientTlsOptions tls;
  tls.enabled = absl::GetFlag(FLAGS_tls);
  tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  const absl::Status s =
      ember::CheckHealth(absl::GetFlag(FLAGS_address), absl::GetFlag(FLAGS_timeout),
                         absl::GetFlag(FLAGS_service), tls);
  if (!s.ok()) {
    std::fprintf(stderr, "ember-healthcheck: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s: SERVING\n", absl::GetFlag(FLAGS_address).c_str());
  return 0;
}
