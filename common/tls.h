// TLS for Ember's gRPC connections: the files an operator names and the
// gRPC credentials built from them, for shards, trainers and tools alike.
//
// Files are PEM. Errors name the option and the path (INVALID_ARGUMENT for
// an incomplete set, NOT_FOUND / PERMISSION_DENIED for a file that cannot be
// read); nothing is ever logged of a key's contents.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

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

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& tls);
// Also sets the target-name override in `args` when server_name is given.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsOptions& tls, grpc::ChannelArguments* args);

}  // namespace ember
