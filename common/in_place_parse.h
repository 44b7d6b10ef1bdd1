// Parses a serialised protobuf message that arrived in pieces (gRPC's
// receive slices) and leaves one chosen `bytes` field where it lies.
//
// Protobuf's parser copies every `bytes` field into a string of its own. For
// a lookup's rows (MBs per step at dim 128) that copy is pure overhead when
// the reader then copies each row once more, to where it is used. Here the
// chosen field is not stored: its value is reported as the pieces it spans,
// for the caller to read in place while the pieces live. Every other field
// is parsed by protobuf itself, so its checks (UTF-8 strings, enum and
// varint forms, lengths) and its semantics (last value wins, repeated
// occurrences of a message merge) are protobuf's.
//
// SerializeAliased (aliased_serialize.h) is the sending side's counterpart.
#pragma once

#include <functional>
#include <vector>

#include <google/protobuf/message.h>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ember {

// `pieces`, concatenated, hold the serialised message. `path` names the
// field to leave in place: field numbers from `message`'s type down through
// message fields (singular or repeated) to a `bytes` field. Each occurrence
// of that field (with the length-delimited wire type) calls
// on_field(parent, value): `parent` is the message that would hold it,
// `value` the pieces of its bytes, in order (empty for an empty value); the
// field itself stays empty in `parent`. Occurrences come in wire order, so
// for a repeated message the last one for a parent wins, as in protobuf.
//
// Returns false if the bytes are not a valid message of `message`'s type,
// or hold a group (wire types 3 and 4, which proto3 never writes); `message`
// is then in an unspecified state. `message` is cleared first. Thread-safe
// for distinct messages.
bool ParseLeavingInPlace(
    absl::Span<const absl::string_view> pieces, absl::Span<const int> path,
    google::protobuf::Message* message,
    const std::function<void(google::protobuf::Message* parent,
                             std::vector<absl::string_view> value)>& on_field);

}  // namespace ember
