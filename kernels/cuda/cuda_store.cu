// The CUDA store: kernels and the host side that sequences them. The table
// logic (probing, digests, eviction choice) is kernels/bucket_table.h, the
// row math kernels/initializer_math.h and kernels/optimizer_math.h, all
// shared with the CPU store and its tests.
#include "kernels/cuda/cuda_store.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cub/cub.cuh>
#include <mutex>
#include <thrust/iterator/counting_iterator.h>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/key_hash.h"
#include "common/status_macros.h"
#include "kernels/bucket_table.h"
#include "common/cuda/cuda_raii.cuh"
#include "common/cuda/grid.cuh"
#include "kernels/initializer_math.h"
#include "kernels/optimizer_math.h"

namespace ember {
namespace {

using bucket::kNoSlot;
using bucket::kSlots;
using cuda::DeviceBuffer;

constexpr int kThreads = 256;

unsigned Blocks(uint64_t threads) {
  return static_cast<unsigned>(std::max<uint64_t>(1, (threads + kThreads - 1) / kThreads));
}

// Per-call event counts, summed on the device and read back once per call.
struct Counters {
  unsigned long long missing;   // key occurrences not stored when looked up
  unsigned long long inserted;  // rows placed in a free slot
  unsigned long long replaced;  // rows placed over an evicted row
  unsigned long long failed;    // new keys refused by a full bucket
  unsigned long long erased;
  unsigned long long dropped;   // unique pushed keys whose row was evicted within the call
};

// Adds `pred` over the warp with one atomic (counters are hot in big calls).
__device__ void WarpCount(bool pred, unsigned long long* counter) {
  const unsigned mask = __activemask();
  const unsigned votes = __ballot_sync(mask, pred);
  if ((threadIdx.x & 31) == __ffs(mask) - 1 && votes != 0) atomicAdd(counter, __popc(votes));
}

// The row arrays beside the bucket table; slot s's row is values[s * dim..].
struct Rows {
  uint8_t* values;    // (slots, dim) of dtype
  float* state;       // (slots, state_floats)
  uint32_t* steps;    // (slots) or null
  uint32_t dim;
  DType dtype;
  uint32_t state_per_element;  // 0, 1 or 2
};

// ---------------------------------------------------------------- kernels

// slots[i] and found[i] for every key; a stored key is touched when `touch`.
__global__ void FindKernel(bucket::Table t, const uint64_t* keys, uint64_t n, int64_t* slots,
                           uint8_t* found, EvictionPolicy policy, uint32_t clock, bool touch,
                           Counters* c) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const uint64_t key = keys[i];
  const int64_t slot = bucket::FindSlot(t, key, StoreHash(key));
  slots[i] = slot;
  if (found != nullptr) found[i] = slot != kNoSlot;
  if (slot != kNoSlot && touch && policy != EvictionPolicy::kNone) {
    if (policy == EvictionPolicy::kLru) {
      t.scores[slot] = clock;
    } else if (t.scores[slot] != 0xffffffffu) {
      atomicAdd(&t.scores[slot], 1u);  // duplicates in a call each count, as on the CPU
    }
  }
  WarpCount(slot == kNoSlot, &c->missing);
}

// Which row elements GatherKernel writes.
enum class GatherWhich : uint8_t { kAll, kFound, kMissing };

// out[i] = the stored row of keys[i] if slots[i] still holds it, else its
// initial row (a missing key, a refused insert, or a row inserted and then
// evicted by a later key of the same call, whose content was the initial
// row). One thread per element.
__global__ void GatherKernel(bucket::Table t, Rows r, InitializerConfig init,
                             const uint64_t* keys, const int64_t* slots, const uint8_t* found,
                             GatherWhich which, uint64_t n, DType out_dtype, void* out) {
  const uint64_t total = n * r.dim;
  cuda::ForEachGridIndex(total, [&](uint64_t e) {
    const uint64_t i = e / r.dim;
    const uint32_t j = static_cast<uint32_t>(e % r.dim);
    if (which == GatherWhich::kFound && !found[i]) return;
    if (which == GatherWhich::kMissing && found[i]) return;
    const uint64_t key = keys[i];
    const int64_t slot = slots[i];
    float v;
    if (slot != kNoSlot && t.keys[slot] == key) {
      v = LoadElement(r.values, r.dtype, static_cast<uint64_t>(slot) * r.dim + j);
    } else {
      v = RoundTo(r.dtype, init::Element(init, init::KeyBase(init.seed, key), j));
    }
    StoreElement(out, out_dtype, e, v);
  });
}

// The keys of `items` (indices into keys[]) with their bucket, for sorting.
__global__ void BucketOfKernel(const uint64_t* keys, const uint32_t* items, uint64_t m,
                               uint64_t num_buckets, uint32_t* buckets) {
  const uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (k >= m) return;
  buckets[k] = static_cast<uint32_t>(bucket::BucketOf(StoreHash(keys[items[k]]), num_buckets));
}

// Items sorted by bucket form one run per bucket; the thread of a run's
// first item calls fn(e) for each item e of the run, in order, so a bucket
// is only ever touched by one thread.
template <typename Fn>
__device__ void ForMyBucketRun(const uint32_t* buckets, uint64_t m, Fn fn) {
  const uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (k >= m || (k > 0 && buckets[k - 1] == buckets[k])) return;
  for (uint64_t e = k; e < m && buckets[e] == buckets[k]; ++e) fn(e);
}

// Places each bucket's missing keys (see ForMyBucketRun).
__global__ void InsertRunsKernel(bucket::Table t, const uint64_t* keys, const uint32_t* buckets,
                                 const uint32_t* items, uint64_t m, EvictionPolicy policy,
                                 uint32_t score, int64_t* slots, uint8_t* fresh, Counters* c) {
  unsigned long long inserted = 0, replaced = 0, failed = 0;
  ForMyBucketRun(buckets, m, [&](uint64_t e) {
    const uint32_t i = items[e];
    const uint64_t key = keys[i];
    const bucket::InsertOutcome o = bucket::InsertKey(t, key, StoreHash(key), policy, score);
    slots[i] = o.slot;
    fresh[i] = o.placement == bucket::Placement::kInserted ||
               o.placement == bucket::Placement::kReplaced;
    inserted += o.placement == bucket::Placement::kInserted;
    replaced += o.placement == bucket::Placement::kReplaced;
    failed += o.placement == bucket::Placement::kFull;
  });
  if (inserted) atomicAdd(&c->inserted, inserted);
  if (replaced) atomicAdd(&c->replaced, replaced);
  if (failed) atomicAdd(&c->failed, failed);
}

// Erases each bucket's keys from one thread (duplicates count once).
__global__ void EraseRunsKernel(bucket::Table t, const uint64_t* keys, const uint32_t* buckets,
                                const uint32_t* items, uint64_t m, Counters* c) {
  unsigned long long erased = 0;
  ForMyBucketRun(buckets, m, [&](uint64_t e) {
    const uint64_t key = keys[items[e]];
    erased += bucket::EraseKey(t, key, StoreHash(key));
  });
  if (erased) atomicAdd(&c->erased, erased);
}

// Initial row and optimizer state for every freshly placed key.
__global__ void InitRowsKernel(Rows r, InitializerConfig init, OptimizerConfig opt,
                               const uint64_t* keys, const int64_t* slots, const uint8_t* fresh,
                               uint64_t n) {
  const uint64_t total = n * r.dim;
  cuda::ForEachGridIndex(total, [&](uint64_t e) {
    const uint64_t i = e / r.dim;
    const uint32_t j = static_cast<uint32_t>(e % r.dim);
    if (!fresh[i]) return;
    const uint64_t slot = static_cast<uint64_t>(slots[i]);
    StoreElement(r.values, r.dtype, slot * r.dim + j,
                 init::Element(init, init::KeyBase(init.seed, keys[i]), j));
    float* state = r.state + slot * r.state_per_element * r.dim;
    switch (opt.kind) {
      case OptimizerKind::kSgd: break;
      case OptimizerKind::kAdagrad: state[j] = opt.initial_accumulator; break;
      case OptimizerKind::kAdam:
        state[j] = 0.0f;
        state[r.dim + j] = 0.0f;
        break;
      case OptimizerKind::kFtrl:
        state[j] = 0.0f;
        state[r.dim + j] = opt.initial_accumulator;
        break;
    }
    if (j == 0 && r.steps != nullptr) r.steps[slot] = 0;
  });
}

// Adam: advances each unique row's step once and keeps its step size.
__global__ void AdamStepKernel(bucket::Table t, Rows r, OptimizerConfig opt,
                               const uint64_t* keys, const int64_t* slots, uint64_t u,
                               float* step_size) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i >= u) return;
  const int64_t slot = slots[i];
  if (slot == kNoSlot || t.keys[slot] != keys[i]) return;
  uint32_t step = r.steps[slot];
  if (step != 0xffffffffu) ++step;
  r.steps[slot] = step;
  step_size[i] = opt::AdamStepSize(opt, step);
}

