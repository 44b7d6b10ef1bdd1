// Does backing memory with transparent huge pages speed up a random row
// gather on this machine? Gathers dim-8 fp32 rows from two equal arrays, one
// madvise(MADV_HUGEPAGE)d, alternating them round by round in one process,
// and prints the medians. docs/design.md cites its result.
//
//   build/bench/hugepage_gather_bench [rows]
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const size_t rows = argc > 1 ? std::stoul(argv[1]) : 10'000'000;
  constexpr size_t kDim = 8, kHuge = size_t{1} << 21;
  const size_t bytes = (rows * kDim * sizeof(float) + kHuge - 1) & ~(kHuge - 1);
  float* arrays[2];
  for (int huge = 0; huge < 2; ++huge) {
    arrays[huge] = static_cast<float*>(std::aligned_alloc(kHuge, bytes));
    if (huge && madvise(arrays[huge], bytes, MADV_HUGEPAGE) != 0) std::perror("madvise");
    for (size_t i = 0; i < rows * kDim; ++i) arrays[huge][i] = static_cast<float>(i);
  }
  std::mt19937_64 rng(42);
  const size_t n = size_t{1} << 21;
  std::vector<uint32_t> idx(n);
  for (auto& x : idx) x = static_cast<uint32_t>(rng() % rows);
  std::vector<float> out(65536 * kDim);
  std::vector<double> ns[2];
  for (int round = 0; round < 9; ++round) {
    for (int huge = 0; huge < 2; ++huge) {
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t i = 0; i < n; ++i) {
        std::memcpy(&out[(i & 65535) * kDim], &arrays[huge][size_t(idx[i]) * kDim], 32);
      }
      ns[huge].push_back(
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n);
    }
  }
  std::printf("hugepage_gather_bench: %zu rows of dim %zu, seed 42, 9 alternating rounds\n", rows, kDim);
  for (int huge = 0; huge < 2; ++huge) {
    std::sort(ns[huge].begin(), ns[huge].end());
    std::printf("  %-22s median %.1f ns/row\n", huge ? "MADV_HUGEPAGE" : "default pages",
                ns[huge][ns[huge].size() / 2]);
  }
  std::printf("  (AnonHugePages in /proc/meminfo shows whether the kernel granted huge pages)\n");
  std::free(arrays[0]);
  std::free(arrays[1]);
  return 0;
}
