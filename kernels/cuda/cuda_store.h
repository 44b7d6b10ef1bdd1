// CudaStore: the GPU-memory EmbeddingStore (one table, one device).
//
// Keys, digests, scores and rows live in device memory in the bucketed layout
// of kernels/bucket_table.h: buckets of 128 slots, a one-byte fingerprint per
// slot, keys and scores in arrays apart from the rows, one allocation per
// array (none per bucket), any dim. A table with a capacity is sized for it
// at creation (load factor 1.0 is a full table; each bucket evicts its
// lowest-score row); a table without one starts small and doubles its
// buckets when 3/4 full or when a bucket overflows.
//
// Each call runs as a short sequence of kernels on the store's own stream
// and returns when they are done:
//   find:      one thread per key reads the key's digest line, then one
//              thread per row element copies (or initialises) the row;
//   insert:    missing keys are sorted by bucket (cub radix sort) and each
//              bucket's keys are placed by one thread in request order, so
//              no locks and a deterministic result;
//   push:      keys are sorted and run-length encoded (dedup), duplicate
//              gradients are summed in request order, and one thread per
//              element of each unique row applies the optimizer
//              (kernels/row_policy.h, the CPU store's rules; compiled
//              without FMA contraction, so fp32 SGD and Adagrad rows match
//              the CPU store bit for bit).
//
// Thread safety: calls on one store are serialised (a mutex); different
// stores run in parallel. Memory: the EmbeddingStore methods take host
// memory (staged through device scratch); the *OnDevice methods take
// device pointers of this store's device. Errors: CUDA failures are
// INTERNAL naming the call; device memory exhaustion is RESOURCE_EXHAUSTED.
//
// Snapshots (checkpoints): the whole table at once, under the mutex; deltas
// from per-slot dirty bytes and a removed-key log kept by the kernels.
//
// No CUDA types here: host code includes this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/embedding_store.h"

namespace ember {

class CudaStore final : public EmbeddingStore {
 public:
  // Slots of a table without a capacity before its first growth.
  static constexpr uint64_t kInitialSlots = 16 * 1024;

  // Fails with FAILED_PRECONDITION when `device` does not exist here, and
  // RESOURCE_EXHAUSTED when the table's capacity does not fit in its memory.
  static absl::StatusOr<std::unique_ptr<CudaStore>> Create(const TableConfig& config, int device);
  ~CudaStore() override;

  int device() const;

  // Find / FindOrInsert with device pointers: `keys` (n), `out` (n, dim) of
  // `out_dtype`, `found` (n, may be null). Shapes are the caller's to get
  // right: nothing here can check a device pointer's extent.
  absl::StatusOr<FindResult> FindOnDevice(const uint64_t* keys, size_t n, DType out_dtype,
                                          void* out, uint8_t* found, bool insert);
  // ApplyGradients with device pointers: `grads` (n, dim) of `grad_dtype`.
  // Gradients are not checked for finiteness (ValidateGradients on the host
  // copy does that).
  absl::StatusOr<PushResult> ApplyGradientsOnDevice(const uint64_t* keys, size_t n,
                                                    DType grad_dtype, const void* grads);

 protected:
  StoreStats StatsImpl() const override;
  absl::StatusOr<FindResult> FindImpl(absl::Span<const uint64_t> keys, DType out_dtype,
                                      uint8_t* out, uint8_t* found, bool insert) override;
  absl::StatusOr<PushResult> ApplyGradientsImpl(absl::Span<const uint64_t> keys,
                                                DType grad_dtype,
                                                const GradientRows& grads) override;
  absl::StatusOr<size_t> EraseImpl(absl::Span<const uint64_t> keys) override;
  absl::Status ExportImpl(ExportCursor* cursor, size_t max_rows, ExportedRows* out) override;
  absl::Status ImportImpl(const ExportedRows& rows) override;
  // The whole table is one unit, copied under the store's mutex; deltas
  // hold the slots marked dirty and the logged removed keys, or fall back
  // to FAILED_PRECONDITION (take a full one) after a growth or a log
  // overflow.
  absl::Status SnapshotImpl(SnapshotKind kind, ExportCursor* cursor, size_t max_rows,
                            SnapshotBatch* out) override;

 private:
  struct Impl;
  CudaStore(const TableConfig& config, std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Creates the CUDA store for `config` on device `device` (validated here).
absl::StatusOr<std::unique_ptr<EmbeddingStore>> NewCudaStore(const TableConfig& config, int device);

}  // namespace ember
