// TLS for Ember's gRPC connections: the gRPC credentials built from the
// files an operator names (common/tls_options.h), for shards, trainers and
// tools alike.
//
// Files are PEM. Errors name the option and the path (INVALID_ARGUMENT for
// an incomplete set, NOT_FOUND / PERMISSION_DENIED for a file that cannot be
// read); nothing is ever logged of a key's contents.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tls_options.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace ember {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& tls);
// Also sets the target-name override in `args` when server_name is given.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsOptions& tls, grpc::ChannelArguments* args);

}  // namespace ember
