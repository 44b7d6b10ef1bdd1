// AdminStubs: AdminService stubs by address, outside a Client: for what
// talks to shards that are not (or not yet) one cluster, a move's driver
// (ember/cluster_move.h) and Client::ConnectToCluster.
//
// Thread-safe once every address is opened (Open is not).
#pragma once

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/call_metadata.h"
#include "common/tls.h"
#include "ember/v1/admin_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace ember {

class AdminStubs {
 public:
  // Every call carries `auth_token` (if any) and a deadline `timeout` away.
  AdminStubs(ClientTlsOptions tls, std::string auth_token, absl::Duration timeout)
      : tls_(std::move(tls)), metadata_(std::move(auth_token)), timeout_(timeout) {}

  absl::Status Open(const std::string& address);

  // Calls `fn` on the stub of `address` (opened); an error names `what` and
  // the address.
  template <typename Request, typename Response>
  absl::Status Call(const std::string& address,
                    grpc::Status (v1::AdminService::Stub::*fn)(grpc::ClientContext*, const Request&,
                                                               Response*),
                    const Request& request, Response* response, absl::string_view what) const {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    metadata_.AddTo(&context);
    const grpc::Status s = (stubs_.at(address).get()->*fn)(&context, request, response);
    if (s.ok()) return absl::OkStatus();
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat(what, " on ", address, ": ", s.error_message()));
  }

  absl::Status ShardInfo(const std::string& address, v1::GetShardInfoResponse* info) const {
    return Call(address, &v1::AdminService::Stub::GetShardInfo, v1::GetShardInfoRequest(), info,
                "GetShardInfo");
  }

 private:
  const ClientTlsOptions tls_;
  const CallMetadata metadata_;
  const absl::Duration timeout_;
  absl::flat_hash_map<std::string, std::unique_ptr<v1::AdminService::Stub>> stubs_;
};

}  // namespace ember
