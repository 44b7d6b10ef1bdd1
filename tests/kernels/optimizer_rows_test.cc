// The host row update (kernels/optimizer_rows.h) runs a vectorised clone
// (common/vector_dispatch.h) of each optimizer's rule; for every optimizer it
// must give exactly the bits of the rule applied element by element
// (row::UpdateElement, what the CUDA store runs), for lengths below, at and
// above the vector widths. This checks the clone this CPU runs (printed).
#include "kernels/optimizer_rows.h"

#include <cstdio>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/vector_dispatch.h"
#include "gtest/gtest.h"
#include "kernels/row_policy.h"

namespace ember::opt {
namespace {

std::vector<float> Random(std::mt19937& rng, size_t n, float lo, float hi) {
  std::vector<float> v(n);
  for (float& x : v) x = std::uniform_real_distribution<float>(lo, hi)(rng);
  return v;
}

void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(FloatBits(a[i]), FloatBits(b[i])) << what << " element " << i << " of " << a.size();
  }
}

TEST(OptimizerRowsTest, RowUpdatesAreBitIdenticalToPerElementRulesForEveryOptimizer) {
  std::printf("vector clone on this CPU: %s\n", VectorIsa());
  std::mt19937 rng(21);
  for (OptimizerKind kind : row::kAllOptimizers) {
    OptimizerConfig c;
    c.kind = kind;
    c.learning_rate = 0.05f;
    c.epsilon = 1e-6f;
    c.l1 = 0.02f;  // some FTRL weights end exactly at 0, others not
    c.l2 = 0.01f;
    for (size_t n : {1, 7, 8, 15, 16, 17, 33, 64, 128, 257}) {
      uint32_t step = 0;
      for (int round = 0; round < 5; ++round) {
        SCOPED_TRACE(absl::StrCat(OptimizerName(kind), " n ", n, " round ", round));
        // Small gradients, so that FTRL's z stays near l1 and both branches run.
        std::vector<float> g = Random(rng, n, -1, 1);
        for (float& x : g) x *= 0.01f;
        const std::vector<float> w = Random(rng, n, -1, 1);
        std::vector<float> state = Random(rng, 2 * n, 0.1f, 2);
        for (size_t j = 0; j < n; ++j) state[j] = std::uniform_real_distribution<float>(-0.05f, 0.05f)(rng);
        const float step_size = row::AdvanceStep(c, step);

        std::vector<float> rw = w, rs = state;
        row::VisitOptimizer(kind, [&](auto rule) {
          for (size_t j = 0; j < n; ++j) {
            row::UpdateElement<decltype(rule)>(c, step_size, g[j], rw[j], &rs[j], n);
          }
        });
        std::vector<float> vw = w, vs = state;
        UpdateRow(c, step_size, g.data(), vw.data(), vs.data(), n);
        ExpectSameBits(vw, rw, "w");
        ExpectSameBits(vs, rs, "state");
        if (kind != OptimizerKind::kFtrl) {
          EXPECT_NE(vw, w) << "the update moved the row";  // FTRL may zero or keep it
        }
      }
    }
  }
}

}  // namespace
}  // namespace ember::opt
