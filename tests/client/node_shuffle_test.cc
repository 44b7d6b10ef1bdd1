// The node shuffle on the in-process transport, 1 to 8 simulated GPUs: each
// unique key of the node is fetched and pushed once, every rank gets the
// rows of its own keys, and the pushed gradients equal a single GPU's.
#include "ember/node_shuffle.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "common/key_hash.h"
#include "gtest/gtest.h"
#include "kernels/embedding_store.h"
#include "tests/test_util.h"

namespace ember {
namespace {

using ::ember::testing::Bytes;
using ::ember::testing::MutableBytes;

const std::vector<uint32_t> kDims = {4, 3};

// One rank's step: per table, its batch's key occurrences and one gradient
// row per occurrence.
struct RankBatch {
  std::vector<std::vector<uint64_t>> keys;    // [table][occurrence]
  std::vector<std::vector<float>> grads;      // [table][occurrence * dim]
};

// Zipf-like draws from a small pool, so ranks share many keys. With
// `dyadic`, gradients are multiples of 1/8 below 4 in magnitude: every sum
// here is exact, whatever the order.
std::vector<RankBatch> MakeBatches(uint32_t ranks, uint64_t seed, bool dyadic) {
  std::mt19937_64 rng(seed);
  std::vector<RankBatch> out(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    out[r].keys.resize(kDims.size());
    out[r].grads.resize(kDims.size());
    for (size_t t = 0; t < kDims.size(); ++t) {
      const size_t n = 200 + rng() % 300;
      for (size_t i = 0; i < n; ++i) {
        const uint64_t u = rng() % 1000;
        out[r].keys[t].push_back(Mix64((u * u) / 997 + 1000 * t));  // skewed
        for (uint32_t j = 0; j < kDims[t]; ++j) {
          const float g = dyadic ? static_cast<float>(static_cast<int>(rng() % 63) - 31) / 8.0f
                                 : std::normal_distribution<float>(0.0f, 1.0f)(rng);
          out[r].grads[t].push_back(g);
        }
      }
    }
  }
  return out;
}

// Unique keys in first-occurrence order and the per-unique-key gradient sums
// (occurrence order), as a rank's pooling backward produces them.
void LocalUnique(const RankBatch& b, std::vector<std::vector<uint64_t>>* unique,
                 std::vector<std::vector<float>>* sums) {
  unique->assign(kDims.size(), {});
  sums->assign(kDims.size(), {});
  for (size_t t = 0; t < kDims.size(); ++t) {
    absl::flat_hash_map<uint64_t, size_t> index;
    for (size_t i = 0; i < b.keys[t].size(); ++i) {
      auto [it, fresh] = index.try_emplace(b.keys[t][i], (*unique)[t].size());
      if (fresh) {
        (*unique)[t].push_back(b.keys[t][i]);
        (*sums)[t].resize((*sums)[t].size() + kDims[t], 0.0f);
      }
      for (uint32_t j = 0; j < kDims[t]; ++j) {
        (*sums)[t][it->second * kDims[t] + j] += b.grads[t][i * kDims[t] + j];
      }
    }
  }
}

TableConfig Table(size_t t) {
  TableConfig c;
  c.name = "t" + std::to_string(t);
  c.dim = kDims[t];
  c.initializer.kind = InitializerKind::kUniform;
  c.initializer.min = -1;
  c.initializer.max = 1;
  c.initializer.seed = 5 + t;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.learning_rate = 0.5f;
  return c;
}

// What every rank saw and did in one step.
struct RankResult {
  std::vector<std::vector<uint64_t>> unique;       // its keys
  std::vector<std::vector<float>> rows;            // rows it received
  std::vector<std::vector<uint64_t>> owned;        // keys it fetched and pushed
  std::vector<std::vector<float>> owned_grads;     // sums it pushed
  absl::Status status;
};

// Runs one step on `ranks` threads. The cluster is one store per table;
// owners fetch (FindOrInsert) and push (ApplyGradients) their owned keys.
std::vector<RankResult> RunStep(const std::vector<RankBatch>& batches,
                                std::vector<std::unique_ptr<EmbeddingStore>>& cluster) {
  const uint32_t ranks = static_cast<uint32_t>(batches.size());
  auto transports = NewInProcessTransports(ranks);
  std::vector<RankResult> results(ranks);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      RankResult& res = results[r];
      NodeShuffle ex(transports[r].get(), kDims);
      std::vector<std::vector<float>> local_sums;
      LocalUnique(batches[r], &res.unique, &local_sums);
      auto owned = ex.RouteKeys(res.unique);
      if (!(res.status = owned.status()).ok()) return;
      res.owned = *owned;
      std::vector<std::vector<float>> fetched(kDims.size());
      std::vector<absl::Span<const float>> fetched_views;
      for (size_t t = 0; t < kDims.size(); ++t) {
        fetched[t].resize(res.owned[t].size() * kDims[t]);
        if (!(res.status = cluster[t]->FindOrInsert(res.owned[t], DType::kFp32,
                                                    MutableBytes(fetched[t])).status())
                 .ok()) {
          return;
        }
        fetched_views.emplace_back(fetched[t]);
      }
      auto rows = ex.ShareRows(fetched_views);
      if (!(res.status = rows.status()).ok()) return;
      res.rows = *rows;
      std::vector<absl::Span<const float>> grad_views(local_sums.begin(), local_sums.end());
      auto sums = ex.ReduceGradients(grad_views);
      if (!(res.status = sums.status()).ok()) return;
      res.owned_grads = *sums;
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

std::vector<std::unique_ptr<EmbeddingStore>> NewCluster() {
  std::vector<std::unique_ptr<EmbeddingStore>> stores;
  for (size_t t = 0; t < kDims.size(); ++t) stores.push_back(*NewCpuStore(Table(t)));
  return stores;
}

class NodeShuffleTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(NodeShuffleTest, EachUniqueKeyIsFetchedAndPushedOnceAndRowsReachEveryRank) {
  const uint32_t ranks = GetParam();
  auto batches = MakeBatches(ranks, 100 + ranks, /*dyadic=*/true);
  auto cluster = NewCluster();
  auto results = RunStep(batches, cluster);
  for (uint32_t r = 0; r < ranks; ++r) ASSERT_TRUE(results[r].status.ok()) << results[r].status;

  for (size_t t = 0; t < kDims.size(); ++t) {
    std::set<uint64_t> node_keys;
    for (const auto& b : batches) node_keys.insert(b.keys[t].begin(), b.keys[t].end());
    // Owned sets are disjoint, cover the node's keys, and sit with their owner.
    std::multiset<uint64_t> fetched;
    for (uint32_t r = 0; r < ranks; ++r) {
      for (uint64_t k : results[r].owned[t]) {
        fetched.insert(k);
        EXPECT_EQ(OwnerRank(k, ranks), r);
      }
    }
    EXPECT_EQ(fetched.size(), node_keys.size()) << "table " << t;
    EXPECT_EQ(std::set<uint64_t>(fetched.begin(), fetched.end()), node_keys);
    EXPECT_EQ(cluster[t]->Stats().rows, node_keys.size());  // one insert per node key
    // Each rank got the stored row of each of its keys, in its order.
    for (uint32_t r = 0; r < ranks; ++r) {
      const auto& keys = results[r].unique[t];
      std::vector<float> expected(keys.size() * kDims[t]);
      ASSERT_TRUE(cluster[t]->Find(keys, DType::kFp32, MutableBytes(expected)).ok());
      EXPECT_EQ(results[r].rows[t], expected) << "rank " << r << " table " << t;
    }
  }
}

TEST_P(NodeShuffleTest, PushedGradientsEqualASingleGpusOverTheWholeNodeBatch) {
  const uint32_t ranks = GetParam();
  auto batches = MakeBatches(ranks, 200 + ranks, /*dyadic=*/true);
  auto cluster = NewCluster();
  auto results = RunStep(batches, cluster);
  for (uint32_t r = 0; r < ranks; ++r) ASSERT_TRUE(results[r].status.ok()) << results[r].status;

  for (size_t t = 0; t < kDims.size(); ++t) {
    // The single GPU: every occurrence of the node's batch, summed per key.
    std::map<uint64_t, std::vector<float>> single;
    for (const auto& b : batches) {
      for (size_t i = 0; i < b.keys[t].size(); ++i) {
        auto& g = single[b.keys[t][i]];
        g.resize(kDims[t], 0.0f);
        for (uint32_t j = 0; j < kDims[t]; ++j) g[j] += b.grads[t][i * kDims[t] + j];
      }
    }
    size_t pushed = 0;
    for (uint32_t r = 0; r < ranks; ++r) {
      const auto& owned = results[r].owned[t];
      for (size_t i = 0; i < owned.size(); ++i, ++pushed) {
        const std::vector<float> got(results[r].owned_grads[t].begin() + i * kDims[t],
                                     results[r].owned_grads[t].begin() + (i + 1) * kDims[t]);
        EXPECT_EQ(got, single[owned[i]]) << "key " << owned[i];
      }
    }
    EXPECT_EQ(pushed, single.size());

    // Pushing the owners' sums leaves the table as the single GPU's push of
    // its whole batch does.
    auto reference = NewCpuStore(Table(t));
    std::vector<uint64_t> all_keys;
    std::vector<float> all_grads;
    for (const auto& b : batches) {
      all_keys.insert(all_keys.end(), b.keys[t].begin(), b.keys[t].end());
      all_grads.insert(all_grads.end(), b.grads[t].begin(), b.grads[t].end());
    }
    ASSERT_TRUE((*reference)->ApplyGradients(all_keys, DType::kFp32, Bytes(all_grads)).ok());
    for (uint32_t r = 0; r < ranks; ++r) {
      ASSERT_TRUE(cluster[t]
                      ->ApplyGradients(results[r].owned[t], DType::kFp32,
                                       Bytes(results[r].owned_grads[t]))
                      .ok());
    }
    std::vector<uint64_t> keys;
    for (const auto& [k, g] : single) keys.push_back(k);
    std::vector<float> a(keys.size() * kDims[t]), b(keys.size() * kDims[t]);
    ASSERT_TRUE(cluster[t]->Find(keys, DType::kFp32, MutableBytes(a)).ok());
    ASSERT_TRUE((*reference)->Find(keys, DType::kFp32, MutableBytes(b)).ok());
    EXPECT_EQ(a, b) << "table " << t;
  }
}

TEST_P(NodeShuffleTest, SumsOfInexactGradientsAreDeterministicAndCloseToTheExactSum) {
  const uint32_t ranks = GetParam();
  auto batches = MakeBatches(ranks, 300 + ranks, /*dyadic=*/false);
  auto c1 = NewCluster();
  auto c2 = NewCluster();
  auto first = RunStep(batches, c1);
  auto second = RunStep(batches, c2);
  for (uint32_t r = 0; r < ranks; ++r) {
    ASSERT_TRUE(first[r].status.ok()) << first[r].status;
    ASSERT_TRUE(second[r].status.ok()) << second[r].status;
    EXPECT_EQ(first[r].owned_grads, second[r].owned_grads) << "rank " << r;  // bit for bit
  }
  for (size_t t = 0; t < kDims.size(); ++t) {
    std::map<uint64_t, std::vector<double>> exact;
    for (const auto& b : batches) {
      for (size_t i = 0; i < b.keys[t].size(); ++i) {
        auto& g = exact[b.keys[t][i]];
        g.resize(kDims[t], 0.0);
        for (uint32_t j = 0; j < kDims[t]; ++j) g[j] += b.grads[t][i * kDims[t] + j];
      }
    }
    for (uint32_t r = 0; r < ranks; ++r) {
      for (size_t i = 0; i < first[r].owned[t].size(); ++i) {
        for (uint32_t j = 0; j < kDims[t]; ++j) {
          EXPECT_NEAR(first[r].owned_grads[t][i * kDims[t] + j],
                      exact[first[r].owned[t][i]][j], 1e-4);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, NodeShuffleTest, ::testing::Values(1u, 2u, 3u, 4u, 8u),
                         [](const ::testing::TestParamInfo<uint32_t>& info) {
                           return std::to_string(info.param) + "gpus";
                         });

TEST(NodeShuffleInputTest, BadInputsAreRefusedNamingTheFieldBeforeAnyExchange) {
  auto transports = NewInProcessTransports(1);
  NodeShuffle ex(transports[0].get(), kDims);
  std::vector<float> rows(4);
  auto early = ex.ShareRows({rows, rows});
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition) << early.status();

  auto wrong_tables = ex.RouteKeys({{1, 2}});
  EXPECT_EQ(wrong_tables.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_tables.status().message().find("expected 2 tables, received 1"),
            std::string::npos)
      << wrong_tables.status();
  auto repeated = ex.RouteKeys({{1, 2, 1}, {}});
  EXPECT_EQ(repeated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(repeated.status().message().find("key 1 appears twice"), std::string::npos)
      << repeated.status();
  EXPECT_EQ(ex.bytes_sent(), 0u);

  ASSERT_TRUE(ex.RouteKeys({{1, 2}, {3}}).ok());
  std::vector<float> t0(2 * 4), t1(1 * 3), short_t1(2);
  auto bad = ex.ShareRows({t0, short_t1});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("table 1 field 'owned_rows': expected 3 floats, received 2"),
            std::string::npos)
      << bad.status();
  auto good = ex.ShareRows({t0, t1});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)[0], t0);
}

TEST(NodeShuffleInputTest, ATransportWithWrongBlockCountIsRefused) {
  auto transports = NewInProcessTransports(2);
  std::vector<std::vector<uint8_t>> recv;
  auto s = transports[0]->AllToAll({{1, 2, 3}}, &recv);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected 2 blocks, received 1"), std::string::npos) << s;
}

TEST(OwnerRankTest, OwnersAreInRangeAndBalanced) {
  for (uint32_t ranks : {1u, 2u, 3u, 8u}) {
    std::vector<int> count(ranks);
    for (uint64_t k = 0; k < 80000; ++k) {
      const uint32_t o = OwnerRank(k, ranks);
      ASSERT_LT(o, ranks);
      ++count[o];
    }
    for (int c : count) EXPECT_NEAR(c, 80000.0 / ranks, 80000.0 / ranks * 0.05);
  }
}

}  // namespace
}  // namespace ember
