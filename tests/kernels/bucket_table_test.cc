// The CUDA store's table logic (kernels/bucket_table.h), run on the CPU: the
// same functions the GPU kernels call.
#include "kernels/bucket_table.h"

#include <map>
#include <random>
#include <vector>

#include "common/key_hash.h"
#include "gtest/gtest.h"

namespace ember::bucket {
namespace {

// A table over host vectors.
struct HostTable {
  explicit HostTable(uint64_t buckets, uint64_t capacity = 0)
      : keys(buckets * kSlots), digests(buckets * kSlots, kEmpty), scores(buckets * kSlots),
        sizes(buckets) {
    t.keys = keys.data();
    t.digests = digests.data();
    t.scores = scores.data();
    t.sizes = sizes.data();
    t.num_buckets = buckets;
    t.capacity = capacity;
  }
  std::vector<uint64_t> keys;
  std::vector<uint8_t> digests;
  std::vector<uint32_t> scores;
  std::vector<uint32_t> sizes;
  Table t;
};

TEST(BucketTableTest, MatchBytesFlagsExactlyTheEqualBytes) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100000; ++i) {
    uint32_t word = static_cast<uint32_t>(rng());
    const uint8_t digest = static_cast<uint8_t>(rng());
    if (i % 3 == 0) word = (word & 0xffff00ffu) | (uint32_t{digest} << 8);  // force a match
    uint32_t expected = 0;
    for (int k = 0; k < 4; ++k) {
      if (((word >> (8 * k)) & 0xffu) == digest) expected |= 0x80u << (8 * k);
    }
    ASSERT_EQ(MatchBytes(word, digest), expected) << std::hex << word << " " << int{digest};
  }
}

TEST(BucketTableTest, DigestIsNeverTheEmptyMarkerAndBucketsStayInRange) {
  for (uint64_t k = 0; k < 100000; ++k) {
    const uint64_t h = StoreHash(k);
    EXPECT_NE(DigestOf(h), kEmpty);
    EXPECT_LT(BucketOf(h, 7), 7u);
    EXPECT_LT(StartSlot(h), kSlots);
  }
  EXPECT_NE(DigestOf(0), kEmpty);  // a hash whose low byte is the marker
  EXPECT_EQ(BucketOf(~uint64_t{0}, 1000), 999u);
}

TEST(BucketTableTest, KeysSharingBucketAndDigestAreToldApartByTheKey) {
  // One bucket: among a few thousand keys many share a digest.
  HostTable h(1);
  std::map<uint8_t, std::vector<uint64_t>> by_digest;
  for (uint64_t k = 0; k < 4000; ++k) by_digest[DigestOf(StoreHash(k))].push_back(k);
  std::vector<uint64_t> keys;
  for (auto& [d, ks] : by_digest) {
    if (ks.size() >= 3) keys.insert(keys.end(), ks.begin(), ks.begin() + 3);
    if (keys.size() >= 90) break;
  }
  ASSERT_GE(keys.size(), 90u);
  for (uint64_t k : keys) {
    InsertOutcome o = InsertKey(h.t, k, StoreHash(k), EvictionPolicy::kNone, 0);
    ASSERT_EQ(o.placement, Placement::kInserted);
  }
  for (uint64_t k : keys) {
    const int64_t slot = FindSlot(h.t, k, StoreHash(k));
    ASSERT_NE(slot, kNoSlot);
    EXPECT_EQ(h.keys[slot], k);
  }
  EXPECT_EQ(FindSlot(h.t, 999999, StoreHash(999999)), kNoSlot);
}

