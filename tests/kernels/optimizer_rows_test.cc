// The row updates (kernels/optimizer_rows.h) run a vectorised clone
// (common/vector_dispatch.h); each must give exactly the per-element
// optimizer's bits, for lengths below, at and above the vector widths. This
// checks the clone this CPU runs (printed).
#include "kernels/optimizer_rows.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/vector_dispatch.h"
#include "gtest/gtest.h"
#include "kernels/optimizer_math.h"

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

TEST(OptimizerRowsTest, RowUpdatesAreBitIdenticalToPerElementSteps) {
  std::printf("vector clone on this CPU: %s\n", VectorIsa());
  std::mt19937 rng(21);
  OptimizerConfig c;
  c.learning_rate = 0.05f;
  c.epsilon = 1e-6f;
  c.l1 = 0.02f;  // some FTRL weights end exactly at 0, others not
  c.l2 = 0.01f;
  for (size_t n : {1, 7, 8, 15, 16, 17, 33, 64, 128, 257}) {
    for (int round = 0; round < 5; ++round) {
      const std::vector<float> g = Random(rng, n, -1, 1);
      std::vector<float> w = Random(rng, n, -1, 1), s1 = Random(rng, n, 0.1f, 2),
                         s2 = Random(rng, n, 0.1f, 2);
      {
        std::vector<float> rw = w;
        for (size_t j = 0; j < n; ++j) Sgd(c, g[j], rw[j]);
        std::vector<float> vw = w;
        SgdRow(c, g.data(), vw.data(), n);
        ExpectSameBits(vw, rw, "sgd w");
      }
      {
        std::vector<float> rw = w, ra = s1;
        for (size_t j = 0; j < n; ++j) Adagrad(c, g[j], rw[j], ra[j]);
        std::vector<float> vw = w, va = s1;
        AdagradRow(c, g.data(), vw.data(), va.data(), n);
        ExpectSameBits(vw, rw, "adagrad w");
        ExpectSameBits(va, ra, "adagrad accumulator");
      }
      {
        const float step = AdamStepSize(c, static_cast<uint32_t>(round + 1));
        std::vector<float> rw = w, rm = s1, rv = s2;
        for (size_t j = 0; j < n; ++j) Adam(c, step, g[j], rw[j], rm[j], rv[j]);
        std::vector<float> vw = w, vm = s1, vv = s2;
        AdamRow(c, step, g.data(), vw.data(), vm.data(), vv.data(), n);
        ExpectSameBits(vw, rw, "adam w");
        ExpectSameBits(vm, rm, "adam m");
        ExpectSameBits(vv, rv, "adam v");
      }
      {
        std::vector<float> z = Random(rng, n, -0.05f, 0.05f);
        std::vector<float> rw = w, rz = z, rn = s2;
        for (size_t j = 0; j < n; ++j) Ftrl(c, g[j] * 0.01f, rw[j], rz[j], rn[j]);
        std::vector<float> small(n);
        for (size_t j = 0; j < n; ++j) small[j] = g[j] * 0.01f;
        std::vector<float> vw = w, vz = z, vn = s2;
        FtrlRow(c, small.data(), vw.data(), vz.data(), vn.data(), n);
        ExpectSameBits(vw, rw, "ftrl w");
        ExpectSameBits(vz, rz, "ftrl z");
        ExpectSameBits(vn, rn, "ftrl n");
      }
    }
  }
}

}  // namespace
}  // namespace ember::opt
