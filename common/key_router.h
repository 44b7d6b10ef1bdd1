// KeyRouter: which shard owns a key. The routing contract of a cluster: a
// client sends each key to router.ShardOf(key), and a shard refuses any key
// that the same routing gives to another shard. Checkpoints record the
// routing's name, so a checkpoint is always read with the routing that
// placed its keys (docs/checkpoints.md, "Routing").
//
// Two routings exist; each name denotes one exact function forever:
//   "splitmix64-jump65536" (the default): the key's splitmix64 mix picks one
//     of 65,536 slots (its top 16 bits), and slot s belongs to shard
//     JumpConsistentHash(splitmix64(s ^ c), shard_count) (Lamping and
//     Veach, 2014). Going from n to n + 1 shards moves the keys of the
//     slots jump hashing moves: 1/(n + 1) of them, up to the slots'
//     granularity, which also makes the largest shard hold up to 1.01x
//     (2-5 shards), 1.04x (16) or 1.06x (64) of an even share
//     (bench/routing_bench). A key costs a mix and a load from a 128 KiB
//     table, about the same as
//   "splitmix64-fastrange32" (before routing had a choice): the top 32
//     bits of the mix, multiplied by shard_count, shifted right by 32. Even,
//     but going from n to n + 1 shards moves about half of the keys.
//
// Thread-safe (immutable); cheap to copy (the slot table is shared).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember {

inline constexpr char kRoutingJump[] = "splitmix64-jump65536";
inline constexpr char kRoutingFastrange[] = "splitmix64-fastrange32";
// What a new cluster routes by.
inline constexpr char kDefaultRouting[] = "splitmix64-jump65536";
// Most shards a routing serves (the jump routing's slot count).
inline constexpr uint32_t kMaxShards = 65536;

class KeyRouter {
 public:
  // `routing` one of the names above, 1 <= shard_count <= kMaxShards;
  // INVALID_ARGUMENT naming what is wrong otherwise.
  static absl::StatusOr<KeyRouter> Make(absl::string_view routing, uint32_t shard_count);
  // One shard under the default routing.
  KeyRouter();

  uint32_t ShardOf(uint64_t key) const;
  uint32_t shard_count() const { return shard_count_; }
  const std::string& routing() const { return routing_; }

 private:
  std::string routing_;
  uint32_t shard_count_ = 1;
  // Jump routing: slot -> shard; null for fastrange.
  std::shared_ptr<const uint16_t[]> slots_;
};

// Jump consistent hash (Lamping and Veach, 2014): the bucket in
// [0, buckets) of `key`; going from n to n + 1 buckets moves a key only to
// the new bucket, each with probability 1/(n + 1). A loop of about
// ln(buckets) floating-point divisions: the jump routing computes it once
// per slot, not per key.
uint32_t JumpConsistentHash(uint64_t key, uint32_t buckets);

// The shard that owns `key` among `shard_count` under the default routing:
// for tests and tools that build a router once per call.
uint32_t DefaultShardOf(uint64_t key, uint32_t shard_count);

}  // namespace ember
