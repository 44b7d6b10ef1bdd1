// Definitions of the kernels declared (with their contracts and thread
// mappings) in store_kernels.cuh.
#include "kernels/cuda/detail/store_kernels.cuh"

#include <cstring>

#include "common/cuda/grid.cuh"
#include "common/key_hash.h"
#include "kernels/initializer_math.h"
#include "kernels/row_policy.h"

namespace ember::cuda_detail {
namespace {

using bucket::kNoSlot;

__device__ uint64_t ThreadIndex() {
  return blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
}

// Adds `pred` over the warp with one atomic (counters are hot in big calls).
__device__ void WarpCount(bool pred, unsigned long long* counter) {
  const unsigned mask = __activemask();
  const unsigned votes = __ballot_sync(mask, pred);
  if ((threadIdx.x & 31) == __ffs(mask) - 1 && votes != 0) atomicAdd(counter, __popc(votes));
}

// Items sorted by bucket form one run per bucket; the thread of a run's
// first item calls fn(e) for each item e of the run, in order.
template <typename Fn>
__device__ void ForMyBucketRun(const uint32_t* buckets, uint64_t m, Fn fn) {
  const uint64_t k = ThreadIndex();
  if (k >= m || (k > 0 && buckets[k - 1] == buckets[k])) return;
  for (uint64_t e = k; e < m && buckets[e] == buckets[k]; ++e) fn(e);
}

// The row rule's score for one more access, applied atomically: duplicates
// of a key in one call each count, as on the CPU.
__device__ void TouchScore(uint32_t* score, EvictionPolicy policy, uint32_t clock) {
  uint32_t seen = *score;
  for (;;) {
    const uint32_t want = row::TouchedScore(policy, seen, clock);
    if (want == seen) return;
    const uint32_t was = atomicCAS(score, seen, want);
    if (was == seen) return;
    seen = was;
  }
}

}  // namespace

__global__ void FindKernel(bucket::Table t, const uint64_t* keys, uint64_t n, int64_t* slots,
                           uint8_t* found, EvictionPolicy policy, uint32_t clock, bool touch,
                           Counters* c) {
  const uint64_t i = ThreadIndex();
  if (i >= n) return;
  const uint64_t key = keys[i];
  const int64_t slot = bucket::FindSlot(t, key, StoreHash(key));
  slots[i] = slot;
  if (found != nullptr) found[i] = slot != kNoSlot;
  if (slot != kNoSlot && touch && policy != EvictionPolicy::kNone) {
    TouchScore(&t.scores[slot], policy, clock);
  }
  WarpCount(slot == kNoSlot, &c->missing);
}

__global__ void GatherKernel(bucket::Table t, Rows r, InitializerConfig init, const uint64_t* keys,
                             const int64_t* slots, const uint8_t* found, GatherWhich which,
                             uint64_t n, DType out_dtype, void* out) {
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

__global__ void BucketOfKernel(const uint64_t* keys, const uint32_t* items, uint64_t m,
                               uint64_t num_buckets, uint32_t* buckets) {
  const uint64_t k = ThreadIndex();
  if (k >= m) return;
  buckets[k] = static_cast<uint32_t>(bucket::BucketOf(StoreHash(keys[items[k]]), num_buckets));
}

__global__ void InsertRunsKernel(bucket::Table t, const uint64_t* keys, const uint32_t* buckets,
                                 const uint32_t* items, uint64_t m, EvictionPolicy policy,
                                 uint32_t score, int64_t* slots, uint8_t* fresh, Counters* c) {
  unsigned long long inserted = 0, replaced = 0, failed = 0;
  ForMyBucketRun(buckets, m, [&](uint64_t e) {
    const uint32_t i = items[e];
    const uint64_t key = keys[i];
    const bucket::InsertOutcome o = bucket::InsertKey(t, key, StoreHash(key), policy, score);
    slots[i] = o.slot;
    fresh[i] =
        o.placement == bucket::Placement::kInserted || o.placement == bucket::Placement::kReplaced;
    inserted += o.placement == bucket::Placement::kInserted;
    replaced += o.placement == bucket::Placement::kReplaced;
    failed += o.placement == bucket::Placement::kFull;
  });
  if (inserted) atomicAdd(&c->inserted, inserted);
  if (replaced) atomicAdd(&c->replaced, replaced);
  if (failed) atomicAdd(&c->failed, failed);
}

__global__ void EraseRunsKernel(bucket::Table t, const uint64_t* keys, const uint32_t* buckets,
                                const uint32_t* items, uint64_t m, Counters* c) {
  unsigned long long erased = 0;
  ForMyBucketRun(buckets, m, [&](uint64_t e) {
    const uint64_t key = keys[items[e]];
    erased += bucket::EraseKey(t, key, StoreHash(key));
  });
  if (erased) atomicAdd(&c->erased, erased);
}

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
    for (uint32_t k = 0; k < r.state_per_element; ++k) {
      state[k * r.dim + j] = row::InitialState(opt, k);
    }
    if (j == 0 && r.steps != nullptr) r.steps[slot] = 0;
  });
}

