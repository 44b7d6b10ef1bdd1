// Key hashing shared by client, server and kernels. Which shard owns a key
// is common/key_router.h's business (it mixes keys with Mix64 too).
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

// The hash a store uses to place a key. Seeded apart from the routing's mix
// so that the keys of one shard (which share routing bits) still spread
// evenly.
EMBER_HD uint64_t StoreHash(uint64_t key) { return Mix64(key ^ 0x6a09e667f3bcc909ULL); }

}  // namespace ember
