// The CUDA store with HierarchicalKV's benchmark protocol (WORKLOAD.md item
// 5): uint64 keys, fp32 rows, 1M keys per call, tables at load factor 0.5,
// 0.75 and 1.0 of their capacity, keys and rows already in device memory.
// Prints billions of rows per second (median of --reps calls) for:
//   find            1M stored keys, uniform over the stored ones;
//   find_or_insert  1M keys, half stored, half never seen (at load factor
//                   1.0 each new key evicts the bucket's LRU row);
//   push            ApplyGradients of 1M stored keys, dim --push_dim, with
//                   the table's optimizer (dedup, sum, update fused in one call);
// and, for the same find, the host-memory API (keys and rows through PCIe).
// Needs a GPU; run by scripts/device_check.sh.
#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_util.h"
#include "common/key_hash.h"
#include "kernels/cuda/cuda_store.h"
#include "kernels/cuda/device_query.h"

ABSL_FLAG(uint64_t, capacity, uint64_t{64} << 20, "Rows per table (HierarchicalKV: 64M).");
ABSL_FLAG(uint64_t, keys_per_call, uint64_t{1} << 20, "Keys per call (HierarchicalKV: 1M).");
ABSL_FLAG(uint32_t, dim, 8, "Row width for find and find_or_insert.");
ABSL_FLAG(uint32_t, push_dim, 32, "Row width for push.");
ABSL_FLAG(std::string, optimizer, "adagrad", "Push optimizer: sgd or adagrad.");
ABSL_FLAG(std::string, load_factors, "0.5,0.75,1.0", "Load factors to measure at.");
ABSL_FLAG(int, reps, 7, "Timed calls per figure; the median is printed.");
ABSL_FLAG(uint64_t, seed, 42, "Seed of the key streams.");

