// Client-side step math without a network: batch validation, unique +
// inverse, pooling with every combiner, and its backward pass.
#include "client/pooling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "client/dedup.h"
#include "client/pooling_math.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ember {
namespace {

TEST(DedupTest, UniqueKeysKeepFirstOccurrenceOrderAndInverseRebuildsTheInput) {
  KeyDeduplicator d;
  std::vector<uint32_t> inverse;
  const std::vector<uint64_t> a = {5, ~uint64_t{0}, 5, 0, 7};
  const std::vector<uint64_t> b = {0, 9, ~uint64_t{0}};
  d.Add(a, &inverse);
  d.Add(b, &inverse);
  EXPECT_EQ(d.unique(), (std::vector<uint64_t>{5, ~uint64_t{0}, 0, 7, 9}));
  std::vector<uint64_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  ASSERT_EQ(inverse.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(d.unique()[inverse[i]], all[i]);
  d.Clear();
  inverse.clear();
  d.Add(b, &inverse);
  EXPECT_EQ(d.unique(), (std::vector<uint64_t>{0, 9, ~uint64_t{0}}));
}

TEST(DedupTest, GrowsPastItsFirstTableAndForgetsEverythingAtClear) {
  KeyDeduplicator d;
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 5000; ++k) keys.push_back(k * 1000003 % 7919 + (k % 3) * 100000);
  for (int step = 0; step < 3; ++step) {
    d.Clear();
    std::vector<uint32_t> inverse;
    d.Add(keys, &inverse);
    d.Add(keys, &inverse);  // every key again: all duplicates
    ASSERT_EQ(inverse.size(), 2 * keys.size());
    std::vector<uint64_t> expected;
    for (uint64_t k : keys) {
      if (std::find(expected.begin(), expected.end(), k) == expected.end()) expected.push_back(k);
    }
    EXPECT_EQ(d.unique(), expected) << "step " << step;
    for (size_t i = 0; i < inverse.size(); ++i) {
      ASSERT_EQ(d.unique()[inverse[i]], keys[i % keys.size()]) << "step " << step << " id " << i;
    }
  }
}

// Rows of unique keys: row u is {u + 1, 10 * (u + 1)}.
std::vector<float> TwoDimRows(int n) {
  std::vector<float> rows;
  for (int u = 0; u < n; ++u) {
    rows.push_back(u + 1.0f);
    rows.push_back(10.0f * (u + 1));
  }
  return rows;
}

TEST(PoolingTest, SumMeanAndSqrtNCombineWeightedRowsAndEmptyExamplesGiveZeros) {
  // Example 0: ids {0, 2} weights {1, 3}; example 1: none; example 2: {1, 1}.
  const std::vector<int64_t> offsets = {0, 2, 2, 4};
  const std::vector<uint32_t> inverse = {0, 2, 1, 1};
  const std::vector<float> weights = {1, 3, 2, 2};
  const std::vector<float> rows = TwoDimRows(3);
  std::vector<float> out(6, -1);
  PoolForward(offsets, inverse, weights, Combiner::kSum, rows.data(), 2, out.data());
  EXPECT_EQ(out, (std::vector<float>{10, 100, 0, 0, 8, 80}));
  PoolForward(offsets, inverse, weights, Combiner::kMean, rows.data(), 2, out.data());
  EXPECT_EQ(out, (std::vector<float>{2.5f, 25, 0, 0, 2, 20}));
  PoolForward(offsets, inverse, weights, Combiner::kSqrtN, rows.data(), 2, out.data());
  EXPECT_FLOAT_EQ(out[0], 10 / std::sqrt(10.0f));
  EXPECT_FLOAT_EQ(out[1], 100 / std::sqrt(10.0f));
  EXPECT_EQ(out[2], 0);
  EXPECT_FLOAT_EQ(out[4], 8 / std::sqrt(8.0f));
  // No weights means weight 1.
  PoolForward(offsets, inverse, {}, Combiner::kMean, rows.data(), 2, out.data());
  EXPECT_EQ(out, (std::vector<float>{2, 20, 0, 0, 2, 20}));
}

TEST(PoolingTest, BackwardSumsDuplicateIdsIntoOneGradientPerUniqueRow) {
  const std::vector<int64_t> offsets = {0, 2, 2, 4};
  const std::vector<uint32_t> inverse = {0, 2, 1, 1};
  const std::vector<float> weights = {1, 3, 2, 2};
  const std::vector<float> d_pooled = {1, 2, 100, 100, 0.5f, 1};
  std::vector<float> d_rows(6, 0);
  PoolBackward(offsets, inverse, weights, Combiner::kMean, d_pooled.data(), 2, d_rows.data());
  // Mean scales example 0 by 1/4 and example 2 by 1/4; example 1 has no ids.
  EXPECT_EQ(d_rows, (std::vector<float>{0.25f, 0.5f, 0.5f, 1.0f, 0.75f, 1.5f}));
}

// Pooling is linear in the rows, so its backward must be its adjoint:
// <d_pooled, Forward(rows)> == <Backward(d_pooled), rows> for any inputs.
TEST(PoolingTest, BackwardIsTheAdjointOfForwardForEveryCombiner) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-1, 1);
  const uint32_t dim = 5;
  const int batch = 64, unique = 20;
  std::vector<int64_t> offsets = {0};
  std::vector<uint32_t> inverse;
  std::vector<float> weights;
  for (int i = 0; i < batch; ++i) {
    const int n = rng() % 6;  // some examples are empty
    for (int j = 0; j < n; ++j) {
      inverse.push_back(rng() % unique);
      weights.push_back(value(rng) + 1.5f);
    }
    offsets.push_back(static_cast<int64_t>(inverse.size()));
  }
  std::vector<float> rows(unique * dim), d_pooled(batch * dim);
  for (float& x : rows) x = value(rng);
  for (float& x : d_pooled) x = value(rng);
  for (Combiner c : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtN}) {
    for (bool weighted : {false, true}) {
      absl::Span<const float> w = weighted ? absl::Span<const float>(weights) : absl::Span<const float>();
      std::vector<float> pooled(batch * dim), d_rows(unique * dim, 0);
      PoolForward(offsets, inverse, w, c, rows.data(), dim, pooled.data());
      PoolBackward(offsets, inverse, w, c, d_pooled.data(), dim, d_rows.data());
      double lhs = 0, rhs = 0;
      for (size_t i = 0; i < pooled.size(); ++i) lhs += double{d_pooled[i]} * pooled[i];
      for (size_t i = 0; i < rows.size(); ++i) rhs += double{d_rows[i]} * rows[i];
      EXPECT_NEAR(lhs, rhs, 1e-4 * (1 + std::abs(lhs)))
          << "combiner " << static_cast<int>(c) << " weighted " << weighted;
    }
  }
}