// One optimizer step per element of each unique key's row. The gradient is
// the sum of the key's occurrences in request order (run_pos holds the
// positions of each run in increasing order), as the CPU store sums them.
__global__ void ApplyKernel(bucket::Table t, Rows r, OptimizerConfig opt, const uint64_t* keys,
                            const int64_t* slots, const uint32_t* run_offsets,
                            const uint32_t* run_counts, const uint32_t* run_pos, uint64_t u,
                            DType grad_dtype, const void* grads, const float* step_size,
                            Counters* c) {
  const uint64_t total = u * r.dim;
  cuda::ForEachGridIndex(total, [&](uint64_t e) {
    const uint64_t i = e / r.dim;
    const uint32_t j = static_cast<uint32_t>(e % r.dim);
    const int64_t slot = slots[i];
    if (slot == kNoSlot) return;  // refused by a full table: counted as failed
    if (t.keys[slot] != keys[i]) {  // evicted by a later key of this call
      if (j == 0) atomicAdd(&c->dropped, 1ull);
      return;
    }
    const uint32_t first = run_offsets[i];
    float g = LoadElement(grads, grad_dtype, static_cast<uint64_t>(run_pos[first]) * r.dim + j);
    for (uint32_t k = 1; k < run_counts[i]; ++k) {
      g += LoadElement(grads, grad_dtype, static_cast<uint64_t>(run_pos[first + k]) * r.dim + j);
    }
    const uint64_t at = static_cast<uint64_t>(slot) * r.dim + j;
    float w = LoadElement(r.values, r.dtype, at);
    float* state = r.state + static_cast<uint64_t>(slot) * r.state_per_element * r.dim;
    switch (opt.kind) {
      case OptimizerKind::kSgd: opt::Sgd(opt, g, w); break;
      case OptimizerKind::kAdagrad: opt::Adagrad(opt, g, w, state[j]); break;
      case OptimizerKind::kAdam: opt::Adam(opt, step_size[i], g, w, state[j], state[r.dim + j]); break;
      case OptimizerKind::kFtrl: opt::Ftrl(opt, g, w, state[j], state[r.dim + j]); break;
    }
    StoreElement(r.values, r.dtype, at, w);
    if (j == 0) bucket::MarkDirty(t, slot);
  });
}

// Import: writes given values, state, steps and scores at the keys' slots.
__global__ void ScatterKernel(bucket::Table t, Rows r, const int64_t* slots, uint64_t n,
                             const float* values, const float* state, const uint32_t* steps,
                             const uint32_t* scores) {
  const uint64_t total = n * r.dim;
  const uint32_t sf = r.state_per_element * r.dim;
  cuda::ForEachGridIndex(total, [&](uint64_t e) {
    const uint64_t i = e / r.dim;
    const uint32_t j = static_cast<uint32_t>(e % r.dim);
    const int64_t slot = slots[i];
    if (slot == kNoSlot) return;
    StoreElement(r.values, r.dtype, static_cast<uint64_t>(slot) * r.dim + j, values[e]);
    for (uint32_t k = 0; k < r.state_per_element; ++k) {
      r.state[static_cast<uint64_t>(slot) * sf + k * r.dim + j] = state[i * sf + k * r.dim + j];
    }
    if (j == 0) {
      if (r.steps != nullptr) r.steps[slot] = steps[i];
      t.scores[slot] = scores[i];
      bucket::MarkDirty(t, slot);
    }
  });
}

// Growth: the occupied slots of the old table, as items.
__global__ void OccupiedKernel(const uint8_t* digests, uint64_t slots, uint8_t* flags) {
  const uint64_t s = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (s < slots) flags[s] = digests[s] != bucket::kEmpty;
}

