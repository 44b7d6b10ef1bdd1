// Store micro-benchmark (WORKLOAD.md item 1): find, find-or-insert and
// apply-gradients (Adagrad) rows/s of Ember's CpuStore, side by side in one
// run with a plain-array gather (the memory limit) and a naive
// absl::flat_hash_map behind one mutex. Candidates alternate within each
// round; the table prints medians over the rounds and the ratios.
//
//   build/bench/store_bench                       # the full table
//   build/bench/store_bench --dims=8 --fills=0.5  # the headline case
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/baselines.h"
#include "bench/bench_util.h"
#include "common/key_hash.h"
#include "kernels/cpu/cpu_store.h"

ABSL_FLAG(std::string, dims, "8,32,128", "Row dimensions to measure.");
ABSL_FLAG(int64_t, rows, 10'000'000, "Rows stored (fewer for large dims, see memory_budget_gb).");
ABSL_FLAG(std::string, fills, "0.5,0.9", "Stored rows as a fraction of the table capacity.");
ABSL_FLAG(std::string, threads, "1,2", "Thread counts.");
ABSL_FLAG(int, batch, 65536, "Keys per call.");
ABSL_FLAG(int, batches, 16, "Calls per thread per measurement.");
ABSL_FLAG(int, rounds, 5, "Alternating rounds; medians are reported.");
ABSL_FLAG(double, memory_budget_gb, 12.0, "Memory for all three candidates together.");
ABSL_FLAG(uint64_t, seed, 42, "Seed of the keys and the query stream.");
ABSL_FLAG(std::string, ops, "find,find_or_insert,apply_adagrad", "Operations to measure.");

namespace ember::bench {
namespace {

using Clock = std::chrono::steady_clock;

size_t HeapBytes() {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

// Runs fn(thread, batch_index) on `threads` threads; returns rows per second.
template <typename Fn>
double Measure(int threads, int batches, int batch, Fn fn) {
  auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int b = 0; b < batches; ++b) fn(t, b);
    });
  }
  for (auto& th : pool) th.join();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  return double(threads) * batches * batch / secs;
}

