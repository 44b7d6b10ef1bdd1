#include "client/admin_stubs.h"

#include "common/status_macros.h"

namespace ember {

absl::Status AdminStubs::Open(const std::string& address) {
  if (stubs_.contains(address)) return absl::OkStatus();
  grpc::ChannelArguments args;
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                         MakeChannelCredentials(tls_, &args));
  stubs_[address] =
      v1::AdminService::NewStub(grpc::CreateCustomChannel(address, credentials, args));
  return absl::OkStatus();
}

}  // namespace ember