// Growth: re-places each bucket run of old slots in the new table, keeping
// scores; new_slots[k] is where old slot items[k] went (kNoSlot: overflow).
__global__ void RehashRunsKernel(bucket::Table dst, const uint64_t* old_keys,
                                 const uint32_t* old_scores, const uint32_t* buckets,
                                 const uint32_t* items, uint64_t m, int64_t* new_slots,
                                 Counters* c) {
  ForMyBucketRun(buckets, m, [&](uint64_t e) {
    const uint64_t key = old_keys[items[e]];
    const bucket::InsertOutcome o =
        bucket::InsertKey(dst, key, StoreHash(key), EvictionPolicy::kNone, old_scores[items[e]]);
    new_slots[items[e]] = o.slot;
    if (o.placement == bucket::Placement::kFull) atomicAdd(&c->failed, 1ull);
  });
}

// Growth: copies rows (and state, steps) from old slots to their new ones.
__global__ void MoveRowsKernel(Rows from, Rows to, const uint32_t* items, const int64_t* new_slots,
                               uint64_t m) {
  const uint32_t value_bytes = from.dim * static_cast<uint32_t>(DTypeSize(from.dtype));
  const uint32_t sf = from.state_per_element * from.dim;
  const uint64_t total = m * from.dim;
  cuda::ForEachGridIndex(total, [&](uint64_t e) {
    const uint64_t k = e / from.dim;
    const uint32_t j = static_cast<uint32_t>(e % from.dim);
    const uint64_t src = items[k];
    const uint64_t dst = static_cast<uint64_t>(new_slots[src]);
    const uint32_t es = static_cast<uint32_t>(DTypeSize(from.dtype));
    memcpy(to.values + dst * value_bytes + j * es, from.values + src * value_bytes + j * es, es);
    for (uint32_t q = 0; q < from.state_per_element; ++q) {
      to.state[dst * sf + q * from.dim + j] = from.state[src * sf + q * from.dim + j];
    }
    if (j == 0 && from.steps != nullptr) to.steps[dst] = from.steps[src];
  });
}

__global__ void NotKernel(const uint8_t* in, uint64_t n, uint8_t* out) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = !in[i];
}

__global__ void IotaKernel(uint32_t* out, uint64_t n) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = static_cast<uint32_t>(i);
}

// Grid for element-wise kernels (grid-stride loops cover the rest).
unsigned ElementBlocks(uint64_t elements) {
  return static_cast<unsigned>(std::min<uint64_t>(Blocks(elements), 65535u * 8));
}

int BitWidth(uint64_t v) {
  int bits = 0;
  while (v != 0) {
    ++bits;
    v >>= 1;
  }
  return bits;
}

}  // namespace

// ------------------------------------------------------------- the store

// The table's device arrays: the bucket table and the rows at its slots.
struct SlotArrays {
  DeviceBuffer keys, digests, scores, sizes, values, state, steps;
  uint64_t num_buckets = 0;

  uint64_t slots() const { return num_buckets * kSlots; }
};

struct CudaStore::Impl {
  TableConfig config;
  int device = 0;
  uint32_t value_bytes = 0;
  uint32_t state_per_element = 0;
  bool has_step = false;
  cuda::Stream stream;

  std::mutex mu;  // serialises calls: one stream, one set of scratch buffers
  SlotArrays table;
  uint32_t clock = 0;

  // Per-call scratch, grown as needed.
  DeviceBuffer keys, out, found, slots, fresh, flags, items, buckets, sorted_items,
      sorted_buckets, sorted_keys, sorted_pos, unique_keys, run_counts, run_offsets, num_runs,
      step_size, grads, staged_found, refound, grow_slots, counters, cub_temp, import_values,
      import_state, import_steps, import_scores;

  // Change tracking (delta snapshots), on from the first snapshot: a byte
  // per slot and a log of removed keys (kernels/bucket_table.h). A growth
  // moves every row, so it ends tracking until the next full snapshot, as
  // does an overflowed log.
  DeviceBuffer dirty, removed_log, removed_count;
  bool tracking = false;
  bool tracking_lost = false;

  std::atomic<uint64_t> rows{0}, inserts{0}, evictions{0}, insert_failures{0};
  std::atomic<uint64_t> memory_bytes{0};

  cudaStream_t s() const { return stream.get(); }

  bucket::Table View() const {
    bucket::Table t;
    t.keys = table.keys.get<uint64_t>();
    t.digests = table.digests.get<uint8_t>();
    t.scores = table.scores.get<uint32_t>();
    t.sizes = table.sizes.get<uint32_t>();
    t.num_buckets = table.num_buckets;
    t.capacity = config.capacity;
    if (tracking) {
      t.dirty = dirty.get<uint8_t>();
      t.removed = removed_log.get<uint64_t>();
      t.removed_count = removed_count.get<unsigned long long>();
      t.removed_capacity = removed_log.bytes() / sizeof(uint64_t);
    }
    return t;
  }

  // Copies occupied slots [cursor->position, ...) to `out` until
  // `max_rows` rows; with `only_dirty`, only slots whose dirty byte is set.
  absl::Status CopySlots(ExportCursor* cursor, size_t max_rows, bool only_dirty,
                         ExportedRows* out);

  // Starts (or restarts) change tracking over the current slots, with
  // nothing marked.
  absl::Status StartTracking() {
    EMBER_RETURN_IF_ERROR(dirty.AllocateZeroed(table.slots(), s()));
    const uint64_t log = std::max<uint64_t>(uint64_t{1} << 16, table.slots() / 8);
    if (removed_log.bytes() < log * sizeof(uint64_t)) {
      EMBER_RETURN_IF_ERROR(removed_log.AllocateZeroed(log * sizeof(uint64_t), s()));
    }
    EMBER_RETURN_IF_ERROR(removed_count.AllocateZeroed(sizeof(unsigned long long), s()));
    tracking = true;
    tracking_lost = false;
    return absl::OkStatus();
  }
  Rows RowsOf(const SlotArrays& a) const {
    return Rows{a.values.get<uint8_t>(), a.state.get<float>(),
                has_step ? a.steps.get<uint32_t>() : nullptr, config.dim, config.dtype,
                state_per_element};
  }

