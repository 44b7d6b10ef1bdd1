// Serialises a protobuf message into a gRPC ByteBuffer without copying its
// large `bytes` fields.
//
// A lookup's rows and a push's gradients are the bulk of every message (tens
// of KB at dim 8, MBs at dim 128). gRPC's generated code has protobuf copy
// them into one contiguous buffer before sending it. Protobuf's serializer
// can instead hand a large field over by address, when its output stream
// allows that ("aliasing"); the stream here turns each such field into a
// gRPC slice of its own, pointing into the message, and gRPC writes slices
// to the socket as they are. So a row's bytes are written into the message
// once and read from there by the kernel.
//
// The bytes are exactly SerializeAsString()'s: any receiver parses them as
// before. Which fields are aliased is protobuf's choice: a field is copied
// when it fits in the block being filled (blocks are
// kAliasedSerializeBlockBytes), so fields of that size or more are always
// aliased and small ones never are.
//
// ParseAndClear is the receiving side's counterpart (it copies, as
// protobuf's parser does); ParseAndClearLeavingInPlace leaves one large field
// where it arrived.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ember {

inline constexpr size_t kAliasedSerializeBlockBytes = 8192;

// The returned buffer shares ownership of `message`: the message lives until
// gRPC is done with the last slice that points into it, on whatever thread
// that happens, so it must not change after this call. The message must be
// initialised (proto3 messages always are). Thread-safe for distinct
// messages.
grpc::ByteBuffer SerializeAliased(std::shared_ptr<const google::protobuf::Message> message);

// The same bytes with every field copied, for a message the caller keeps:
// what gRPC's generated code does. The buffer does not refer to `message`.
grpc::ByteBuffer SerializeCopied(const google::protobuf::Message& message);

// All of `buffer`'s bytes, copied into one string: for small messages
// (health checks) and tests. Empty if gRPC cannot read the buffer.
std::string FlattenByteBuffer(const grpc::ByteBuffer& buffer);

// Parses `buffer` into `message` (replacing its contents), then empties
// `buffer`. False if the bytes are not a valid `message`.
bool ParseAndClear(grpc::ByteBuffer* buffer, google::protobuf::Message* message);

// Each occurrence of a field left in place: the message that would hold it
// and the pieces of its value, in wire order (in_place_parse.h).
using InPlaceFields =
    std::vector<std::pair<const google::protobuf::Message*, std::vector<absl::string_view>>>;

// ParseAndClear, leaving the `bytes` field at `path` (ParseLeavingInPlace)
// in `buffer`'s slices: returns them, to be kept alive while the pieces in
// `*fields` (cleared first) are read; null if the bytes are not a valid
// `message`, which is then cleared.
std::shared_ptr<const void> ParseAndClearLeavingInPlace(grpc::ByteBuffer* buffer,
                                                        absl::Span<const int> path,
                                                        google::protobuf::Message* message,
                                                        InPlaceFields* fields);

// The pieces of `parent`'s field among `fields` (the last occurrence wins,
// as in protobuf); null if it was not on the wire, which means empty.
inline const std::vector<absl::string_view>* FindInPlace(const InPlaceFields& fields,
                                                         const google::protobuf::Message& parent) {
  for (auto it = fields.rbegin(); it != fields.rend(); ++it) {
    if (it->first == &parent) return &it->second;
  }
  return nullptr;
}

}  // namespace ember
