// The shard's answer to a trainer's exchange, serialised for gRPC without
// copying the rows again.
//
// A lookup's rows are the bulk of every answer (tens of KB at dim 8, MBs at
// dim 128). Through the generated stub, protobuf copies them into one
// contiguous buffer before gRPC sends it. Here each table's rows go into the
// gRPC message as a slice of their own, which takes over the row buffer the
// store already wrote; gRPC hands slices to the socket as they are, so a
// row's bytes are written once on the shard, by the store.
//
// The bytes are protobuf's wire format for the same message: a client with
// the generated stubs parses them into an equal ExchangeResponse. Fields of
// a TableRows come out in a different order (its rows last), which protobuf
// parsers accept by specification.
#pragma once

#include <cstddef>

#include <grpcpp/support/byte_buffer.h>

#include "ember/v1/embedding_service.pb.h"

namespace ember {

// Rows of fewer bytes than this are copied next to the other fields instead:
// a slice of their own would cost more than the copy.
inline constexpr size_t kMinRowSliceBytes = 1024;

// Serialises `response`, moving each table's rows out of it (they are empty
// afterwards; every other field is left as it was). The returned buffer owns
// the rows and frees them when gRPC is done with the last slice, on whatever
// thread that happens. Thread-compatible: `response` must not be used by
// another thread during the call.
grpc::ByteBuffer SerializeWithRowSlices(v1::ExchangeResponse* response);

}  // namespace ember