  absl::Status Allocate(SlotArrays* a, uint64_t num_buckets) {
    const uint64_t slots = num_buckets * kSlots;
    a->num_buckets = num_buckets;
    EMBER_RETURN_IF_ERROR(a->keys.AllocateZeroed(slots * sizeof(uint64_t), s()));
    EMBER_RETURN_IF_ERROR(a->digests.AllocateZeroed(slots, s()));
    EMBER_RETURN_IF_ERROR(a->scores.AllocateZeroed(slots * sizeof(uint32_t), s()));
    EMBER_RETURN_IF_ERROR(a->sizes.AllocateZeroed(num_buckets * sizeof(uint32_t), s()));
    EMBER_RETURN_IF_ERROR(a->values.AllocateZeroed(slots * value_bytes, s()));
    EMBER_RETURN_IF_ERROR(
        a->state.AllocateZeroed(slots * state_per_element * config.dim * sizeof(float), s()));
    if (has_step) EMBER_RETURN_IF_ERROR(a->steps.AllocateZeroed(slots * sizeof(uint32_t), s()));
    return absl::OkStatus();
  }
  uint64_t BytesOf(const SlotArrays& a) const {
    return a.keys.bytes() + a.digests.bytes() + a.scores.bytes() + a.sizes.bytes() +
           a.values.bytes() + a.state.bytes() + a.steps.bytes();
  }

  template <typename T>
  T* Scratch(DeviceBuffer& b, uint64_t count, absl::Status* status) {
    if (status->ok()) status->Update(b.Reserve(std::max<uint64_t>(1, count) * sizeof(T)));
    return b.get<T>();
  }

  // Runs a cub algorithm: asks for its temporary storage, then runs it.
  template <typename F>
  absl::Status Cub(F f) {
    size_t bytes = 0;
    EMBER_CUDA_RETURN_IF_ERROR(f(nullptr, bytes));
    EMBER_RETURN_IF_ERROR(cub_temp.Reserve(std::max<size_t>(bytes, 1)));
    bytes = cub_temp.bytes();
    EMBER_CUDA_RETURN_IF_ERROR(f(cub_temp.get(), bytes));
    return absl::OkStatus();
  }

  absl::Status Launched() {
    EMBER_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }

