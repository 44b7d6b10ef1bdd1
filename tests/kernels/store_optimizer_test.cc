// Optimizer updates over several pushes, checked against reference values the
// test computes itself in double precision from the published update rules.
#include <cmath>
#include <vector>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/initializer_math.h"
#include "kernels/row_policy.h"
#include "tests/kernels/store_implementations.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

constexpr uint32_t kDim = 3;

// Reference state of one row, in double.
struct RefRow {
  double w[kDim];
  double s0[kDim] = {};  // acc | m | z
  double s1[kDim] = {};  // v | n
  int t = 0;
};

RefRow InitialRef(const TableConfig& c, uint64_t key) {
  RefRow r;
  float row[kDim];
  init::InitialRow(c.initializer, key, kDim, DType::kFp32, row);
  for (uint32_t j = 0; j < kDim; ++j) {
    r.w[j] = row[j];
    if (c.optimizer.kind == OptimizerKind::kAdagrad || c.optimizer.kind == OptimizerKind::kRmsProp) {
      r.s0[j] = c.optimizer.initial_accumulator;
    }
    if (c.optimizer.kind == OptimizerKind::kFtrl) r.s1[j] = c.optimizer.initial_accumulator;
  }
  return r;
}

void RefStep(const OptimizerConfig& o, const double* g, RefRow& r) {
  const double lr = o.learning_rate;
  ++r.t;
  for (uint32_t j = 0; j < kDim; ++j) {
    switch (o.kind) {
      case OptimizerKind::kSgd: r.w[j] -= lr * g[j]; break;
      case OptimizerKind::kAdagrad:
        r.s0[j] += g[j] * g[j];
        r.w[j] -= lr * g[j] / (std::sqrt(r.s0[j]) + o.epsilon);
        break;
      case OptimizerKind::kAdam: {
        const double b1 = o.beta1, b2 = o.beta2;
        r.s0[j] = b1 * r.s0[j] + (1 - b1) * g[j];
        r.s1[j] = b2 * r.s1[j] + (1 - b2) * g[j] * g[j];
        const double lr_t = lr * std::sqrt(1 - std::pow(b2, r.t)) / (1 - std::pow(b1, r.t));
        r.w[j] -= lr_t * r.s0[j] / (std::sqrt(r.s1[j]) + o.epsilon);
        break;
      }
      case OptimizerKind::kRmsProp:
        r.s0[j] = o.rho * r.s0[j] + (1 - o.rho) * g[j] * g[j];
        r.w[j] -= lr * g[j] / (std::sqrt(r.s0[j]) + o.epsilon);
        break;
      case OptimizerKind::kFtrl: {
        const double n_new = r.s1[j] + g[j] * g[j];
        const double sigma = (std::sqrt(n_new) - std::sqrt(r.s1[j])) / lr;
        r.s0[j] += g[j] - sigma * r.w[j];
        r.s1[j] = n_new;
        const double z = r.s0[j];
        r.w[j] = std::abs(z) <= o.l1
                     ? 0.0
                     : -(z - (z < 0 ? -1 : 1) * o.l1) / ((o.ftrl_beta + std::sqrt(n_new)) / lr + o.l2);
        break;
      }
    }
  }
}

