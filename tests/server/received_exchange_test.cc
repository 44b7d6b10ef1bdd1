// ReceivedExchange: a request read off an exchange stream keeps its push's
// gradients in the receive buffers, and everything else as protobuf parses it.
#include "server/received_exchange.h"

#include <memory>
#include <string>

#include <grpcpp/support/byte_buffer.h>

#include "common/aliased_serialize.h"
#include "gtest/gtest.h"
#include "tests/server/requests.h"

namespace ember::testing {
namespace {

std::string Joined(const std::vector<absl::string_view>* pieces) {
  std::string out;
  if (pieces == nullptr) return out;
  for (absl::string_view p : *pieces) out.append(p.data(), p.size());
  return out;
}

TEST(ReceivedExchangeTest, GradientsStayInPiecesAndTheRestIsTheMessage) {
  auto sent = std::make_shared<v1::ExchangeRequest>();
  sent->mutable_push()->set_worker_id(3);
  sent->mutable_push()->set_step(9);
  // Big enough to be sent as a slice of its own, and a small one copied
  // into a block beside the framing.
  AddGradients(sent->mutable_push(), "big", {1, 2, 3}, std::vector<float>(3 * 1024, 0.5f));
  AddGradients(sent->mutable_push(), "small", {4}, {1.0f, 2.0f});
  AddGradients(sent->mutable_push(), "empty", {}, {});
  AddLookup(sent->mutable_lookup(), "big", {5, 6});
  grpc::ByteBuffer bytes = SerializeAliased(sent);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(bytes.Dump(&slices).ok());
  ASSERT_GT(slices.size(), 1u);  // the test needs a message in several pieces

  ReceivedExchange received;
  ASSERT_TRUE(received.Parse(&bytes));
  EXPECT_EQ(bytes.Length(), 0u);
  EXPECT_EQ(received.wire_bytes(), sent->ByteSizeLong());
  v1::ExchangeRequest expected = *sent;
  for (auto& t : *expected.mutable_push()->mutable_tables()) t.clear_gradients();
  EXPECT_EQ(received.message().DebugString(), expected.DebugString());
  ASSERT_EQ(received.gradient_pieces().size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Joined(received.gradient_pieces()[i]), sent->push().tables(i).gradients())
        << sent->push().tables(i).table();
  }
}

TEST(ReceivedExchangeTest, BytesThatAreNotARequestAreRefusedAndLeaveItEmpty) {
  ReceivedExchange received;
  auto good = std::make_shared<v1::ExchangeRequest>();
  AddGradients(good->mutable_push(), "t", {1}, {1.0f});
  grpc::ByteBuffer bytes = SerializeAliased(good);
  ASSERT_TRUE(received.Parse(&bytes));
  const std::string junk = "\x0a\xff\xff\xff\x0f";  // a length past the end
  grpc::Slice slice(junk.data(), junk.size());
  grpc::ByteBuffer bad(&slice, 1);
  EXPECT_FALSE(received.Parse(&bad));
  EXPECT_EQ(received.message().ByteSizeLong(), 0u);
  EXPECT_TRUE(received.gradient_pieces().empty());
}

}  // namespace
}  // namespace ember::testing
