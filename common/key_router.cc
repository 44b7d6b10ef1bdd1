#include "common/key_router.h"

#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/key_hash.h"

namespace ember {
namespace {

constexpr int kSlotBits = 16;
static_assert(kMaxShards == uint32_t{1} << kSlotBits);

// The slot tables, built once per shard count (65,536 jump hashes) and
// shared by every router of that count.
std::shared_ptr<const uint16_t[]> SlotTable(uint32_t shard_count) {
  static std::mutex mu;
  static auto* tables = new std::map<uint32_t, std::shared_ptr<const uint16_t[]>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& table = (*tables)[shard_count];
  if (table == nullptr) {
    std::shared_ptr<uint16_t[]> t(new uint16_t[kMaxShards]);
    for (uint32_t s = 0; s < kMaxShards; ++s) {
      t[s] =
          static_cast<uint16_t>(JumpConsistentHash(Mix64(s ^ 0x3c6ef372fe94f82bULL), shard_count));
    }
    table = std::move(t);
  }
  return table;
}

}  // namespace

uint32_t JumpConsistentHash(uint64_t key, uint32_t buckets) {
  int64_t b = -1;
  int64_t j = 0;
  while (j < static_cast<int64_t>(buckets)) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<int64_t>(static_cast<double>(b + 1) * (static_cast<double>(int64_t{1} << 31) /
                                                           static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<uint32_t>(b);
}

KeyRouter::KeyRouter() : routing_(kDefaultRouting), slots_(SlotTable(1)) {}

absl::StatusOr<KeyRouter> KeyRouter::Make(absl::string_view routing, uint32_t shard_count) {
  if (shard_count < 1 || shard_count > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_count: expected 1 to ", kMaxShards, ", received ", shard_count));
  }
  KeyRouter r;
  r.shard_count_ = shard_count;
  if (routing == kRoutingJump) {
    r.routing_ = kRoutingJump;
    r.slots_ = SlotTable(shard_count);
  } else if (routing == kRoutingFastrange) {
    r.routing_ = kRoutingFastrange;
    r.slots_ = nullptr;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("routing: expected '", kRoutingJump, "' or '",
                                                   kRoutingFastrange, "', received '", routing,
                                                   "'"));
  }
  return r;
}

uint32_t KeyRouter::ShardOf(uint64_t key) const {
  const uint64_t h = Mix64(key);
  if (slots_ != nullptr) return slots_[h >> (64 - kSlotBits)];
  return static_cast<uint32_t>(((h >> 32) * shard_count_) >> 32);
}

uint32_t DefaultShardOf(uint64_t key, uint32_t shard_count) {
  return SlotTable(shard_count)[Mix64(key) >> (64 - kSlotBits)];
}

}  // namespace ember