TEST(BatchTest, MalformedBatchesAreRejectedNamingFeatureFieldAndSizes) {
  const std::vector<std::string> names = {"user", "tags"};
  Batch ok;
  ok.features = {{{0, 1, 2}, {7, 8}, {}}, {{0, 0, 3}, {1, 2, 3}, {1, 1, 1}}};
  EXPECT_OK(ValidateBatch(ok, names));
  struct Case {
    std::function<void(Batch&)> mutate;
    std::string expect;
  } cases[] = {
      {[](Batch& b) { b.features.pop_back(); }, "expected 2 features, received 1"},
      {[](Batch& b) { b.features[0].offsets = {1, 2, 2}; }, "feature 'user' field 'offsets'"},
      {[](Batch& b) { b.features[1].offsets = {0, 3}; },
       "feature 'tags' field 'offsets': expected batch size 2"},
      {[](Batch& b) { b.features[1].offsets = {0, 2, 1}; }, "expected non-decreasing"},
      {[](Batch& b) { b.features[0].keys.push_back(9); },
       "feature 'user' field 'keys': expected 2 keys (offsets.back()), received 3"},
      {[](Batch& b) { b.features[1].weights = {1}; },
       "feature 'tags' field 'weights': expected 0 or 3 weights, received 1"},
      {[](Batch& b) { b.features[1].weights[2] = NAN; }, "expected finite values"},
  };
  for (const Case& c : cases) {
    Batch b = ok;
    c.mutate(b);
    absl::Status s = ValidateBatch(b, names);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.expect;
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << s;
  }
}

