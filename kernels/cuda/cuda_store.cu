// The CUDA store's public methods: each locks the store, selects its
// device and runs the host steps of detail/store_impl.cuh, whose kernels are
// in detail/store_kernels.cu.
#include "kernels/cuda/cuda_store.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/detail/store_impl.cuh"
#include "kernels/cuda/detail/store_kernels.cuh"
#include "kernels/row_policy.h"

namespace ember {

using bucket::kSlots;
using cuda::DeviceBuffer;
using cuda_detail::Counters;

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
    return absl::InvalidArgumentError(
        absl::StrCat("table '", config.name, "' field 'capacity': expected at most ",
                     0xffffffffull * kSlots, ", received ", config.capacity));
  }
  if (absl::Status s = impl->Allocate(&impl->table, buckets); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("table '", config.name, "' (capacity ", config.capacity,
                                     ") on cuda:", device, ": ", s.message()));
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
  auto gather = [&](cuda_detail::GatherWhich which) -> absl::Status {
    cuda_detail::
        GatherKernel<<<cuda_detail::ElementBlocks(elements), cuda_detail::kThreads, 0, s()>>>(
            View(), RowsOf(table), config.initializer, d_keys, slots.get<int64_t>(),
            found.get<uint8_t>(), which, n, out_dtype, out);
    return Launched();
  };
  // Rows stored at the start of the call are copied out before any insert
  // of this call can evict them.
  EMBER_ASSIGN_OR_RETURN(
      const Counters c,
      Resolve(d_keys, n, /*touch=*/true, insert, row::InsertedScore(config.eviction, now), [&] {
        return gather(insert ? cuda_detail::GatherWhich::kFound : cuda_detail::GatherWhich::kAll);
      }));
  if (found_out != nullptr) {
    EMBER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(found_out, found.get(), n, cudaMemcpyDeviceToDevice, s()));
  }
  if (insert) EMBER_RETURN_IF_ERROR(gather(cuda_detail::GatherWhich::kMissing));
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
  cuda_detail::IotaKernel<<<cuda_detail::Blocks(n), cuda_detail::kThreads, 0, s()>>>(pos, n);
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
  EMBER_ASSIGN_OR_RETURN(const Counters c, Resolve(ukeys, u, /*touch=*/true, /*insert=*/true,
                                                   row::InsertedScore(config.eviction, now),
                                                   [] { return absl::OkStatus(); }));
  float* steps_out = Scratch<float>(step_size, has_step ? u : 1, &st);
  EMBER_RETURN_IF_ERROR(st);
  if (has_step) {
    cuda_detail::StepKernel<<<cuda_detail::Blocks(u), cuda_detail::kThreads, 0, s()>>>(
        View(), RowsOf(table), config.optimizer, ukeys, slots.get<int64_t>(), u, steps_out);
    EMBER_RETURN_IF_ERROR(Launched());
  }
  EMBER_RETURN_IF_ERROR(ResetCounters());
  cuda_detail::ApplyKernel<<<cuda_detail::ElementBlocks(uint64_t{u} * config.dim),
                             cuda_detail::kThreads, 0, s()>>>(
      View(), RowsOf(table), config.optimizer, ukeys, slots.get<int64_t>(), offsets, counts, spos,
      u, grad_dtype, d_grads, steps_out, counters.get<Counters>());
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
  EMBER_ASSIGN_OR_RETURN(uint64_t * d_keys,
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
  EMBER_ASSIGN_OR_RETURN(uint64_t * d_keys,
                         m.Stage<uint64_t>(m.keys, keys.data(), n * sizeof(uint64_t)));
  EMBER_ASSIGN_OR_RETURN(uint8_t * d_grads, m.Stage<uint8_t>(m.grads, host_grads, n * row_bytes));
  return m.PushLocked(d_keys, n, grad_dtype, d_grads);
}

absl::StatusOr<size_t> CudaStore::EraseImpl(absl::Span<const uint64_t> keys) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  cuda::DeviceScope scope(m.device);
  const uint64_t n = keys.size();
  EMBER_ASSIGN_OR_RETURN(uint64_t * d_keys,
                         m.Stage<uint64_t>(m.keys, keys.data(), n * sizeof(uint64_t)));
  absl::Status st;
  uint32_t* list = m.Scratch<uint32_t>(m.items, n, &st);
  EMBER_RETURN_IF_ERROR(st);
  cuda_detail::IotaKernel<<<cuda_detail::Blocks(n), cuda_detail::kThreads, 0, m.s()>>>(list, n);
  EMBER_RETURN_IF_ERROR(m.Launched());
  EMBER_RETURN_IF_ERROR(m.SortByBucket(d_keys, list, n, m.table.num_buckets));
  EMBER_RETURN_IF_ERROR(m.ResetCounters());
  cuda_detail::EraseRunsKernel<<<cuda_detail::Blocks(n), cuda_detail::kThreads, 0, m.s()>>>(
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
    return absl::FailedPreconditionError(
        absl::StrCat("table '", config().name,
                     "': no snapshot was taken before, so no changes are tracked; "
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
                                                 removed * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                                 m.s()));
    }
  }
  ExportCursor all;
  EMBER_RETURN_IF_ERROR(m.CopySlots(&all, std::numeric_limits<size_t>::max(), delta, &out->rows));
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
  EMBER_ASSIGN_OR_RETURN(uint64_t * d_keys,
                         m.Stage<uint64_t>(m.keys, rows.keys.data(), n * sizeof(uint64_t)));
  EMBER_ASSIGN_OR_RETURN(const Counters c, m.Resolve(d_keys, n, /*touch=*/false, /*insert=*/true, 0,
                                                     [] { return absl::OkStatus(); }));
  EMBER_ASSIGN_OR_RETURN(
      float* values, m.Stage<float>(m.import_values, rows.values.data(), rows.values.size() * 4));
  EMBER_ASSIGN_OR_RETURN(float* state,
                         m.Stage<float>(m.import_state, rows.state.data(), rows.state.size() * 4));
  EMBER_ASSIGN_OR_RETURN(uint32_t * steps,
                         m.Stage<uint32_t>(m.import_steps, rows.steps.data(), n * 4));
  EMBER_ASSIGN_OR_RETURN(uint32_t * scores,
                         m.Stage<uint32_t>(m.import_scores, rows.scores.data(), n * 4));
  cuda_detail::ScatterKernel<<<cuda_detail::ElementBlocks(n * config().dim), cuda_detail::kThreads,
                               0, m.s()>>>(m.View(), m.RowsOf(m.table), m.slots.get<int64_t>(), n,
                                           values, state, steps, scores);
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