__global__ void StepKernel(bucket::Table t, Rows r, OptimizerConfig opt, const uint64_t* keys,
                           const int64_t* slots, uint64_t u, float* step_size) {
  const uint64_t i = ThreadIndex();
  if (i >= u) return;
  const int64_t slot = slots[i];
  if (slot == kNoSlot || t.keys[slot] != keys[i]) return;
  uint32_t step = r.steps[slot];
  step_size[i] = row::AdvanceStep(opt, step);
  r.steps[slot] = step;
}

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
    if (slot == kNoSlot) return;    // refused by a full table: counted as failed
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
    float* state = r.state + static_cast<uint64_t>(slot) * r.state_per_element * r.dim + j;
    const float step = r.steps != nullptr ? step_size[i] : 0.0f;
    row::VisitOptimizer(opt.kind, [&](auto rule) {
      row::UpdateElement<decltype(rule)>(opt, step, g, w, state, r.dim);
    });
    StoreElement(r.values, r.dtype, at, w);
    if (j == 0) bucket::MarkDirty(t, slot);
  });
}

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

__global__ void OccupiedKernel(const uint8_t* digests, uint64_t slots, uint8_t* flags) {
  const uint64_t s = ThreadIndex();
  if (s < slots) flags[s] = digests[s] != bucket::kEmpty;
}

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

__global__ void MoveRowsKernel(Rows from, Rows to, const uint32_t* items, const int64_t* new_slots,
                               uint64_t m) {
  const uint32_t es = static_cast<uint32_t>(DTypeSize(from.dtype));
  const uint32_t value_bytes = from.dim * es;
  const uint32_t sf = from.state_per_element * from.dim;
  const uint64_t total = m * from.dim;
  cuda::ForEachGridIndex(total, [&](uint64_t e) {
    const uint64_t k = e / from.dim;
    const uint32_t j = static_cast<uint32_t>(e % from.dim);
    const uint64_t src = items[k];
    const uint64_t dst = static_cast<uint64_t>(new_slots[src]);
    memcpy(to.values + dst * value_bytes + j * es, from.values + src * value_bytes + j * es, es);
    for (uint32_t q = 0; q < from.state_per_element; ++q) {
      to.state[dst * sf + q * from.dim + j] = from.state[src * sf + q * from.dim + j];
    }
    if (j == 0 && from.steps != nullptr) to.steps[dst] = from.steps[src];
  });
}

__global__ void NotKernel(const uint8_t* in, uint64_t n, uint8_t* out) {
  const uint64_t i = ThreadIndex();
  if (i < n) out[i] = !in[i];
}

__global__ void IotaKernel(uint32_t* out, uint64_t n) {
  const uint64_t i = ThreadIndex();
  if (i < n) out[i] = static_cast<uint32_t>(i);
}

}  // namespace ember::cuda_detail