// The device kernels pool one element per thread with pool::PooledElement;
// it must give the host's floats exactly (same terms, same order).
// The host passes run a vectorised clone (common/vector_dispatch.h): dims
// below, at and above the vector widths, with remainders, and every width
// that has a fixed-width form (8, 16, 32, 64, 128: client/pooling.cc).
class PoolingDimTest : public ::testing::TestWithParam<uint32_t> {};
INSTANTIATE_TEST_SUITE_P(Dims, PoolingDimTest,
                         ::testing::Values(7u, 8u, 16u, 32u, 33u, 64u, 128u, 256u));

TEST_P(PoolingDimTest, PerElementFormUsedOnTheDeviceMatchesTheHostBitForBit) {
  std::mt19937 rng(9);
  const uint32_t dim = GetParam();
  std::vector<float> rows(50 * dim);
  for (float& v : rows) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  // Signed zeros: an example whose first term is -0 must still pool to +0
  // (0.0f + -0.0f), as the per-element form does.
  for (uint32_t d = 0; d < dim; d += 3) rows[d] = -0.0f;
  std::vector<int64_t> offsets = {0};
  std::vector<uint32_t> inverse;
  std::vector<float> weights;
  for (int i = 0; i < 40; ++i) {
    const int ids = i == 0 ? 1 : static_cast<int>(rng() % 6);  // some examples empty
    for (int k = 0; k < ids; ++k) {
      inverse.push_back(i == 0 ? 0 : rng() % 50);  // example 0: row 0 alone
      weights.push_back(std::uniform_real_distribution<float>(0.1f, 2)(rng));
    }
    offsets.push_back(static_cast<int64_t>(inverse.size()));
  }
  for (Combiner c : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtN}) {
    for (bool weighted : {false, true}) {
      std::vector<float> host(40 * dim);
      absl::Span<const float> w = weighted ? absl::Span<const float>(weights)
                                           : absl::Span<const float>();
      PoolForward(offsets, inverse, w, c, rows.data(), dim, host.data());
      for (int64_t i = 0; i < 40; ++i) {
        for (uint32_t d = 0; d < dim; ++d) {
          const float e = pool::PooledElement(offsets.data(), inverse.data(),
                                              weighted ? weights.data() : nullptr, c,
                                              rows.data(), dim, i, d);
          ASSERT_EQ(FloatBits(host[i * dim + d]), FloatBits(e)) << i << " " << d;
        }
      }
    }
  }
}

// Rows given by address (a StepMerger's rows, in gRPC's buffers): any
// alignment, any order in memory; the same bits as from contiguous rows.
TEST_P(PoolingDimTest, PoolingFromRowAddressesAtAnyAlignmentEqualsPoolingFromContiguousRows) {
  std::mt19937 rng(21);
  const uint32_t dim = GetParam();
  const uint32_t unique = 30;
  const size_t row_bytes = size_t{dim} * sizeof(float);
  std::vector<float> rows(unique * dim);
  for (float& v : rows) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  // The same rows in a byte buffer, shuffled, each at an odd offset.
  std::vector<uint32_t> place(unique);
  std::iota(place.begin(), place.end(), 0u);
  std::shuffle(place.begin(), place.end(), rng);
  std::vector<char> bytes(unique * (row_bytes + 3) + 1);
  std::vector<const char*> at(unique);
  for (uint32_t u = 0; u < unique; ++u) {
    char* dst = bytes.data() + 1 + place[u] * (row_bytes + 3);
    memcpy(dst, rows.data() + size_t{u} * dim, row_bytes);
    at[u] = dst;
  }
  std::vector<int64_t> offsets = {0};
  std::vector<uint32_t> inverse;
  std::vector<float> weights;
  for (int i = 0; i < 25; ++i) {
    const int ids = static_cast<int>(rng() % 5);  // some examples empty
    for (int k = 0; k < ids; ++k) {
      inverse.push_back(rng() % unique);
      weights.push_back(std::uniform_real_distribution<float>(0.1f, 2)(rng));
    }
    offsets.push_back(static_cast<int64_t>(inverse.size()));
  }
  for (Combiner c : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtN}) {
    for (bool weighted : {false, true}) {
      absl::Span<const float> w = weighted ? absl::Span<const float>(weights)
                                           : absl::Span<const float>();
      std::vector<float> contiguous(25 * dim), addressed(25 * dim, 99.0f);
      PoolForward(offsets, inverse, w, c, rows.data(), dim, contiguous.data());
      PoolForwardAt(offsets, inverse, w, c, at.data(), dim, addressed.data());
      for (size_t k = 0; k < contiguous.size(); ++k) {
        ASSERT_EQ(FloatBits(addressed[k]), FloatBits(contiguous[k])) << k;
      }
    }
  }
}