  absl::Status ResetCounters() {
    absl::Status st;
    Scratch<Counters>(counters, 1, &st);
    EMBER_RETURN_IF_ERROR(st);
    EMBER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(counters.get(), 0, sizeof(Counters), s()));
    return absl::OkStatus();
  }
  absl::StatusOr<Counters> ReadCounters() {
    Counters c;
    EMBER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(&c, counters.get(), sizeof(Counters), cudaMemcpyDeviceToHost, s()));
    EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s()));
    return c;
  }
  // Folds one call's placements into the table's totals.
  void Account(const Counters& c) {
    rows.fetch_add(c.inserted, std::memory_order_relaxed);
    inserts.fetch_add(c.inserted + c.replaced, std::memory_order_relaxed);
    evictions.fetch_add(c.replaced, std::memory_order_relaxed);
    insert_failures.fetch_add(c.failed, std::memory_order_relaxed);
    rows.fetch_sub(c.erased, std::memory_order_relaxed);
  }

  // Sorts items[0, m) (indices into `item_keys`) by the bucket of their key
  // in a table of `num_buckets`; stable, so each bucket's items keep their
  // order. Leaves sorted_buckets / sorted_items.
  absl::Status SortByBucket(const uint64_t* item_keys, const uint32_t* item_list, uint64_t m,
                            uint64_t num_buckets) {
    absl::Status st;
    uint32_t* b = Scratch<uint32_t>(buckets, m, &st);
    uint32_t* sb = Scratch<uint32_t>(sorted_buckets, m, &st);
    uint32_t* si = Scratch<uint32_t>(sorted_items, m, &st);
    EMBER_RETURN_IF_ERROR(st);
    BucketOfKernel<<<Blocks(m), kThreads, 0, s()>>>(item_keys, item_list, m, num_buckets, b);
    EMBER_RETURN_IF_ERROR(Launched());
    const int end_bit = std::max(1, BitWidth(num_buckets - 1));
    return Cub([&](void* temp, size_t& bytes) {
      return cub::DeviceRadixSort::SortPairs(temp, bytes, b, sb, item_list, si,
                                             static_cast<int>(m), 0, end_bit, s());
    });
  }

  // Indices i < n with flags[i] set, into `items`; returns their count.
  absl::StatusOr<uint64_t> Select(const uint8_t* flag_array, uint64_t n) {
    absl::Status st;
    uint32_t* it = Scratch<uint32_t>(items, n, &st);
    uint32_t* count = Scratch<uint32_t>(num_runs, 1, &st);
    EMBER_RETURN_IF_ERROR(st);
    EMBER_RETURN_IF_ERROR(Cub([&](void* temp, size_t& bytes) {
      return cub::DeviceSelect::Flagged(temp, bytes, thrust::counting_iterator<uint32_t>(0),
                                        flag_array, it, count, static_cast<int>(n), s());
    }));
    uint32_t m = 0;
    EMBER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(&m, count, sizeof(m), cudaMemcpyDeviceToHost, s()));
    EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s()));
    return m;
  }

  // Doubles the buckets of a table without a capacity until its rows fit
  // (re-placing every row); needed when `incoming` more rows would pass 3/4
  // of its slots, or `force` after a bucket overflowed.
  absl::StatusOr<bool> Grow(uint64_t incoming, bool force) {
    if (config.capacity != 0) return false;
    const uint64_t need = rows.load() + incoming;
    uint64_t nb = table.num_buckets;
    if (force) nb *= 2;
    while (need * 4 > nb * kSlots * 3) nb *= 2;
    if (nb == table.num_buckets) return false;
    for (int attempt = 0; attempt < 8; ++attempt, nb *= 2) {
      if (nb > 0xffffffffull) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "table '", config.name, "' cannot grow past ", table.slots(), " slots on cuda:",
            device));
      }
      SlotArrays next;
      EMBER_RETURN_IF_ERROR(Allocate(&next, nb));
      const uint64_t old_slots = table.slots();
      absl::Status st;
      uint8_t* fl = Scratch<uint8_t>(flags, old_slots, &st);
      int64_t* new_slots = Scratch<int64_t>(grow_slots, old_slots, &st);
      EMBER_RETURN_IF_ERROR(st);
      OccupiedKernel<<<Blocks(old_slots), kThreads, 0, s()>>>(table.digests.get<uint8_t>(),
                                                              old_slots, fl);
      EMBER_RETURN_IF_ERROR(Launched());
      EMBER_ASSIGN_OR_RETURN(const uint64_t m, Select(fl, old_slots));
      EMBER_RETURN_IF_ERROR(SortByBucket(table.keys.get<uint64_t>(), items.get<uint32_t>(), m, nb));
      EMBER_RETURN_IF_ERROR(ResetCounters());
      bucket::Table dst = View();
      dst.keys = next.keys.get<uint64_t>();
      dst.digests = next.digests.get<uint8_t>();
      dst.scores = next.scores.get<uint32_t>();
      dst.sizes = next.sizes.get<uint32_t>();
      dst.num_buckets = nb;
      dst.dirty = nullptr;  // rows keep their contents: moving them is no change
      dst.removed_count = nullptr;
      RehashRunsKernel<<<Blocks(m), kThreads, 0, s()>>>(
          dst, table.keys.get<uint64_t>(), table.scores.get<uint32_t>(),
          sorted_buckets.get<uint32_t>(), sorted_items.get<uint32_t>(), m, new_slots,
          counters.get<Counters>());
      EMBER_RETURN_IF_ERROR(Launched());
      EMBER_ASSIGN_OR_RETURN(const Counters c, ReadCounters());
      if (c.failed != 0) continue;  // a bucket overflowed even at this size: double again
      MoveRowsKernel<<<ElementBlocks(m * config.dim), kThreads, 0, s()>>>(
          RowsOf(table), RowsOf(next), sorted_items.get<uint32_t>(), new_slots, m);
      EMBER_RETURN_IF_ERROR(Launched());
      EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s()));
      table = std::move(next);
      memory_bytes.store(BytesOf(table), std::memory_order_relaxed);
      if (tracking) {
        // Slots changed: the marks no longer match. Keep marking (in range)
        // until the next full snapshot restarts tracking.
        EMBER_RETURN_IF_ERROR(dirty.AllocateZeroed(table.slots(), s()));
        tracking_lost = true;
      }
      return true;
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("table '", config.name, "' could not re-place its rows on growth"));
  }

  // Looks up d_keys[0, n) into `slots` (and `found`), touching stored keys
  // when `touch`; with `insert`, places the missing ones (a table without a
  // capacity grows as needed) and initialises their rows. Before the
  // inserts, `before_insert` runs with the lookup's slots (the find path
  // copies out the rows present at the start of the call there, so an
  // eviction by this call's inserts cannot change them). Returns the call's
  // counters.
  template <typename BeforeInsert>
  absl::StatusOr<Counters> Resolve(const uint64_t* d_keys, uint64_t n, bool touch, bool insert,
                                   uint32_t score, BeforeInsert before_insert) {
    absl::Status st;
    int64_t* sl = Scratch<int64_t>(slots, n, &st);
    uint8_t* fd = Scratch<uint8_t>(found, n, &st);
    uint8_t* fr = Scratch<uint8_t>(fresh, n, &st);
    EMBER_RETURN_IF_ERROR(st);
    EMBER_RETURN_IF_ERROR(ResetCounters());
    Counters* c = counters.get<Counters>();
    FindKernel<<<Blocks(n), kThreads, 0, s()>>>(View(), d_keys, n, sl, fd, config.eviction, clock,
                                                touch, c);
    EMBER_RETURN_IF_ERROR(Launched());
    EMBER_RETURN_IF_ERROR(before_insert());
    EMBER_ASSIGN_OR_RETURN(Counters total, ReadCounters());
    if (!insert || total.missing == 0) return total;

    EMBER_ASSIGN_OR_RETURN(bool moved, Grow(total.missing, /*force=*/false));
    uint8_t* missing_from = fd;
    for (int attempt = 0;; ++attempt) {
      if (moved) {
        // The rows moved: find every key again (no touch). `found` keeps
        // the first lookup's answer for the callers.
        uint8_t* rf = Scratch<uint8_t>(refound, n, &st);
        EMBER_RETURN_IF_ERROR(st);
        FindKernel<<<Blocks(n), kThreads, 0, s()>>>(View(), d_keys, n, sl, rf, config.eviction,
                                                    clock, false, c);
        EMBER_RETURN_IF_ERROR(Launched());
        missing_from = rf;
      }
      EMBER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(fr, 0, n, s()));
      EMBER_ASSIGN_OR_RETURN(const uint64_t m, SelectMissing(missing_from, n));
      if (m == 0) break;
      EMBER_RETURN_IF_ERROR(SortByBucket(d_keys, items.get<uint32_t>(), m, table.num_buckets));
      EMBER_RETURN_IF_ERROR(ResetCounters());
      InsertRunsKernel<<<Blocks(m), kThreads, 0, s()>>>(
          View(), d_keys, sorted_buckets.get<uint32_t>(), sorted_items.get<uint32_t>(), m,
          config.eviction, score, sl, fr, c);
      EMBER_RETURN_IF_ERROR(Launched());
      InitRowsKernel<<<ElementBlocks(n * config.dim), kThreads, 0, s()>>>(
          RowsOf(table), config.initializer, config.optimizer, d_keys, sl, fr, n);
      EMBER_RETURN_IF_ERROR(Launched());
      EMBER_ASSIGN_OR_RETURN(const Counters placed, ReadCounters());
      Account(placed);
      total.inserted += placed.inserted;
      total.replaced += placed.replaced;
      if (placed.failed == 0 || config.capacity != 0 || attempt >= 8) {
        total.failed += placed.failed;
        break;
      }
      // A bucket of a table without a capacity overflowed: grow, retry.
      EMBER_ASSIGN_OR_RETURN(moved, Grow(placed.failed, /*force=*/true));
    }
    return total;
  }

  // Items: positions whose found flag is 0.
  absl::StatusOr<uint64_t> SelectMissing(const uint8_t* fd, uint64_t n) {
    absl::Status st;
    uint8_t* fl = Scratch<uint8_t>(flags, n, &st);
    EMBER_RETURN_IF_ERROR(st);
    NotKernel<<<Blocks(n), kThreads, 0, s()>>>(fd, n, fl);
    EMBER_RETURN_IF_ERROR(Launched());
    return Select(fl, n);
  }

  // Copies `bytes` of host memory into device scratch `b`.
  template <typename T>
  absl::StatusOr<T*> Stage(DeviceBuffer& b, const void* host, uint64_t bytes) {
    EMBER_RETURN_IF_ERROR(b.Reserve(std::max<uint64_t>(bytes, 1)));
    if (bytes != 0) {
      EMBER_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(b.get(), host, bytes, cudaMemcpyHostToDevice, s()));
    }
    return b.get<T>();
  }

  absl::StatusOr<FindResult> FindLocked(const uint64_t* keys, uint64_t n, DType out_dtype,
                                        void* out, uint8_t* found_out, bool insert);
  absl::StatusOr<PushResult> PushLocked(const uint64_t* keys, uint64_t n, DType grad_dtype,
                                        const void* grads);
};