TEST(BucketTableTest, InsertFindEraseAgreeWithAMapIncludingZeroAndMaxKeys) {
  HostTable h(64);
  std::map<uint64_t, int64_t> model;
  std::mt19937_64 rng(11);
  std::vector<uint64_t> pool = {0, ~uint64_t{0}};
  for (int i = 0; i < 3000; ++i) pool.push_back(rng());
  for (int op = 0; op < 20000; ++op) {
    const uint64_t k = pool[rng() % pool.size()];
    const uint64_t hash = StoreHash(k);
    if (rng() % 3 == 0) {
      EXPECT_EQ(EraseKey(h.t, k, hash), model.erase(k) == 1);
    } else {
      InsertOutcome o = InsertKey(h.t, k, hash, EvictionPolicy::kNone, 0);
      if (model.count(k)) {
        EXPECT_EQ(o.placement, Placement::kFound);
        EXPECT_EQ(o.slot, model[k]);
      } else {
        ASSERT_EQ(o.placement, Placement::kInserted);  // 64 x 128 slots never fill here
        model[k] = o.slot;
      }
    }
  }
  uint64_t occupied = 0;
  for (uint64_t b = 0; b < 64; ++b) occupied += h.sizes[b];
  EXPECT_EQ(occupied, model.size());
  for (uint64_t k : pool) {
    EXPECT_EQ(FindSlot(h.t, k, StoreHash(k)) != kNoSlot, model.count(k) == 1) << k;
  }
}

TEST(BucketTableTest, CapacityIsSplitOverBucketsAndSumsToIt) {
  HostTable h(7, /*capacity=*/800);
  uint64_t total = 0;
  for (uint64_t b = 0; b < 7; ++b) {
    EXPECT_GE(BucketCapacity(h.t, b), 114u);
    EXPECT_LE(BucketCapacity(h.t, b), 115u);
    total += BucketCapacity(h.t, b);
  }
  EXPECT_EQ(total, 800u);
  EXPECT_EQ(BucketsFor(800, 0), 7u);
  EXPECT_EQ(BucketsFor(0, 1000), 8u);
}

TEST(BucketTableTest, FullBucketWithoutEvictionRefusesNewKeys) {
  HostTable h(1, /*capacity=*/3);
  for (uint64_t k : {1, 2, 3}) {
    ASSERT_EQ(InsertKey(h.t, k, StoreHash(k), EvictionPolicy::kNone, 0).placement,
              Placement::kInserted);
  }
  InsertOutcome o = InsertKey(h.t, 4, StoreHash(4), EvictionPolicy::kNone, 0);
  EXPECT_EQ(o.placement, Placement::kFull);
  EXPECT_EQ(o.slot, kNoSlot);
  EXPECT_EQ(InsertKey(h.t, 2, StoreHash(2), EvictionPolicy::kNone, 0).placement,
            Placement::kFound);
  EXPECT_EQ(h.sizes[0], 3u);
}

TEST(BucketTableTest, FullBucketEvictsItsLowestScoreRow) {
  HostTable h(1, /*capacity=*/4);
  const uint32_t scores[] = {30, 10, 40, 20};
  for (uint64_t k = 0; k < 4; ++k) {
    InsertKey(h.t, k + 100, StoreHash(k + 100), EvictionPolicy::kLru, scores[k]);
  }
  InsertOutcome o = InsertKey(h.t, 7, StoreHash(7), EvictionPolicy::kLru, 50);
  EXPECT_EQ(o.placement, Placement::kReplaced);
  EXPECT_EQ(o.evicted_key, 101u);  // score 10
  EXPECT_EQ(FindSlot(h.t, 101, StoreHash(101)), kNoSlot);
  EXPECT_EQ(FindSlot(h.t, 7, StoreHash(7)), o.slot);
  o = InsertKey(h.t, 8, StoreHash(8), EvictionPolicy::kLru, 60);
  EXPECT_EQ(o.evicted_key, 103u);  // score 20
  EXPECT_EQ(h.sizes[0], 4u);
}

TEST(BucketTableTest, VictimIsTheLowestOccupiedSlotAmongEqualScores) {
  std::vector<uint8_t> digests(kSlots, kEmpty);
  std::vector<uint32_t> scores(kSlots, 0);  // empty slots' scores must not count
  for (uint32_t s : {5u, 9u, 77u}) {
    digests[s] = 3;
    scores[s] = 4;
  }
  EXPECT_EQ(ChooseVictim(digests.data(), scores.data()), 5u);
  scores[77] = 2;
  EXPECT_EQ(ChooseVictim(digests.data(), scores.data()), 77u);
}

}  // namespace
}  // namespace ember::bucket