// The backward pass adds each id's term in example order, as the device's
// scatter does; the same sums, element by element, written out here.
TEST_P(PoolingDimTest, BackwardMatchesTheElementWiseSumsBitForBit) {
  std::mt19937 rng(13);
  const uint32_t dim = GetParam();
  const int batch = 30, unique = 12;
  std::vector<int64_t> offsets = {0};
  std::vector<uint32_t> inverse;
  std::vector<float> weights;
  for (int i = 0; i < batch; ++i) {
    const int ids = static_cast<int>(rng() % 6);
    for (int k = 0; k < ids; ++k) {
      inverse.push_back(rng() % unique);  // duplicates across examples
      weights.push_back(std::uniform_real_distribution<float>(0.1f, 2)(rng));
    }
    offsets.push_back(static_cast<int64_t>(inverse.size()));
  }
  std::vector<float> d_pooled(batch * dim);
  for (float& v : d_pooled) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (Combiner c : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtN}) {
    for (bool weighted : {false, true}) {
      const float* w = weighted ? weights.data() : nullptr;
      std::vector<float> d_rows(unique * dim, 0.5f), expected(unique * dim, 0.5f);
      PoolBackward(offsets, inverse,
                   weighted ? absl::Span<const float>(weights) : absl::Span<const float>(), c,
                   d_pooled.data(), dim, d_rows.data());
      for (int i = 0; i < batch; ++i) {
        const float scale = pool::CombinerScale(w, offsets[i], offsets[i + 1], c);
        for (int64_t j = offsets[i]; j < offsets[i + 1]; ++j) {
          const float coef = pool::BackwardCoefficient(w, j, scale);
          for (uint32_t d = 0; d < dim; ++d) {
            expected[inverse[j] * dim + d] += coef * d_pooled[i * dim + d];
          }
        }
      }
      for (size_t k = 0; k < expected.size(); ++k) {
        ASSERT_EQ(FloatBits(d_rows[k]), FloatBits(expected[k])) << k;
      }
    }
  }
}

// Two features of one table into rows that were never zeroed (NaN here):
// rows are written on first touch, skipped rows zeroed, and the result is
// PoolBackward's into zeroed rows, bit for bit, in first-occurrence order
// (as deduplication numbers ids) and in any other.
TEST_P(PoolingDimTest, BackwardIntoUnzeroedRowsEqualsBackwardIntoZeroedRows) {
  std::mt19937 rng(21);
  const uint32_t dim = GetParam();
  const int batch = 25;
  const uint32_t unique = 16;  // the last rows are never touched
  for (bool first_occurrence_order : {true, false}) {
    std::vector<std::vector<int64_t>> offsets(2, {0});
    std::vector<std::vector<uint32_t>> inverse(2);
    std::vector<std::vector<float>> d_pooled(2, std::vector<float>(batch * dim));
    uint32_t next = 0;
    for (int f = 0; f < 2; ++f) {
      for (int i = 0; i < batch; ++i) {
        const int ids = static_cast<int>(rng() % 4);
        for (int k = 0; k < ids; ++k) {
          uint32_t u = rng() % (unique - 2);
          if (first_occurrence_order && u > next) u = next;
          next = std::max(next, u + 1);
          inverse[f].push_back(u);
        }
        offsets[f].push_back(static_cast<int64_t>(inverse[f].size()));
      }
      for (float& v : d_pooled[f]) v = std::uniform_real_distribution<float>(-1, 1)(rng);
      for (uint32_t d = 0; d < dim; d += 4) d_pooled[f][d] = -0.0f;
    }
    for (Combiner c : {Combiner::kSum, Combiner::kMean}) {
      std::vector<float> expected(unique * dim, 0.0f);
      std::vector<float> got(unique * dim, std::numeric_limits<float>::quiet_NaN());
      uint32_t written = 0;
      for (int f = 0; f < 2; ++f) {
        PoolBackward(offsets[f], inverse[f], {}, c, d_pooled[f].data(), dim, expected.data());
        PoolBackwardInto(offsets[f], inverse[f], {}, c, d_pooled[f].data(), dim, got.data(),
                         &written);
      }
      ASSERT_LE(written, unique - 2);
      std::fill(got.begin() + size_t{written} * dim, got.end(), 0.0f);
      for (size_t k = 0; k < expected.size(); ++k) {
        ASSERT_EQ(FloatBits(got[k]), FloatBits(expected[k]))
            << k << (first_occurrence_order ? " first-occurrence order" : " any order");
      }
    }
  }
}

