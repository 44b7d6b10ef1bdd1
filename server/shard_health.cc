#include "server/shard_health.h"

#include "absl/strings/str_cat.h"
#include "common/aliased_serialize.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace ember {
namespace {

using google::protobuf::internal::WireFormatLite;

// HealthCheckRequest.service (field 1, a string); false if `bytes` is not a
// HealthCheckRequest.
bool ParseService(const std::string& bytes, std::string* service) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  service->clear();
  while (const uint32_t tag = in.ReadTag()) {
    if (tag == WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) {
      if (!WireFormatLite::ReadString(&in, service)) return false;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return false;
    }
  }
  return in.ConsumedEntireMessage();
}

}  // namespace

ShardHealth::ShardHealth() { serving_[""] = true; }

void ShardHealth::SetServingStatus(const std::string& service_name, bool serving) {
  WriterLock lock(&mu_);
  if (!shut_down_) serving_[service_name] = serving;
}

void ShardHealth::SetServingStatus(bool serving) {
  WriterLock lock(&mu_);
  if (shut_down_) return;
  for (auto& [name, status] : serving_) status = serving;
}

void ShardHealth::Shutdown() {
  WriterLock lock(&mu_);
  for (auto& [name, status] : serving_) status = false;
  shut_down_ = true;
}

grpc::Status ShardHealth::Check(const grpc::ByteBuffer& request,
                                grpc::ByteBuffer* response) const {
  std::string service;
  if (!ParseService(FlattenByteBuffer(request), &service)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "grpc.health.v1.Health/Check: the message is not a HealthCheckRequest");
  }
  bool serving;
  {
    ReaderLock lock(&mu_);
    const auto it = serving_.find(service);
    if (it == serving_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("grpc.health.v1.Health/Check: service '", service,
                                       "' unknown to this shard"));
    }
    serving = it->second;
  }
  // HealthCheckResponse{status}: field 1, varint; SERVING = 1, NOT_SERVING = 2.
  const char encoded[2] = {0x08, static_cast<char>(serving ? 1 : 2)};
  grpc::Slice slice(encoded, sizeof(encoded));
  *response = grpc::ByteBuffer(&slice, 1);
  return grpc::Status::OK;
}

}  // namespace ember
