// ReceivedExchange: one ExchangeRequest as a shard reads it off an exchange
// stream, with the push's gradients left where they arrived.
//
// Protobuf's parser would copy each table's gradients (MBs per step at dim
// 128) into a string, which the store then reads once. Here they stay in
// gRPC's receive buffers and the store reads them there (Shard::Push with
// GradientPieces): the server's counterpart of the client's ExchangeAnswer.
//
// Thread safety: none (one owner). Reused from step to step.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "common/aliased_serialize.h"
#include "ember/v1/embedding_service.pb.h"
#include "shard/shard.h"

namespace grpc {
class ByteBuffer;
}  // namespace grpc

namespace ember {

class ReceivedExchange {
 public:
  // Reads a serialised ExchangeRequest and empties `bytes`, whose buffers
  // the request keeps until the next Parse; false if it is not one (the
  // request is then empty).
  bool Parse(grpc::ByteBuffer* bytes);

  // Every field, except that the push's gradients are empty: pass
  // gradient_pieces() with it.
  const v1::ExchangeRequest& message() const { return message_; }
  // Valid until the next Parse.
  GradientPieces gradient_pieces() const { return pieces_; }
  // The request's size on the wire.
  size_t wire_bytes() const { return wire_bytes_; }

 private:
  v1::ExchangeRequest message_;
  InPlaceFields fields_;
  std::vector<const std::vector<absl::string_view>*> pieces_;  // per push table, into fields_
  std::shared_ptr<const void> slices_;  // the receive buffers the pieces point into
  size_t wire_bytes_ = 0;
};

}  // namespace ember