// A node's gradient sums: each rank's rows added into the merged rows they
// map to, wherever those lie, in rank order, element by element.
TEST_P(PoolingDimTest, ScatterAddRowsAddsEachRowIntoItsTargetBitForBit) {
  std::mt19937 rng(17);
  const uint32_t dim = GetParam();
  const uint32_t merged = 20;
  std::vector<float> sums(merged * dim), expected(merged * dim);
  for (size_t k = 0; k < sums.size(); ++k) {
    sums[k] = expected[k] = std::uniform_real_distribution<float>(-1, 1)(rng);
  }
  // Merged row u lies at sums row `place[u]`: any address, not u * dim.
  std::vector<uint32_t> place(merged);
  std::iota(place.begin(), place.end(), 0u);
  std::shuffle(place.begin(), place.end(), rng);
  std::vector<float*> at(merged);
  for (uint32_t u = 0; u < merged; ++u) at[u] = sums.data() + size_t{place[u]} * dim;
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<uint32_t> to;
    for (uint32_t u = 0; u < merged; ++u) {
      if (rng() % 3 != 0) to.push_back(u);  // a rank has some of the merged keys
    }
    std::shuffle(to.begin(), to.end(), rng);
    std::vector<float> rows(to.size() * dim);
    for (float& v : rows) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    ScatterAddRows(to, rows.data(), dim, at.data());
    for (size_t u = 0; u < to.size(); ++u) {
      for (uint32_t d = 0; d < dim; ++d) expected[place[to[u]] * dim + d] += rows[u * dim + d];
    }
  }
  for (size_t k = 0; k < expected.size(); ++k) {
    ASSERT_EQ(FloatBits(sums[k]), FloatBits(expected[k])) << k;
  }
}

// The merger's sums are not zeroed: each row's first term is written, with
// the bits of adding it into zeros (-0 comes out +0), whatever was there.
TEST_P(PoolingDimTest, ScatterAddRowsIntoFreshRowsEqualsScatterIntoZeros) {
  std::mt19937 rng(23);
  const uint32_t dim = GetParam();
  const uint32_t merged = 20;
  std::vector<float> zeroed(merged * dim, 0.0f);
  std::vector<float> garbage(merged * dim, std::numeric_limits<float>::quiet_NaN());
  std::vector<float*> at_zeroed(merged), at_garbage(merged);
  for (uint32_t u = 0; u < merged; ++u) {
    at_zeroed[u] = zeroed.data() + size_t{u} * dim;
    at_garbage[u] = garbage.data() + size_t{u} * dim;
  }
  std::vector<uint8_t> fresh(merged, 1);
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<uint32_t> to;
    for (uint32_t u = 0; u < merged; ++u) {
      if (rank == 2 || rng() % 2 == 0) to.push_back(u);  // the last rank has every key
    }
    std::shuffle(to.begin(), to.end(), rng);
    std::vector<float> rows(to.size() * dim);
    for (float& v : rows) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    rows[0] = -0.0f;
    ScatterAddRows(to, rows.data(), dim, at_zeroed.data());
    ScatterAddRows(to, rows.data(), dim, at_garbage.data(), fresh.data());
  }
  for (uint8_t f : fresh) EXPECT_EQ(f, 0);
  for (size_t k = 0; k < zeroed.size(); ++k) {
    ASSERT_EQ(FloatBits(garbage[k]), FloatBits(zeroed[k])) << k;
  }
}

}  // namespace
}  // namespace ember