// ------------------------------------------------------- public methods

absl::StatusOr<std::unique_ptr<CudaStore>> CudaStore::Create(const TableConfig& config,
                                                             int device) {
  EMBER_RETURN_IF_ERROR(ValidateTableConfig(config));
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", config.name, "': no CUDA device cuda:", device, " here (", count, " found)"));
  }
  cuda::DeviceScope scope(device);
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->device = device;
  impl->value_bytes = config.dim * static_cast<uint32_t>(DTypeSize(config.dtype));
  impl->state_per_element =
      static_cast<uint32_t>(OptimizerStateFloatsPerElement(config.optimizer.kind));
  impl->has_step = OptimizerHasStepCount(config.optimizer.kind);
  EMBER_RETURN_IF_ERROR(impl->stream.Create());
  const uint64_t buckets = bucket::BucketsFor(config.capacity, kInitialSlots);
  if (buckets > 0xffffffffull) {
    return absl::InvalidArgumentError(absl::StrCat("table '", config.name,
                                                   "' field 'capacity': expected at most ",
                                                   0xffffffffull * kSlots, ", received ",
                                                   config.capacity));
  }
  if (absl::Status s = impl->Allocate(&impl->table, buckets); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("table '", config.name, "' (capacity ",
                                               config.capacity, ") on cuda:", device, ": ",
                                               s.message()));
  }
  impl->memory_bytes = impl->BytesOf(impl->table);
  return std::unique_ptr<CudaStore>(new CudaStore(config, std::move(impl)));
}

CudaStore::CudaStore(const TableConfig& config, std::unique_ptr<Impl> impl)
    : EmbeddingStore(config), impl_(std::move(impl)) {}

CudaStore::~CudaStore() {
  cuda::DeviceScope scope(impl_->device);
  impl_.reset();
}

int CudaStore::device() const { return impl_->device; }

StoreStats CudaStore::StatsImpl() const {
  StoreStats st;
  st.rows = impl_->rows.load(std::memory_order_relaxed);
  st.capacity = config().capacity;
  st.memory_bytes = impl_->memory_bytes.load(std::memory_order_relaxed);
  st.inserts = impl_->inserts.load(std::memory_order_relaxed);
  st.evictions = impl_->evictions.load(std::memory_order_relaxed);
  st.insert_failures = impl_->insert_failures.load(std::memory_order_relaxed);
  return st;
}

absl::StatusOr<FindResult> CudaStore::Impl::FindLocked(const uint64_t* d_keys, uint64_t n,
                                                       DType out_dtype, void* out,
                                                       uint8_t* found_out, bool insert) {
  if (n == 0) return FindResult{};
  const uint32_t now = ++clock;
  const uint64_t elements = n * config.dim;
  auto gather = [&](GatherWhich which) -> absl::Status {
    GatherKernel<<<ElementBlocks(elements), kThreads, 0, s()>>>(
        View(), RowsOf(table), config.initializer, d_keys, slots.get<int64_t>(),
        found.get<uint8_t>(), which, n, out_dtype, out);
    return Launched();
  };
  // Rows stored at the start of the call are copied out before any insert
  // of this call can evict them.
  EMBER_ASSIGN_OR_RETURN(
      const Counters c,
      Resolve(d_keys, n, /*touch=*/true, insert, bucket::InsertedScore(config.eviction, now),
              [&] { return gather(insert ? GatherWhich::kFound : GatherWhich::kAll); }));
  if (found_out != nullptr) {
    EMBER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(found_out, found.get(), n, cudaMemcpyDeviceToDevice, s()));
  }
  if (insert) EMBER_RETURN_IF_ERROR(gather(GatherWhich::kMissing));
  EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s()));
  FindResult r;
  r.missing = insert ? c.inserted + c.replaced : c.missing;
  if (c.failed > 0) return TableFullError(config, c.failed, "new keys not inserted");
  return r;
}

absl::StatusOr<PushResult> CudaStore::Impl::PushLocked(const uint64_t* d_keys, uint64_t n,
                                                       DType grad_dtype, const void* d_grads) {
  if (n == 0) return PushResult{};
  const uint32_t now = ++clock;
  absl::Status st;
  uint32_t* pos = Scratch<uint32_t>(items, n, &st);
  uint32_t* spos = Scratch<uint32_t>(sorted_pos, n, &st);
  uint64_t* skeys = Scratch<uint64_t>(sorted_keys, n, &st);
  uint64_t* ukeys = Scratch<uint64_t>(unique_keys, n, &st);
  uint32_t* counts = Scratch<uint32_t>(run_counts, n, &st);
  uint32_t* offsets = Scratch<uint32_t>(run_offsets, n, &st);
  uint32_t* runs = Scratch<uint32_t>(num_runs, 1, &st);
  EMBER_RETURN_IF_ERROR(st);
  // Dedup: a stable sort by key keeps each key's occurrences in request
  // order; the runs of equal keys are the unique keys.
  IotaKernel<<<Blocks(n), kThreads, 0, s()>>>(pos, n);
  EMBER_RETURN_IF_ERROR(Launched());
  EMBER_RETURN_IF_ERROR(Cub([&](void* temp, size_t& bytes) {
    return cub::DeviceRadixSort::SortPairs(temp, bytes, d_keys, skeys, pos, spos,
                                           static_cast<int>(n), 0, 64, s());
  }));
  EMBER_RETURN_IF_ERROR(Cub([&](void* temp, size_t& bytes) {
    return cub::DeviceRunLengthEncode::Encode(temp, bytes, skeys, ukeys, counts, runs,
                                              static_cast<int>(n), s());
  }));
  uint32_t u = 0;
  EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&u, runs, sizeof(u), cudaMemcpyDeviceToHost, s()));
  EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s()));
  EMBER_RETURN_IF_ERROR(Cub([&](void* temp, size_t& bytes) {
    return cub::DeviceScan::ExclusiveSum(temp, bytes, counts, offsets, static_cast<int>(u), s());
  }));
  EMBER_ASSIGN_OR_RETURN(const Counters c,
                         Resolve(ukeys, u, /*touch=*/true, /*insert=*/true,
                                 bucket::InsertedScore(config.eviction, now),
                                 [] { return absl::OkStatus(); }));
  float* steps_out = Scratch<float>(step_size, has_step ? u : 1, &st);
  EMBER_RETURN_IF_ERROR(st);
  if (has_step) {
    AdamStepKernel<<<Blocks(u), kThreads, 0, s()>>>(View(), RowsOf(table), config.optimizer,
                                                    ukeys, slots.get<int64_t>(), u, steps_out);
    EMBER_RETURN_IF_ERROR(Launched());
  }
  EMBER_RETURN_IF_ERROR(ResetCounters());
  ApplyKernel<<<ElementBlocks(uint64_t{u} * config.dim), kThreads, 0, s()>>>(
      View(), RowsOf(table), config.optimizer, ukeys, slots.get<int64_t>(), offsets, counts,
      spos, u, grad_dtype, d_grads, steps_out, counters.get<Counters>());
  EMBER_RETURN_IF_ERROR(Launched());
  EMBER_ASSIGN_OR_RETURN(const Counters applied, ReadCounters());
  if (c.failed > 0) return TableFullError(config, c.failed, "new keys' gradients dropped");
  PushResult r;
  r.updated = u - c.failed - applied.dropped;
  r.inserted = c.inserted + c.replaced;
  return r;
}