namespace ember::bucket {
namespace {

// Change tracking on, over host vectors: the dirty bytes and the removed log
// the CUDA store's snapshot reads.
struct TrackedTable : HostTable {
  TrackedTable(uint64_t buckets, uint64_t capacity, uint64_t log_capacity)
      : HostTable(buckets, capacity), dirty(buckets * kSlots), removed(log_capacity) {
    t.dirty = dirty.data();
    t.removed = removed.data();
    t.removed_count = &count;
    t.removed_capacity = log_capacity;
  }
  std::vector<uint8_t> dirty;
  std::vector<uint64_t> removed;
  unsigned long long count = 0;
};

TEST(BucketTableTrackingTest, InsertsMarkTheirSlotsAndEvictionsAndErasesLogTheKeys) {
  TrackedTable h(1, /*capacity=*/4, /*log_capacity=*/8);
  for (uint64_t k = 1; k <= 4; ++k) {
    const InsertOutcome o = InsertKey(h.t, k, StoreHash(k), EvictionPolicy::kLru, uint32_t(k));
    ASSERT_EQ(o.placement, Placement::kInserted);
    EXPECT_EQ(h.dirty[o.slot], 1) << k;
  }
  EXPECT_EQ(h.count, 0u);
  std::fill(h.dirty.begin(), h.dirty.end(), 0);  // a snapshot took them
  // Full: key 5 evicts key 1 (the lowest score); its slot is dirty again.
  const InsertOutcome o5 = InsertKey(h.t, 5, StoreHash(5), EvictionPolicy::kLru, 10);
  ASSERT_EQ(o5.placement, Placement::kReplaced);
  EXPECT_EQ(o5.evicted_key, 1u);
  EXPECT_EQ(h.dirty[o5.slot], 1);
  ASSERT_EQ(h.count, 1u);
  EXPECT_EQ(h.removed[0], 1u);
  // Erase logs the key and clears its slot's mark.
  const int64_t slot3 = FindSlot(h.t, 3, StoreHash(3));
  h.dirty[slot3] = 1;
  ASSERT_TRUE(EraseKey(h.t, 3, StoreHash(3)));
  EXPECT_EQ(h.dirty[slot3], 0);
  ASSERT_EQ(h.count, 2u);
  EXPECT_EQ(h.removed[1], 3u);
  // A found key is not a change by itself.
  const InsertOutcome found = InsertKey(h.t, 2, StoreHash(2), EvictionPolicy::kLru, 11);
  EXPECT_EQ(found.placement, Placement::kFound);
  EXPECT_EQ(h.dirty[found.slot], 0);
}

TEST(BucketTableTrackingTest, RemovedLogCountsPastItsCapacityWithoutWritingBeyondIt) {
  TrackedTable h(1, 0, /*log_capacity=*/2);
  for (uint64_t k = 1; k <= 5; ++k) InsertKey(h.t, k, StoreHash(k), EvictionPolicy::kNone, 0);
  for (uint64_t k = 1; k <= 5; ++k) ASSERT_TRUE(EraseKey(h.t, k, StoreHash(k)));
  EXPECT_EQ(h.count, 5u);  // > capacity: the snapshot must fall back to a full one
  EXPECT_EQ(h.removed, (std::vector<uint64_t>{1, 2}));
}

TEST(BucketTableTrackingTest, WithTrackingOffNothingIsWritten) {
  HostTable h(1);
  const InsertOutcome o = InsertKey(h.t, 9, StoreHash(9), EvictionPolicy::kNone, 0);
  EXPECT_EQ(o.placement, Placement::kInserted);
  EXPECT_TRUE(EraseKey(h.t, 9, StoreHash(9)));  // no arrays: no crash, nothing logged
}

}  // namespace
}  // namespace ember::bucket
