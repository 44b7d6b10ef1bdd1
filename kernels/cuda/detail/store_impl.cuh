// CudaStore::Impl: the table's device arrays and the host steps that
// sequence kernels over them (find or insert, growth, change tracking).
// Included only by kernels/cuda/cuda_store.cu, whose public methods lock
// the store and call these; the kernels are in store_kernels.cuh.
#pragma once

#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <atomic>
#include <cub/cub.cuh>
#include <mutex>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_raii.cuh"
#include "common/status_macros.h"
#include "kernels/bucket_table.h"
#include "kernels/cuda/cuda_store.h"
#include "kernels/cuda/detail/store_kernels.cuh"

namespace ember {
namespace cuda_detail {

// Bits needed for values up to v (the radix sort's key width).
inline int BitWidth(uint64_t v) {
  int bits = 0;
  while (v != 0) {
    ++bits;
    v >>= 1;
  }
  return bits;
}

// The table's device arrays: the bucket table and the rows at its slots.
struct SlotArrays {
  cuda::DeviceBuffer keys, digests, scores, sizes, values, state, steps;
  uint64_t num_buckets = 0;

  uint64_t slots() const { return num_buckets * bucket::kSlots; }
};

}  // namespace cuda_detail

struct CudaStore::Impl {
  using Counters = cuda_detail::Counters;
  using Rows = cuda_detail::Rows;

  TableConfig config;
  int device = 0;
  uint32_t value_bytes = 0;
  uint32_t state_per_element = 0;
  bool has_step = false;
  cuda::Stream stream;

  std::mutex mu;  // serialises calls: one stream, one set of scratch buffers
  cuda_detail::SlotArrays table;
  uint32_t clock = 0;

  // Per-call scratch, grown as needed.
  cuda::DeviceBuffer keys, out, found, slots, fresh, flags, items, buckets, sorted_items,
      sorted_buckets, sorted_keys, sorted_pos, unique_keys, run_counts, run_offsets, num_runs,
      step_size, grads, staged_found, refound, grow_slots, counters, cub_temp, import_values,
      import_state, import_steps, import_scores;

  // Change tracking (delta snapshots), on from the first snapshot: a byte
  // per slot and a log of removed keys (kernels/bucket_table.h). A growth
  // moves every row, so it ends tracking until the next full snapshot, as
  // does an overflowed log.
  cuda::DeviceBuffer dirty, removed_log, removed_count;
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
  absl::Status CopySlots(ExportCursor* cursor, size_t max_rows, bool only_dirty, ExportedRows* out);

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
  Rows RowsOf(const cuda_detail::SlotArrays& a) const {
    return Rows{a.values.get<uint8_t>(),
                a.state.get<float>(),
                has_step ? a.steps.get<uint32_t>() : nullptr,
                config.dim,
                config.dtype,
                state_per_element};
  }