absl::StatusOr<FindResult> CudaStore::FindOnDevice(const uint64_t* keys, size_t n, DType out_dtype,
                                                   void* out, uint8_t* found, bool insert) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  cuda::DeviceScope scope(impl_->device);
  return impl_->FindLocked(keys, n, out_dtype, out, found, insert);
}

absl::StatusOr<PushResult> CudaStore::ApplyGradientsOnDevice(const uint64_t* keys, size_t n,
                                                             DType grad_dtype, const void* grads) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  cuda::DeviceScope scope(impl_->device);
  return impl_->PushLocked(keys, n, grad_dtype, grads);
}

absl::StatusOr<FindResult> CudaStore::FindImpl(absl::Span<const uint64_t> keys, DType out_dtype,
                                               uint8_t* out, uint8_t* found, bool insert) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  cuda::DeviceScope scope(m.device);
  const uint64_t n = keys.size();
  const uint64_t out_bytes = n * config().dim * DTypeSize(out_dtype);
  EMBER_ASSIGN_OR_RETURN(uint64_t* d_keys,
                         m.Stage<uint64_t>(m.keys, keys.data(), n * sizeof(uint64_t)));
  EMBER_RETURN_IF_ERROR(m.out.Reserve(std::max<uint64_t>(out_bytes, 1)));
  EMBER_RETURN_IF_ERROR(m.staged_found.Reserve(std::max<uint64_t>(n, 1)));
  auto r = m.FindLocked(d_keys, n, out_dtype, m.out.get(),
                        found ? m.staged_found.get<uint8_t>() : nullptr, insert);
  if (!r.ok()) return r;
  EMBER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out, m.out.get(), out_bytes, cudaMemcpyDeviceToHost, m.s()));
  if (found) {
    EMBER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(found, m.staged_found.get(), n, cudaMemcpyDeviceToHost, m.s()));
  }
  EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.s()));
  return r;
}

absl::StatusOr<PushResult> CudaStore::ApplyGradientsImpl(absl::Span<const uint64_t> keys,
                                                         DType grad_dtype,
                                                         const GradientRows& grads) {
  // Rows given by address are packed on the host first: the staging copy
  // to the device is one transfer.
  const size_t row_bytes = config().dim * DTypeSize(grad_dtype);
  std::vector<uint8_t> packed;
  const uint8_t* host_grads = grads.packed();
  if (host_grads == nullptr) {
    packed.resize(keys.size() * row_bytes);
    for (size_t i = 0; i < keys.size(); ++i) {
      memcpy(packed.data() + i * row_bytes, grads.row(i, row_bytes), row_bytes);
    }
    host_grads = packed.data();
  }
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  cuda::DeviceScope scope(m.device);
  const uint64_t n = keys.size();
  EMBER_ASSIGN_OR_RETURN(uint64_t* d_keys,
                         m.Stage<uint64_t>(m.keys, keys.data(), n * sizeof(uint64_t)));
  EMBER_ASSIGN_OR_RETURN(
      uint8_t* d_grads,
      m.Stage<uint8_t>(m.grads, host_grads, n * row_bytes));
  return m.PushLocked(d_keys, n, grad_dtype, d_grads);
}

absl::StatusOr<size_t> CudaStore::EraseImpl(absl::Span<const uint64_t> keys) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  cuda::DeviceScope scope(m.device);
  const uint64_t n = keys.size();
  EMBER_ASSIGN_OR_RETURN(uint64_t* d_keys,
                         m.Stage<uint64_t>(m.keys, keys.data(), n * sizeof(uint64_t)));
  absl::Status st;
  uint32_t* list = m.Scratch<uint32_t>(m.items, n, &st);
  EMBER_RETURN_IF_ERROR(st);
  IotaKernel<<<Blocks(n), kThreads, 0, m.s()>>>(list, n);
  EMBER_RETURN_IF_ERROR(m.Launched());
  EMBER_RETURN_IF_ERROR(m.SortByBucket(d_keys, list, n, m.table.num_buckets));
  EMBER_RETURN_IF_ERROR(m.ResetCounters());
  EraseRunsKernel<<<Blocks(n), kThreads, 0, m.s()>>>(
      m.View(), d_keys, m.sorted_buckets.get<uint32_t>(), m.sorted_items.get<uint32_t>(), n,
      m.counters.get<Counters>());
  EMBER_RETURN_IF_ERROR(m.Launched());
  EMBER_ASSIGN_OR_RETURN(const Counters c, m.ReadCounters());
  m.Account(c);
  return static_cast<size_t>(c.erased);
}