TableConfig EmberConfig(uint32_t dim, uint64_t capacity) {
  TableConfig c;
  c.name = "bench";
  c.dim = dim;
  c.initializer.kind = InitializerKind::kUniform;
  c.initializer.min = -0.01f;
  c.initializer.max = 0.01f;
  c.optimizer.kind = OptimizerKind::kAdagrad;
  c.optimizer.learning_rate = 0.01f;
  c.optimizer.initial_accumulator = 0.1f;
  c.capacity = capacity;
  c.eviction = EvictionPolicy::kLru;
  return c;
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "store error: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

void RunConfig(uint32_t dim, size_t rows, double fill, const std::vector<double>& thread_counts) {
  const int batch = absl::GetFlag(FLAGS_batch);
  const int batches = absl::GetFlag(FLAGS_batches);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const int max_threads = static_cast<int>(*std::max_element(thread_counts.begin(), thread_counts.end()));
  const uint64_t capacity = static_cast<uint64_t>(rows / fill);
  auto key_of = [seed](uint64_t i) { return Mix64(i ^ seed); };

  // Fill all three, timing the inserts and measuring their heap.
  std::vector<uint64_t> keys(batch), idx(batch);
  std::vector<float> out(size_t(batch) * dim * max_threads);
  size_t heap0 = HeapBytes();
  auto store = CpuStore::Create(EmberConfig(dim, capacity));
  Check(store.status());
  auto t0 = Clock::now();
  for (size_t i = 0; i < rows; i += batch) {
    const size_t n = std::min<size_t>(batch, rows - i);
    for (size_t j = 0; j < n; ++j) keys[j] = key_of(i + j);
    Check((*store)->FindOrInsert(absl::MakeSpan(keys.data(), n), DType::kFp32,
                                 {reinterpret_cast<uint8_t*>(out.data()), n * dim * 4}).status());
  }
  const double ember_insert = rows / std::chrono::duration<double>(Clock::now() - t0).count();
  const size_t ember_heap = HeapBytes() - heap0;
  const StoreStats st = (*store)->Stats();

  heap0 = HeapBytes();
  NaiveMap naive(dim);
  t0 = Clock::now();
  for (size_t i = 0; i < rows; i += batch) {
    const size_t n = std::min<size_t>(batch, rows - i);
    for (size_t j = 0; j < n; ++j) keys[j] = key_of(i + j);
    naive.FindOrInsert(absl::MakeSpan(keys.data(), n), out.data());
  }
  const double naive_insert = rows / std::chrono::duration<double>(Clock::now() - t0).count();
  const size_t naive_heap = HeapBytes() - heap0;
  heap0 = HeapBytes();
  PlainArray plain(rows, dim);
  const size_t plain_heap = HeapBytes() - heap0;

  // The query stream: uniform over the stored rows, fixed by the seed.
  const size_t pool = size_t(max_threads) * batches * batch;
  std::vector<uint64_t> q_rows(pool), q_keys(pool);
  std::mt19937_64 rng(seed + dim);
  for (size_t i = 0; i < pool; ++i) {
    q_rows[i] = rng() % rows;
    q_keys[i] = key_of(q_rows[i]);
  }
  std::vector<float> grads(size_t(batch) * dim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.001f * float(int(i % 17) - 8);
  const absl::Span<const uint8_t> grad_bytes(reinterpret_cast<const uint8_t*>(grads.data()),
                                             grads.size() * 4);

  const uint64_t payload = 8 + dim * 4 + dim * 4;  // key + row + Adagrad state
  std::printf("\n# dim %u, %zu rows at %.0f%% of capacity %lu\n", dim, rows, fill * 100,
              static_cast<unsigned long>(capacity));
  std::printf("memory per row: ember %.1f B (stats %.1f B; overhead beyond key+row+state %.1f B), "
              "naive %.1f B, plain %.1f B; key+row+state %lu B\n",
              double(ember_heap) / rows, double(st.memory_bytes) / rows,
              double(st.memory_bytes) / rows - payload, double(naive_heap) / rows,
              double(plain_heap) / rows, static_cast<unsigned long>(payload));
  std::printf("insert (fill, 1 thread): ember %.2f M rows/s, naive %.2f M rows/s, ratio %.2fx\n",
              ember_insert / 1e6, naive_insert / 1e6, ember_insert / naive_insert);
  std::printf("%-15s %7s %14s %14s %14s %11s %11s\n", "op", "threads", "ember Mrows/s",
              "naive Mrows/s", "plain Mrows/s", "ember/naive", "ember/plain");

  enum Op { kFind, kFindOrInsert, kApply };
  const char* names[] = {"find", "find_or_insert", "apply_adagrad"};
  const std::string ops = absl::GetFlag(FLAGS_ops);
  for (Op op : {kFind, kFindOrInsert, kApply}) {
    if (ops.find(names[op]) == std::string::npos) continue;
    for (double tc : thread_counts) {
      const int threads = static_cast<int>(tc);
      std::vector<double> e, n, p;
      for (int r = 0; r < rounds; ++r) {
        auto slice = [&](int t, int b) { return (size_t(t) * batches + b) * batch; };
        auto out_of = [&](int t) { return out.data() + size_t(t) * batch * dim; };
        e.push_back(Measure(threads, batches, batch, [&](int t, int b) {
          absl::Span<const uint64_t> k(q_keys.data() + slice(t, b), batch);
          absl::Span<uint8_t> o(reinterpret_cast<uint8_t*>(out_of(t)), size_t(batch) * dim * 4);
          switch (op) {
            case kFind: Check((*store)->Find(k, DType::kFp32, o).status()); break;
            case kFindOrInsert: Check((*store)->FindOrInsert(k, DType::kFp32, o).status()); break;
            case kApply: Check((*store)->ApplyGradients(k, DType::kFp32, grad_bytes).status()); break;
          }
        }));
        n.push_back(Measure(threads, batches, batch, [&](int t, int b) {
          absl::Span<const uint64_t> k(q_keys.data() + slice(t, b), batch);
          switch (op) {
            case kFind: naive.Find(k, out_of(t)); break;
            case kFindOrInsert: naive.FindOrInsert(k, out_of(t)); break;
            case kApply: naive.Adagrad(k, grads.data(), 0.01f); break;
          }
        }));
        p.push_back(Measure(threads, batches, batch, [&](int t, int b) {
          absl::Span<const uint64_t> k(q_rows.data() + slice(t, b), batch);
          // Racy for apply with 2 threads, as a lock-free array would be: a bound, not a peer.
          if (op == kApply) {
            plain.Adagrad(k, grads.data(), 0.01f);
          } else {
            plain.Gather(k, out_of(t));
          }
        }));
      }
      const double me = Median(e), mn = Median(n), mp = Median(p);
      std::printf("%-15s %7d %14.2f %14.2f %14.2f %10.2fx %10.0f%%\n", names[op], threads, me / 1e6,
                  mn / 1e6, mp / 1e6, me / mn, 100.0 * me / mp);
    }
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace ember::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const auto dims = ember::bench::ParseList(absl::GetFlag(FLAGS_dims));
  const auto fills = ember::bench::ParseList(absl::GetFlag(FLAGS_fills));
  const auto threads = ember::bench::ParseList(absl::GetFlag(FLAGS_threads));
  const double budget = absl::GetFlag(FLAGS_memory_budget_gb) * (1ull << 30);
  std::printf("store_bench: %u hardware threads, seed %lu, batch %d keys, %d batches/thread, "
              "%d rounds (medians), Adagrad fp32\n",
              std::thread::hardware_concurrency(),
              static_cast<unsigned long>(absl::GetFlag(FLAGS_seed)), absl::GetFlag(FLAGS_batch),
              absl::GetFlag(FLAGS_batches), absl::GetFlag(FLAGS_rounds));
  for (double d : dims) {
    const uint32_t dim = static_cast<uint32_t>(d);
    // Ember record + naive node + plain row and state, roughly, per row.
    const double per_row = (16 + 8.0 * dim) + (80 + 8.0 * dim) + 8.0 * dim;
    const size_t rows = std::min<size_t>(absl::GetFlag(FLAGS_rows), size_t(budget / per_row));
    for (double fill : fills) ember::bench::RunConfig(dim, rows, fill, threads);
  }
  return 0;
}
