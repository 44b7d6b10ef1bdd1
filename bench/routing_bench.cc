// routing_bench: the two routings (common/key_router.h) side by side, in one
// run: nanoseconds per key routed (best of --rounds over --keys keys), the
// share of keys moved going from n to n + 1 shards, and the largest and
// smallest shard's share of the keys. Why the jump routing is the default.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/key_hash.h"
#include "common/key_router.h"

ABSL_FLAG(uint64_t, keys, 1 << 22, "Keys routed per round.");
ABSL_FLAG(int, rounds, 5, "Rounds; the fastest is printed.");

int main(int argc, char** argv) {
  using namespace ember;
  absl::ParseCommandLine(argc, argv);
  const uint64_t n_keys = absl::GetFlag(FLAGS_keys);
  std::vector<uint64_t> keys(n_keys);
  for (uint64_t i = 0; i < n_keys; ++i) keys[i] = Mix64(i + 12345);
  std::printf("routing_bench: %u cores, %llu keys, best of %d rounds\n",
              std::thread::hardware_concurrency(), static_cast<unsigned long long>(n_keys),
              absl::GetFlag(FLAGS_rounds));
  std::printf(
      "| routing | shards | ns per key | moved going to shards + 1 | largest share | "
      "smallest share |\n| --- | --- | --- | --- | --- | --- |\n");
  for (const char* routing : {kRoutingFastrange, kRoutingJump}) {
    for (uint32_t n : {2u, 3u, 5u, 16u, 64u}) {
      const KeyRouter r = *KeyRouter::Make(routing, n);
      const KeyRouter next = *KeyRouter::Make(routing, n + 1);
      double best = 1e30;
      uint64_t sink = 0;
      for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
        const auto start = std::chrono::steady_clock::now();
        for (uint64_t k : keys) sink += r.ShardOf(k);
        const double ns =
            std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
                .count();
        best = std::min(best, ns / n_keys);
      }
      std::vector<uint64_t> count(n);
      uint64_t moved = 0;
      for (uint64_t k : keys) {
        const uint32_t s = r.ShardOf(k);
        ++count[s];
        moved += next.ShardOf(k) != s;
      }
      const auto [lo, hi] = std::minmax_element(count.begin(), count.end());
      std::printf("| %s | %u | %.2f | %.4f (1/(n+1) = %.4f) | %.4f (1/n = %.4f) | %.4f |%s\n",
                  routing, n, best, static_cast<double>(moved) / n_keys, 1.0 / (n + 1),
                  static_cast<double>(*hi) / n_keys, 1.0 / n, static_cast<double>(*lo) / n_keys,
                  sink == 0 ? " " : "");
    }
  }
  // For comparison: jump consistent hashing computed per key.
  for (uint32_t n : {2u, 16u, 64u}) {
    double best = 1e30;
    uint64_t sink = 0;
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      const auto start = std::chrono::steady_clock::now();
      for (uint64_t k : keys) sink += JumpConsistentHash(Mix64(k), n);
      const double ns =
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
              .count();
      best = std::min(best, ns / n_keys);
    }
    std::printf("jump consistent hash per key (no slots), %u shards: %.2f ns per key%s\n", n, best,
                sink == 0 ? " " : "");
  }
  return 0;
}
