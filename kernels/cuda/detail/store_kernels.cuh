// The CUDA store's kernels (defined in store_kernels.cu) and the launch
// shapes they expect. Only kernels/cuda/ includes this: it names CUDA
// qualifiers. The table logic they run is kernels/bucket_table.h, the row
// rules kernels/row_policy.h and kernels/initializer_math.h, the same code
// the CPU store and its tests run.
//
// Thread mappings: "per key" kernels take Blocks(n) blocks of kThreads, one
// thread per key; "per element" kernels take ElementBlocks(n * dim) blocks
// and loop grid-stride over (key, element) pairs, element fastest, so a
// warp reads consecutive elements of a row (coalesced). "Per bucket run"
// kernels take items sorted by bucket and give each bucket to the thread of
// its first item, which handles the run in order: no locks, and the same
// result on every run.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/bucket_table.h"
#include "kernels/table_config.h"

namespace ember::cuda_detail {

inline constexpr int kThreads = 256;

inline unsigned Blocks(uint64_t threads) {
  return static_cast<unsigned>(std::max<uint64_t>(1, (threads + kThreads - 1) / kThreads));
}

// Grid for per-element kernels (their grid-stride loops cover the rest).
inline unsigned ElementBlocks(uint64_t elements) {
  return static_cast<unsigned>(std::min<uint64_t>(Blocks(elements), 65535u * 8));
}

// Per-call event counts, summed on the device and read back once per call.
struct Counters {
  unsigned long long missing;   // key occurrences not stored when looked up
  unsigned long long inserted;  // rows placed in a free slot
  unsigned long long replaced;  // rows placed over an evicted row
  unsigned long long failed;    // new keys refused by a full bucket
  unsigned long long erased;
  unsigned long long dropped;  // unique pushed keys whose row was evicted within the call
};

// The row arrays beside the bucket table; slot s's row is values[s * dim..].
struct Rows {
  uint8_t* values;  // (slots, dim) of dtype
  float* state;     // (slots, state_per_element, dim), slot-major per row
  uint32_t* steps;  // (slots) or null
  uint32_t dim;
  DType dtype;
  uint32_t state_per_element;  // the optimizer rule's kStateSlots
};

// Per key: slots[i] (kNoSlot if absent) and found[i] (may be null); a stored
// key's score is touched (row::TouchedScore, atomically) when `touch`.
// Counts absent keys in c->missing.
__global__ void FindKernel(bucket::Table t, const uint64_t* keys, uint64_t n, int64_t* slots,
                           uint8_t* found, EvictionPolicy policy, uint32_t clock, bool touch,
                           Counters* c);

// Which row elements GatherKernel writes.
enum class GatherWhich : uint8_t { kAll, kFound, kMissing };

// Per element: out[i] = the stored row of keys[i] if slots[i] still holds
// it, else its initial row (a missing key, a refused insert, or a row
// inserted and then evicted by a later key of the same call, whose content
// was the initial row), converted to out_dtype.
__global__ void GatherKernel(bucket::Table t, Rows r, InitializerConfig init, const uint64_t* keys,
                             const int64_t* slots, const uint8_t* found, GatherWhich which,
                             uint64_t n, DType out_dtype, void* out);

// Per item: buckets[k] = the bucket of keys[items[k]], for sorting.
__global__ void BucketOfKernel(const uint64_t* keys, const uint32_t* items, uint64_t m,
                               uint64_t num_buckets, uint32_t* buckets);

// Per bucket run: places each missing key (bucket::InsertKey with `score`),
// writing slots[i] and fresh[i] (1 where a row was placed and must be
// initialised); counts inserted, replaced and failed.
__global__ void InsertRunsKernel(bucket::Table t, const uint64_t* keys, const uint32_t* buckets,
                                 const uint32_t* items, uint64_t m, EvictionPolicy policy,
                                 uint32_t score, int64_t* slots, uint8_t* fresh, Counters* c);

// Per bucket run: erases the keys (duplicates count once) into c->erased.
__global__ void EraseRunsKernel(bucket::Table t, const uint64_t* keys, const uint32_t* buckets,
                                const uint32_t* items, uint64_t m, Counters* c);

// Per element: the initial row and optimizer state (row::InitialState) of
// every fresh key; its step count starts at 0.
__global__ void InitRowsKernel(Rows r, InitializerConfig init, OptimizerConfig opt,
                               const uint64_t* keys, const int64_t* slots, const uint8_t* fresh,
                               uint64_t n);

// Per unique key, for optimizers with a step count: advances the row's step
// once (row::AdvanceStep) and keeps this update's step size.
__global__ void StepKernel(bucket::Table t, Rows r, OptimizerConfig opt, const uint64_t* keys,
                           const int64_t* slots, uint64_t u, float* step_size);

// Per element of each unique key's row: the optimizer's rule
// (row::UpdateElement) on the sum of the key's gradients, summed in request
// order (run_pos holds each run's positions in increasing order), as the CPU
// store sums them. step_size is read only where r.steps is set. Rows
// evicted by a later key of the same call are counted in c->dropped.
__global__ void ApplyKernel(bucket::Table t, Rows r, OptimizerConfig opt, const uint64_t* keys,
                            const int64_t* slots, const uint32_t* run_offsets,
                            const uint32_t* run_counts, const uint32_t* run_pos, uint64_t u,
                            DType grad_dtype, const void* grads, const float* step_size,
                            Counters* c);

// Per element (import): writes the given fp32 values, state, steps and
// scores at the keys' slots and marks them dirty.
__global__ void ScatterKernel(bucket::Table t, Rows r, const int64_t* slots, uint64_t n,
                              const float* values, const float* state, const uint32_t* steps,
                              const uint32_t* scores);

// Per slot (growth): flags[s] = slot s is occupied.
__global__ void OccupiedKernel(const uint8_t* digests, uint64_t slots, uint8_t* flags);

// Per bucket run (growth): re-places old slots in the new table `dst`,
// keeping their scores; new_slots[items[k]] is where each went (kNoSlot:
// the bucket overflowed, counted in c->failed).
__global__ void RehashRunsKernel(bucket::Table dst, const uint64_t* old_keys,
                                 const uint32_t* old_scores, const uint32_t* buckets,
                                 const uint32_t* items, uint64_t m, int64_t* new_slots,
                                 Counters* c);

// Per element (growth): copies rows, state and steps from old slots to new.
__global__ void MoveRowsKernel(Rows from, Rows to, const uint32_t* items, const int64_t* new_slots,
                               uint64_t m);

// Per index: out[i] = !in[i].
__global__ void NotKernel(const uint8_t* in, uint64_t n, uint8_t* out);

// Per index: out[i] = i.
__global__ void IotaKernel(uint32_t* out, uint64_t n);

}  // namespace ember::cuda_detail