template <typename Factory>
class StoreOptimizerTest : public StoreTestBase<Factory> {
 protected:
  // Pushes 6 steps: key A every step (twice in step 2, summed), key B on odd
  // steps only (so lazy per-row step counts differ), then compares.
  void RunAndCompare(const TableConfig& c, double tolerance) {
    auto store = this->MakeStore(c);
    const uint64_t a = 1001, b = 0;
    RefRow ra = InitialRef(c, a), rb = InitialRef(c, b);
    for (int step = 0; step < 6; ++step) {
      std::vector<uint64_t> keys;
      std::vector<float> grads;
      auto grad_for = [&](uint64_t key, int k) {
        keys.push_back(key);
        for (uint32_t j = 0; j < kDim; ++j) {
          grads.push_back(0.3f * static_cast<float>((step + 1) * (j + 1) * (k + 1) % 7) - 0.9f);
        }
      };
      grad_for(a, 0);
      if (step == 2) grad_for(a, 1);
      if (step % 2 == 1) grad_for(b, 0);
      ASSERT_OK(store->ApplyGradients(keys, DType::kFp32, Bytes(grads)));
      double ga[kDim] = {}, gb[kDim] = {};
      for (size_t i = 0; i < keys.size(); ++i) {
        for (uint32_t j = 0; j < kDim; ++j) (keys[i] == a ? ga : gb)[j] += grads[i * kDim + j];
      }
      RefStep(c.optimizer, ga, ra);
      if (step % 2 == 1) RefStep(c.optimizer, gb, rb);
    }
    std::vector<float> rows(2 * kDim);
    ASSERT_OK(store->Find({{a, b}}, DType::kFp32, MutableBytes(rows)));
    for (uint32_t j = 0; j < kDim; ++j) {
      EXPECT_NEAR(rows[j], ra.w[j], tolerance) << OptimizerName(c.optimizer.kind) << " key a " << j;
      EXPECT_NEAR(rows[kDim + j], rb.w[j], tolerance)
          << OptimizerName(c.optimizer.kind) << " key b " << j;
    }
    // The update actually moved the rows (a reference that cannot fail is no reference).
    EXPECT_GT(std::abs(rows[0] - InitialRef(c, a).w[0]), 1e-4);
  }

  static TableConfig Base(OptimizerKind kind) {
    TableConfig c = SmallTable(kDim);
    c.initializer.kind = InitializerKind::kNormal;
    c.initializer.mean = 0.0f;
    c.initializer.stddev = 0.1f;
    c.optimizer.kind = kind;
    c.optimizer.learning_rate = 0.05f;
    return c;
  }
};
TYPED_TEST_SUITE(StoreOptimizerTest, StoreImplementations, StoreImplementationNames);

TYPED_TEST(StoreOptimizerTest, SgdMatchesReferenceOverSixSteps) {
  this->RunAndCompare(this->Base(OptimizerKind::kSgd), 1e-6);
}

TYPED_TEST(StoreOptimizerTest, AdagradMatchesReferenceOverSixSteps) {
  TableConfig c = this->Base(OptimizerKind::kAdagrad);
  c.optimizer.initial_accumulator = 0.1f;
  c.optimizer.epsilon = 1e-7f;
  this->RunAndCompare(c, 1e-6);
}

TYPED_TEST(StoreOptimizerTest, AdamWithPerRowStepCountMatchesReferenceOverSixSteps) {
  TableConfig c = this->Base(OptimizerKind::kAdam);
  c.optimizer.beta1 = 0.9f;
  c.optimizer.beta2 = 0.999f;
  c.optimizer.epsilon = 1e-8f;
  this->RunAndCompare(c, 1e-5);
}

TYPED_TEST(StoreOptimizerTest, FtrlProximalMatchesReferenceOverSixSteps) {
  TableConfig c = this->Base(OptimizerKind::kFtrl);
  c.optimizer.ftrl_beta = 1.0f;
  c.optimizer.l1 = 0.05f;
  c.optimizer.l2 = 0.01f;
  c.optimizer.initial_accumulator = 0.1f;
  this->RunAndCompare(c, 1e-5);
}

TYPED_TEST(StoreOptimizerTest, RmsPropMatchesReferenceOverSixSteps) {
  TableConfig c = this->Base(OptimizerKind::kRmsProp);
  c.optimizer.rho = 0.8f;
  c.optimizer.initial_accumulator = 0.0f;  // Keras' start: the first step is lr / sqrt(1 - rho)
  c.optimizer.epsilon = 1e-7f;
  this->RunAndCompare(c, 1e-5);
}