namespace ember {
namespace {

#define CHECK_CUDA(call)                                                          \
  do {                                                                            \
    cudaError_t e = (call);                                                       \
    if (e != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e));             \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

template <typename T>
T Check(absl::StatusOr<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, r.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*r);
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Stored keys are Mix64(i) for i < stored; fresh ones Mix64(i) beyond.
struct DeviceKeys {
  explicit DeviceKeys(size_t n) : n(n) { CHECK_CUDA(cudaMalloc(&ptr, n * 8)); }
  ~DeviceKeys() { cudaFree(ptr); }
  void Upload(const std::vector<uint64_t>& keys) {
    CHECK_CUDA(cudaMemcpy(ptr, keys.data(), keys.size() * 8, cudaMemcpyHostToDevice));
  }
  size_t n;
  uint64_t* ptr = nullptr;
};

TableConfig Table(uint64_t capacity, uint32_t dim, OptimizerKind opt) {
  TableConfig c;
  c.name = "bench";
  c.dim = dim;
  c.capacity = capacity;
  c.eviction = EvictionPolicy::kLru;
  c.initializer.kind = InitializerKind::kUniform;
  c.initializer.min = -0.05f;
  c.initializer.max = 0.05f;
  c.optimizer.kind = opt;
  return c;
}

// Fills keys [0, target) in calls of `per_call`.
void Fill(CudaStore& store, uint64_t target, size_t per_call, DeviceKeys& dk, void* out) {
  std::vector<uint64_t> keys;
  for (uint64_t at = 0; at < target; at += per_call) {
    keys.clear();
    for (uint64_t i = at; i < std::min<uint64_t>(target, at + per_call); ++i) keys.push_back(Mix64(i));
    dk.Upload(keys);
    Check(store.FindOnDevice(dk.ptr, keys.size(), DType::kFp32, out, nullptr, true), "fill");
  }
}

template <typename Fn>
double MedianRate(int reps, size_t n, Fn fn) {
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn(r);
    rates.push_back(n / Seconds(start) / 1e9);
  }
  return bench::Median(rates);
}

int Main() {
  if (cuda::DeviceCount() == 0) {
    std::fprintf(stderr, "gpu_store_bench: no CUDA device here\n");
    return 2;
  }
  const uint64_t capacity = absl::GetFlag(FLAGS_capacity);
  const size_t n = absl::GetFlag(FLAGS_keys_per_call);
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  const uint32_t push_dim = absl::GetFlag(FLAGS_push_dim);
  const int reps = absl::GetFlag(FLAGS_reps);
  const OptimizerKind opt =
      absl::GetFlag(FLAGS_optimizer) == "sgd" ? OptimizerKind::kSgd : OptimizerKind::kAdagrad;
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  std::printf("device: %s\n", cuda::DeviceDescription(0).c_str());
  std::printf("protocol: capacity %llu rows, %zu keys per call, dim %u (push dim %u, %s), "
              "median of %d calls, seed %llu\n",
              static_cast<unsigned long long>(capacity), n, dim, push_dim,
              absl::GetFlag(FLAGS_optimizer).c_str(), reps,
              static_cast<unsigned long long>(absl::GetFlag(FLAGS_seed)));
  std::printf("| load factor | find B rows/s | find_or_insert B rows/s | push B rows/s (dim %u) | "
              "find via host memory B rows/s |\n|---|---|---|---|---|\n",
              push_dim);

  DeviceKeys dk(n);
  void* out = nullptr;
  void* grads = nullptr;
  uint8_t* found = nullptr;
  CHECK_CUDA(cudaMalloc(&out, n * std::max(dim, push_dim) * 4));
  CHECK_CUDA(cudaMalloc(&grads, n * push_dim * 4));
  CHECK_CUDA(cudaMalloc(&found, n));
  CHECK_CUDA(cudaMemset(grads, 0, n * push_dim * 4));  // zero gradients: rows stay put
  std::vector<uint64_t> keys(n);
  std::vector<float> host_out(n * dim);

  for (double lf : bench::ParseList(absl::GetFlag(FLAGS_load_factors))) {
    const uint64_t stored = static_cast<uint64_t>(lf * capacity);
    double find = 0, foi = 0, push = 0, host_find = 0;
    {
      auto store = Check(CudaStore::Create(Table(capacity, dim, OptimizerKind::kSgd), 0), "create");
      Fill(*store, stored, n, dk, out);
      for (uint64_t& k : keys) k = Mix64(rng() % stored);
      dk.Upload(keys);
      find = MedianRate(reps, n, [&](int) {
        Check(store->FindOnDevice(dk.ptr, n, DType::kFp32, out, found, false), "find");
      });
      host_find = MedianRate(reps, n, [&](int) {
        Check(store->Find(keys, DType::kFp32,
                          absl::MakeSpan(reinterpret_cast<uint8_t*>(host_out.data()),
                                         host_out.size() * 4)),
              "host find");
      });
      // One batch per call, uploaded before the clock starts.
      uint64_t fresh = capacity + 1;  // never stored
      std::vector<std::unique_ptr<DeviceKeys>> batches;
      for (int r = 0; r < reps; ++r) {
        for (size_t i = 0; i < n; ++i) keys[i] = i % 2 ? Mix64(rng() % stored) : Mix64(fresh++);
        batches.push_back(std::make_unique<DeviceKeys>(n));
        batches.back()->Upload(keys);
      }
      foi = MedianRate(reps, n, [&](int r) {
        Check(store->FindOnDevice(batches[r]->ptr, n, DType::kFp32, out, nullptr, true),
              "find_or_insert");
      });
    }
    {
      auto store = Check(CudaStore::Create(Table(capacity, push_dim, opt), 0), "create");
      Fill(*store, stored, n, dk, out);
      for (uint64_t& k : keys) k = Mix64(rng() % stored);
      dk.Upload(keys);
      push = MedianRate(reps, n, [&](int) {
        Check(store->ApplyGradientsOnDevice(dk.ptr, n, DType::kFp32, grads), "push");
      });
    }
    std::printf("| %.2f | %.3f | %.3f | %.3f | %.3f |\n", lf, find, foi, push, host_find);
    std::fflush(stdout);
  }
  cudaFree(out);
  cudaFree(grads);
  cudaFree(found);
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ember::Main();
}
