// Key hashing shared by client and server.
//
// ShardOf is the routing contract: the client sends a key to ShardOf(key, n)
// and the shard rejects any key for which ShardOf(key, n) != its index.
// Changing it invalidates every checkpoint's shard placement.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace ember {

// The splitmix64 finalizer: a bijective 64-bit mix.
EMBER_HD uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Name of the routing function, reported by GetShardInfo.
inline constexpr char kRoutingName[] = "splitmix64-fastrange32";

// Maps the top 32 bits of the mixed key onto [0, shard_count) by a multiply
// and shift (Lemire's fastrange): uniform like a modulo, without a division
// on every key of every request.
EMBER_HD uint32_t ShardOf(uint64_t key, uint32_t shard_count) {
  return static_cast<uint32_t>(((Mix64(key) >> 32) * shard_count) >> 32);
}

// The hash a store uses to place a key. Seeded apart from ShardOf so that the
// keys of one shard (which share ShardOf residues) still spread evenly.
EMBER_HD uint64_t StoreHash(uint64_t key) { return Mix64(key ^ 0x6a09e667f3bcc909ULL); }

}  // namespace ember
