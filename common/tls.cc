#include "common/tls.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ember {
namespace {

absl::StatusOr<std::string> ReadPem(const char* option, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return absl::Status(err == EACCES ? absl::StatusCode::kPermissionDenied
                                      : absl::StatusCode::kNotFound,
                        absl::StrCat(option, " '", path, "': cannot read (", strerror(err), ")"));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(option, " '", path, "': expected a PEM file, received none"));
  }
  return text.str();
}

}  // namespace

absl::Status ServerTlsOptions::Validate() const {
  if (!enabled()) return absl::OkStatus();
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls: expected --tls_cert and --tls_key together (and --tls_client_ca only with them), "
        "received --tls_cert='", cert_file, "' --tls_key='", key_file, "'"));
  }
  return absl::OkStatus();
}

absl::Status ClientTlsOptions::Validate() const {
  if (!enabled) {
    if (!ca_file.empty() || !cert_file.empty() || !key_file.empty() || !server_name.empty()) {
      return absl::InvalidArgumentError(
          "tls: files or a server name given while TLS is off; expected tls.enabled");
    }
    return absl::OkStatus();
  }
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls: expected a client certificate and key together, received cert '", cert_file,
        "' and key '", key_file, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& tls) {
  EMBER_RETURN_IF_ERROR(tls.Validate());
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  EMBER_ASSIGN_OR_RETURN(std::string cert, ReadPem("--tls_cert", tls.cert_file));
  EMBER_ASSIGN_OR_RETURN(std::string key, ReadPem("--tls_key", tls.key_file));
  grpc::SslServerCredentialsOptions options(
      tls.client_ca_file.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                 : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!tls.client_ca_file.empty()) {
    EMBER_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem("--tls_client_ca", tls.client_ca_file));
  }
  options.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsOptions& tls, grpc::ChannelArguments* args) {
  EMBER_RETURN_IF_ERROR(tls.Validate());
  if (!tls.enabled) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  if (!tls.ca_file.empty()) {
    EMBER_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem("tls.ca_file", tls.ca_file));
  }
  if (!tls.cert_file.empty()) {
    EMBER_ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPem("tls.cert_file", tls.cert_file));
    EMBER_ASSIGN_OR_RETURN(options.pem_private_key, ReadPem("tls.key_file", tls.key_file));
  }
  if (!tls.server_name.empty()) args->SetSslTargetNameOverride(tls.server_name);
  return grpc::SslCredentials(options);
}

}  // namespace ember