absl::Status CudaStore::Impl::CopySlots(ExportCursor* cursor, size_t max_rows, bool only_dirty,
                                       ExportedRows* out) {
  Impl& m = *this;
  const uint32_t dim = config.dim;
  const uint64_t sf = uint64_t{m.state_per_element} * dim;
  const uint64_t total = m.table.slots();
  const uint64_t chunk = std::clamp<uint64_t>(max_rows, 4096, uint64_t{1} << 20);
  std::vector<uint8_t> digests, values, dirty;
  std::vector<uint64_t> keys;
  std::vector<uint32_t> scores, steps;
  std::vector<float> state;
  uint64_t pos = cursor->position;
  auto fetch = [&](const DeviceBuffer& b, uint64_t elem, auto& v, uint64_t count) -> absl::Status {
    v.resize(count * elem / sizeof(v[0]));
    EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v.data(), b.get<uint8_t>() + pos * elem,
                                               count * elem, cudaMemcpyDeviceToHost, m.s()));
    return absl::OkStatus();
  };
  while (pos < total && out->keys.size() < max_rows) {
    const uint64_t count = std::min(chunk, total - pos);
    EMBER_RETURN_IF_ERROR(fetch(m.table.digests, 1, digests, count));
    if (only_dirty) EMBER_RETURN_IF_ERROR(fetch(m.dirty, 1, dirty, count));
    EMBER_RETURN_IF_ERROR(fetch(m.table.keys, 8, keys, count));
    EMBER_RETURN_IF_ERROR(fetch(m.table.scores, 4, scores, count));
    EMBER_RETURN_IF_ERROR(fetch(m.table.values, m.value_bytes, values, count));
    if (sf != 0) EMBER_RETURN_IF_ERROR(fetch(m.table.state, sf * 4, state, count));
    if (m.has_step) EMBER_RETURN_IF_ERROR(fetch(m.table.steps, 4, steps, count));
    EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.s()));
    uint64_t k = 0;
    for (; k < count && out->keys.size() < max_rows; ++k) {
      if (digests[k] == bucket::kEmpty || (only_dirty && dirty[k] == 0)) continue;
      out->keys.push_back(keys[k]);
      const size_t v = out->values.size();
      out->values.resize(v + dim);
      ConvertElements(values.data() + k * m.value_bytes, m.config.dtype, out->values.data() + v,
                      DType::kFp32, dim);
      out->state.insert(out->state.end(), state.begin() + k * sf, state.begin() + (k + 1) * sf);
      out->steps.push_back(m.has_step ? steps[k] : 0);
      out->scores.push_back(scores[k]);
    }
    pos += k;
  }
  cursor->position = pos;
  cursor->done = pos >= total;
  return absl::OkStatus();
}

absl::Status CudaStore::ExportImpl(ExportCursor* cursor, size_t max_rows, ExportedRows* out) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  cuda::DeviceScope scope(m.device);
  return m.CopySlots(cursor, max_rows, /*only_dirty=*/false, out);
}

absl::Status CudaStore::SnapshotImpl(SnapshotKind kind, ExportCursor* cursor, size_t,
                                     SnapshotBatch* out) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);  // one unit: the whole table, atomically
  cuda::DeviceScope scope(m.device);
  const bool delta = kind == SnapshotKind::kDelta;
  if (delta && !m.tracking) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", config().name, "': no snapshot was taken before, so no changes are tracked; "
        "take a full snapshot"));
  }
  if (delta) {
    unsigned long long removed = 0;
    EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&removed, m.removed_count.get(), sizeof(removed),
                                               cudaMemcpyDeviceToHost, m.s()));
    EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.s()));
    const uint64_t capacity = m.removed_log.bytes() / sizeof(uint64_t);
    if (m.tracking_lost || removed > capacity) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", config().name, "': changes since the last snapshot were not all tracked (",
          m.tracking_lost ? "the table grew" : "more keys removed than the log holds",
          "); take a full snapshot"));
    }
    out->removed.resize(removed);
    if (removed > 0) {
      EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->removed.data(), m.removed_log.get(),
                                                 removed * sizeof(uint64_t),
                                                 cudaMemcpyDeviceToHost, m.s()));
    }
  }
  ExportCursor all;
  EMBER_RETURN_IF_ERROR(
      m.CopySlots(&all, std::numeric_limits<size_t>::max(), delta, &out->rows));
  std::sort(out->removed.begin(), out->removed.end());
  out->removed.erase(std::unique(out->removed.begin(), out->removed.end()), out->removed.end());
  // Everything copied is clean now.
  EMBER_RETURN_IF_ERROR(m.StartTracking());
  EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.s()));
  cursor->done = true;
  return absl::OkStatus();
}

absl::Status CudaStore::ImportImpl(const ExportedRows& rows) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  cuda::DeviceScope scope(m.device);
  const uint64_t n = rows.keys.size();
  EMBER_ASSIGN_OR_RETURN(uint64_t* d_keys,
                         m.Stage<uint64_t>(m.keys, rows.keys.data(), n * sizeof(uint64_t)));
  EMBER_ASSIGN_OR_RETURN(const Counters c, m.Resolve(d_keys, n, /*touch=*/false, /*insert=*/true,
                                                     0, [] { return absl::OkStatus(); }));
  EMBER_ASSIGN_OR_RETURN(
      float* values, m.Stage<float>(m.import_values, rows.values.data(), rows.values.size() * 4));
  EMBER_ASSIGN_OR_RETURN(
      float* state, m.Stage<float>(m.import_state, rows.state.data(), rows.state.size() * 4));
  EMBER_ASSIGN_OR_RETURN(uint32_t* steps,
                         m.Stage<uint32_t>(m.import_steps, rows.steps.data(), n * 4));
  EMBER_ASSIGN_OR_RETURN(uint32_t* scores,
                         m.Stage<uint32_t>(m.import_scores, rows.scores.data(), n * 4));
  ScatterKernel<<<ElementBlocks(n * config().dim), kThreads, 0, m.s()>>>(
      m.View(), m.RowsOf(m.table), m.slots.get<int64_t>(), n, values, state, steps, scores);
  EMBER_RETURN_IF_ERROR(m.Launched());
  EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.s()));
  if (c.failed > 0) return TableFullError(config(), c.failed, "imported rows not inserted");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EmbeddingStore>> NewCudaStore(const TableConfig& config,
                                                             int device) {
  auto store = CudaStore::Create(config, device);
  if (!store.ok()) return store.status();
  return std::unique_ptr<EmbeddingStore>(std::move(*store));
}

}  // namespace ember
