#include "server/health_check.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/aliased_serialize.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace ember {
namespace {

// HealthCheckResponse.status values (grpc/health/v1/health.proto).
const char* ServingStatusName(int v) {
  switch (v) {
    case 0: return "UNKNOWN";
    case 1: return "SERVING";
    case 2: return "NOT_SERVING";
    case 3: return "SERVICE_UNKNOWN";
    default: return "an unknown status";
  }
}

}  // namespace

absl::Status CheckHealth(const std::string& address, absl::Duration timeout,
                         const std::string& service, const ClientTlsOptions& tls) {
  const std::string what =
      absl::StrCat(address, " health check", service.empty() ? "" : " of ", service);
  if (service.size() > 127) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a service name of at most 127 bytes, received ",
                     service.size()));
  }
  grpc::ChannelArguments args;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(tls, &args);
  if (!credentials.ok()) return credentials.status();
  auto channel = grpc::CreateCustomChannel(address, *credentials, args);
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::CompletionQueue cq;
  // HealthCheckRequest{service}: field 1, length-delimited (0x0a, one-byte
  // length, the name); the empty name encodes to no bytes.
  const std::string encoded =
      service.empty() ? "" : std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  grpc::Slice slice(encoded);
  grpc::ByteBuffer request(&slice, 1), response;
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, nullptr);
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat(what, ": ", status.error_message()));
  }
  const std::string bytes = FlattenByteBuffer(response);
  // Field 1 (status), varint: 0x08 then the value; absent means UNKNOWN (0).
  int value = 0;
  if (bytes.size() == 2 && bytes[0] == 0x08) {
    value = static_cast<unsigned char>(bytes[1]);
  } else if (!bytes.empty()) {
    return absl::UnavailableError(absl::StrCat(what, ": expected a HealthCheckResponse, received ",
                                               bytes.size(), " bytes that are not one"));
  }
  if (value != 1) {
    return absl::UnavailableError(
        absl::StrCat(what, ": expected SERVING, received ", ServingStatusName(value)));
  }
  return absl::OkStatus();
}

}  // namespace ember
