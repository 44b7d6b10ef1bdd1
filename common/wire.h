// Packing of keys on the wire: little-endian uint64, 8 bytes each.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/types/span.h"

namespace ember {

static_assert(std::endian::native == std::endian::little,
              "Ember's wire format is little-endian and so are the hosts it runs on");

// Views `bytes` (size a multiple of 8, checked by the caller) as keys. When the
// bytes are not 8-byte aligned they are copied into `storage` first.
inline absl::Span<const uint64_t> KeysView(absl::string_view bytes,
                                           std::vector<uint64_t>* storage) {
  const size_t n = bytes.size() / 8;
  if (n == 0) return {};  // memcpy from or to a null pointer is undefined, even of 0 bytes
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint64_t) == 0) {
    return {reinterpret_cast<const uint64_t*>(bytes.data()), n};
  }
  storage->resize(n);
  memcpy(storage->data(), bytes.data(), n * 8);
  return {storage->data(), n};
}

// Metadata of an ExchangeStream: how long each of its exchanges may wait for
// the consistency clock, in decimal milliseconds (see the .proto).
inline constexpr char kExchangeTimeoutMetadata[] = "ember-exchange-timeout-ms";

// Metadata of every Lookup, Push and Exchange call (and ExchangeStream): the
// routing epoch the client routes by, in decimal (GetShardInfoResponse.
// routing_epoch). A shard at another epoch refuses the call with ABORTED;
// without it the shard checks nothing.
inline constexpr char kRoutingEpochMetadata[] = "ember-routing-epoch";

// Packs keys into a wire `bytes` field.
inline std::string PackKeys(absl::Span<const uint64_t> keys) {
  return std::string(reinterpret_cast<const char*>(keys.data()), keys.size() * 8);
}

}  // namespace ember
