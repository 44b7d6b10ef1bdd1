// The TLS files an operator names, for shards, trainers and tools alike;
// no gRPC here (common/tls.h builds the credentials from them), so the
// trainer's public headers can hold them.
//
// Files are PEM. Validate's errors name the option and the path
// (INVALID_ARGUMENT for an incomplete set, NOT_FOUND / PERMISSION_DENIED
// for a file that cannot be read); nothing is ever logged of a key's
// contents.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace ember {

// A shard's side. No cert_file: plaintext. With cert_file and key_file: TLS.
// With client_ca_file too: mutual TLS, every client must present a
// certificate signed by that CA (others are refused in the handshake).
struct ServerTlsOptions {
  std::string cert_file;       // --tls_cert: the shard's certificate chain
  std::string key_file;        // --tls_key: its private key
  std::string client_ca_file;  // --tls_client_ca: CA of the clients (mTLS)

  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !client_ca_file.empty(); }
  absl::Status Validate() const;
};

// A client's side (trainers, tools). enabled false: plaintext.
struct ClientTlsOptions {
  bool enabled = false;
  // CA that signed the shards' certificates; empty: the system's roots.
  std::string ca_file;
  // The client's certificate chain and key, for shards that require them.
  std::string cert_file;
  std::string key_file;
  // Name to check the shards' certificates against instead of the host in
  // their addresses (e.g. a certificate for "ember-shard" reached by IP).
  std::string server_name;

  absl::Status Validate() const;
};

}  // namespace ember