TYPED_TEST(StoreOptimizerTest, FtrlWithStrongL1DrivesWeightsToExactlyZero) {
  TableConfig c = this->Base(OptimizerKind::kFtrl);
  c.optimizer.l1 = 100.0f;
  auto store = this->MakeStore(c);
  ASSERT_OK(store->ApplyGradients({{3}}, DType::kFp32, Bytes(std::vector<float>(kDim, 0.5f))));
  std::vector<float> row(kDim);
  ASSERT_OK(store->Find({{3}}, DType::kFp32, MutableBytes(row)));
  EXPECT_EQ(row, std::vector<float>(kDim, 0.0f));
}

// Element j of a row is a function of its key, j and its gradients alone.
// So, for every optimizer, storage dtype and TTL setting, the leading
// elements of a dim-128 table's rows (the vectorised loops' full-width path)
// match a narrow table's bit for bit, through pushes, erases (which move
// records) and an export into a fresh store.
TYPED_TEST(StoreOptimizerTest, WideRowsEvolveAsNarrowRowsElementForElement) {
  constexpr uint32_t kWide = 128;
  for (OptimizerKind kind : row::kAllOptimizers) {
    for (DType dtype : {DType::kFp32, DType::kFp16}) {
      for (bool ttl : {false, true}) {
        SCOPED_TRACE(absl::StrCat(OptimizerName(kind), " ", DTypeName(dtype), ttl ? " ttl" : ""));
        TableConfig narrow = this->Base(kind);
        narrow.dtype = dtype;
        narrow.optimizer.initial_accumulator = 0.1f;
        if (ttl) narrow.ttl.steps = 1000;
        TableConfig wide = narrow;
        wide.dim = kWide;
        auto n = this->MakeStore(narrow);
        auto w = this->MakeStore(wide);
        std::vector<uint64_t> keys;
        for (uint64_t k = 0; k < 64; ++k) keys.push_back(k * 7919 + 1);
        for (int round = 0; round < 4; ++round) {
          std::vector<float> gn, gw;
          for (size_t i = 0; i < keys.size(); ++i) {
            for (uint32_t j = 0; j < kWide; ++j) {
              const float g = 0.1f * static_cast<float>((round + 1) * (j + 3) * (i + 1) % 11) - 0.5f;
              if (j < kDim) gn.push_back(g);
              gw.push_back(g);
            }
          }
          ASSERT_OK(n->ApplyGradients(keys, DType::kFp32, Bytes(gn)));
          ASSERT_OK(w->ApplyGradients(keys, DType::kFp32, Bytes(gw)));
          if (round == 1) {  // erase keys from the middle: the last records move into the holes
            const std::vector<uint64_t> gone(keys.begin() + 10, keys.begin() + 20);
            ASSERT_OK(n->Erase(gone));
            ASSERT_OK(w->Erase(gone));
          }
        }
        auto copy = this->MakeStore(wide);
        ExportCursor cursor;
        ExportedRows rows;
        while (!cursor.done) {
          ASSERT_OK(w->Export(&cursor, 16, &rows));
          ASSERT_OK(copy->Import(rows));
        }
        std::vector<float> rn(keys.size() * kDim), rw(keys.size() * kWide), rc(rw.size());
        ASSERT_OK(n->Find(keys, DType::kFp32, MutableBytes(rn)));
        ASSERT_OK(w->Find(keys, DType::kFp32, MutableBytes(rw)));
        ASSERT_OK(copy->Find(keys, DType::kFp32, MutableBytes(rc)));
        for (size_t i = 0; i < keys.size(); ++i) {
          for (uint32_t j = 0; j < kDim; ++j) {
            ASSERT_EQ(absl::bit_cast<uint32_t>(rw[i * kWide + j]),
                      absl::bit_cast<uint32_t>(rn[i * kDim + j]))
                << "key " << keys[i] << " element " << j;
          }
        }
        EXPECT_EQ(rc, rw);
        EXPECT_NE(rw[0], InitialRef(wide, keys[0]).w[0]);  // the pushes moved the rows
      }
    }
  }
}

}  // namespace
}  // namespace ember::testing