  absl::Status Allocate(cuda_detail::SlotArrays* a, uint64_t num_buckets) {
    const uint64_t slots = num_buckets * bucket::kSlots;
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
  uint64_t BytesOf(const cuda_detail::SlotArrays& a) const {
    return a.keys.bytes() + a.digests.bytes() + a.scores.bytes() + a.sizes.bytes() +
           a.values.bytes() + a.state.bytes() + a.steps.bytes();
  }

  template <typename T>
  T* Scratch(cuda::DeviceBuffer& b, uint64_t count, absl::Status* status) {
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
    cuda_detail::BucketOfKernel<<<cuda_detail::Blocks(m), cuda_detail::kThreads, 0, s()>>>(
        item_keys, item_list, m, num_buckets, b);
    EMBER_RETURN_IF_ERROR(Launched());
    const int end_bit = std::max(1, cuda_detail::BitWidth(num_buckets - 1));
    return Cub([&](void* temp, size_t& bytes) {
      return cub::DeviceRadixSort::SortPairs(temp, bytes, b, sb, item_list, si, static_cast<int>(m),
                                             0, end_bit, s());
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
    EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&m, count, sizeof(m), cudaMemcpyDeviceToHost, s()));
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
    while (need * 4 > nb * bucket::kSlots * 3) nb *= 2;
    if (nb == table.num_buckets) return false;
    for (int attempt = 0; attempt < 8; ++attempt, nb *= 2) {
      if (nb > 0xffffffffull) {
        return absl::ResourceExhaustedError(absl::StrCat("table '", config.name,
                                                         "' cannot grow past ", table.slots(),
                                                         " slots on cuda:", device));
      }
      cuda_detail::SlotArrays next;
      EMBER_RETURN_IF_ERROR(Allocate(&next, nb));
      const uint64_t old_slots = table.slots();
      absl::Status st;
      uint8_t* fl = Scratch<uint8_t>(flags, old_slots, &st);
      int64_t* new_slots = Scratch<int64_t>(grow_slots, old_slots, &st);
      EMBER_RETURN_IF_ERROR(st);
      cuda_detail::
          OccupiedKernel<<<cuda_detail::Blocks(old_slots), cuda_detail::kThreads, 0, s()>>>(
              table.digests.get<uint8_t>(), old_slots, fl);
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
      cuda_detail::RehashRunsKernel<<<cuda_detail::Blocks(m), cuda_detail::kThreads, 0, s()>>>(
          dst, table.keys.get<uint64_t>(), table.scores.get<uint32_t>(),
          sorted_buckets.get<uint32_t>(), sorted_items.get<uint32_t>(), m, new_slots,
          counters.get<Counters>());
      EMBER_RETURN_IF_ERROR(Launched());
      EMBER_ASSIGN_OR_RETURN(const Counters c, ReadCounters());
      if (c.failed != 0) continue;  // a bucket overflowed even at this size: double again
      cuda_detail::MoveRowsKernel<<<cuda_detail::ElementBlocks(m * config.dim),
                                    cuda_detail::kThreads, 0, s()>>>(
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
    cuda_detail::FindKernel<<<cuda_detail::Blocks(n), cuda_detail::kThreads, 0, s()>>>(
        View(), d_keys, n, sl, fd, config.eviction, clock, touch, c);
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
        cuda_detail::FindKernel<<<cuda_detail::Blocks(n), cuda_detail::kThreads, 0, s()>>>(
            View(), d_keys, n, sl, rf, config.eviction, clock, false, c);
        EMBER_RETURN_IF_ERROR(Launched());
        missing_from = rf;
      }
      EMBER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(fr, 0, n, s()));
      EMBER_ASSIGN_OR_RETURN(const uint64_t m, SelectMissing(missing_from, n));
      if (m == 0) break;
      EMBER_RETURN_IF_ERROR(SortByBucket(d_keys, items.get<uint32_t>(), m, table.num_buckets));
      EMBER_RETURN_IF_ERROR(ResetCounters());
      cuda_detail::InsertRunsKernel<<<cuda_detail::Blocks(m), cuda_detail::kThreads, 0, s()>>>(
          View(), d_keys, sorted_buckets.get<uint32_t>(), sorted_items.get<uint32_t>(), m,
          config.eviction, score, sl, fr, c);
      EMBER_RETURN_IF_ERROR(Launched());
      cuda_detail::InitRowsKernel<<<cuda_detail::ElementBlocks(n * config.dim),
                                    cuda_detail::kThreads, 0, s()>>>(
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
    cuda_detail::NotKernel<<<cuda_detail::Blocks(n), cuda_detail::kThreads, 0, s()>>>(fd, n, fl);
    EMBER_RETURN_IF_ERROR(Launched());
    return Select(fl, n);
  }

  // Copies `bytes` of host memory into device scratch `b`.
  template <typename T>
  absl::StatusOr<T*> Stage(cuda::DeviceBuffer& b, const void* host, uint64_t bytes) {
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

}  // namespace ember
