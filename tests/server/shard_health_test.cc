// ShardHealth: the health statuses an async-API shard answers Check from.
#include "server/shard_health.h"

#include <string>

#include "common/aliased_serialize.h"
#include "gtest/gtest.h"

namespace ember {
namespace {

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// HealthCheckRequest{service}: field 1, length-delimited.
std::string Request(const std::string& service) {
  if (service.empty()) return "";
  return std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
}

const std::string kServing("\x08\x01", 2);
const std::string kNotServing("\x08\x02", 2);

TEST(ShardHealthTest, TheServerIsServingFromTheStartAndNamedServicesOnceSet) {
  ShardHealth health;
  grpc::ByteBuffer response;
  ASSERT_TRUE(health.Check(Buffer(Request("")), &response).ok());
  EXPECT_EQ(FlattenByteBuffer(response), kServing);
  const grpc::Status unknown = health.Check(Buffer(Request("ember.v1.AdminService")), &response);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(unknown.error_message().find("'ember.v1.AdminService'"), std::string::npos);
  health.SetServingStatus("ember.v1.AdminService", true);
  ASSERT_TRUE(health.Check(Buffer(Request("ember.v1.AdminService")), &response).ok());
  EXPECT_EQ(FlattenByteBuffer(response), kServing);
}

TEST(ShardHealthTest, SettingAllChangesEveryNameAndShutdownFreezesNotServing) {
  ShardHealth health;
  health.SetServingStatus("a", true);
  health.SetServingStatus(false);
  grpc::ByteBuffer response;
  for (const char* name : {"", "a"}) {
    ASSERT_TRUE(health.Check(Buffer(Request(name)), &response).ok());
    EXPECT_EQ(FlattenByteBuffer(response), kNotServing) << name;
  }
  health.SetServingStatus(true);
  health.Shutdown();
  health.SetServingStatus(true);
  health.SetServingStatus("a", true);
  for (const char* name : {"", "a"}) {
    ASSERT_TRUE(health.Check(Buffer(Request(name)), &response).ok());
    EXPECT_EQ(FlattenByteBuffer(response), kNotServing) << name;
  }
}

TEST(ShardHealthTest, BytesThatAreNotARequestAreInvalidArgumentAndUnknownFieldsAreSkipped) {
  ShardHealth health;
  grpc::ByteBuffer response;
  // Field 1 claims 5 bytes and carries 1.
  const grpc::Status truncated = health.Check(Buffer(std::string("\x0a\x05x", 3)), &response);
  EXPECT_EQ(truncated.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(truncated.error_message().find("not a HealthCheckRequest"), std::string::npos);
  // An unknown varint field 2 before an empty service name.
  ASSERT_TRUE(health.Check(Buffer(std::string("\x10\x07", 2)), &response).ok());
  EXPECT_EQ(FlattenByteBuffer(response), kServing);
}

}  // namespace
}  // namespace ember
