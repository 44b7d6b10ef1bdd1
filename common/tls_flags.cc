#include "common/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(bool, tls, false, "Reach the shards over TLS.");
ABSL_FLAG(std::string, tls_ca, "",
          "With --tls: PEM CA of the shards' certificates (default: the system's roots).");
ABSL_FLAG(std::string, tls_cert, "", "With --tls: PEM client certificate, for mutual TLS.");
ABSL_FLAG(std::string, tls_key, "", "With --tls: PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_server_name, "",
          "With --tls: the name the shards' certificates carry, if not the addresses' host.");

namespace ember {

ClientTlsOptions ClientTlsFromFlags() {
  ClientTlsOptions tls;
  tls.enabled = absl::GetFlag(FLAGS_tls);
  tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  return tls;
}

}  // namespace ember
