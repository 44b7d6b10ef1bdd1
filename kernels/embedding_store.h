// EmbeddingStore: the contract every storage engine of Ember implements (the
// CPU store in kernels/cpu, the CUDA store in kernels/cuda).
//
// A store holds one table's rows on one shard: uint64 keys (every value is a
// valid key, 0 and 2^64-1 included) mapped to rows of `dim` elements in the
// table's storage dtype, plus fp32 optimizer state per row.
//
// Memory: every pointer and span passed to these methods is host memory owned
// by the caller and only read or written during the call. A device store
// stages host buffers itself.
//
// Shapes: n = keys.size(); row buffers are (n, dim) row-major, packed, of the
// dtype given with them, so their byte size must be n * dim * DTypeSize(dtype).
//
// Thread safety: every method may be called concurrently with any other.
// Lookups run in parallel with each other; pushes to rows in different lock
// stripes run in parallel. A row is never read while half-written.
//
// Errors: the public methods validate their arguments once (here) and return
// INVALID_ARGUMENT naming the table, the field and expected vs. received,
// before touching any row; the protected *Impl methods then do the work.
// RESOURCE_EXHAUSTED means some new keys could not be inserted because the
// table is full and has no eviction policy: the other keys of the call were
// served, and the failures are counted in StoreStats::insert_failures.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "kernels/table_config.h"

namespace ember {

class CountMinSketch;

struct StoreStats {
  uint64_t rows = 0;             // rows stored now
  uint64_t capacity = 0;         // most rows (0: limited by memory only)
  uint64_t memory_bytes = 0;     // bytes held for rows, state, index
  uint64_t inserts = 0;          // rows inserted since creation
  uint64_t evictions = 0;        // rows evicted to make room since creation
  uint64_t insert_failures = 0;  // new keys refused because the table was full
  uint64_t expired = 0;          // rows evicted by the TTL since creation
  uint64_t admission_rejected = 0;  // looked-up key occurrences not stored (admission)
  uint64_t admission_dropped = 0;   // gradient rows dropped (admission)
};

struct FindResult {
  // Distinct keys of the call that were not stored before it (a key
  // repeated in one call counts once, in Find and FindOrInsert alike). Find
  // answers them with their initial row; FindOrInsert inserts them, except
  // the ones admission turns away (config().admission), answered with their
  // initial row.
  size_t missing = 0;
};

struct PushResult {
  size_t updated = 0;   // distinct keys that received an optimizer step
  size_t inserted = 0;  // of those, keys inserted by this call
};

// One batch of exported rows, fp32 whatever the storage dtype.
struct ExportedRows {
  std::vector<uint64_t> keys;    // (n)
  std::vector<float> values;     // (n, dim)
  std::vector<float> state;      // (n, dim * OptimizerStateFloatsPerElement)
  std::vector<uint32_t> steps;   // (n) optimizer step counts (0 unless Adam)
  std::vector<uint32_t> scores;  // (n) eviction scores (LRU clock or LFU count)
  void Clear();
};

// Position of an export scan. Start from a default-constructed cursor and
// call Export until `done`. Rows inserted or evicted during a scan may be
// missed or seen twice; checkpoints use Snapshot instead.
struct ExportCursor {
  uint64_t position = 0;
  bool done = false;
};

// What a Snapshot copies.
enum class SnapshotKind : uint8_t {
  // Every stored row. Starts (or restarts) change tracking.
  kFull,
  // Only what changed since the previous snapshot of this store: rows
  // inserted or updated since (their current contents) and keys removed
  // since (erased or evicted, and not stored now).
  kDelta,
};

// One part of a snapshot.
struct SnapshotBatch {
  ExportedRows rows;              // rows in fp32, as Export gives them
  std::vector<uint64_t> removed;  // kDelta: keys removed since the previous snapshot
  void Clear();
};

// Where Peek writes, n = keys.size() rows, host memory owned by the caller.
struct PeekedRows {
  absl::Span<float> values;     // (n, dim): the stored row in fp32, exact at any storage dtype
  absl::Span<float> state;      // (n, dim * OptimizerStateFloatsPerElement), per row slot-major
  absl::Span<uint32_t> steps;   // (n) optimizer step counts; empty unless OptimizerHasStepCount
  absl::Span<uint8_t> stored;   // (n) 1: stored; 0: absent, answered with its initial row and state
};

// A push's gradient rows, in key order: (n, dim) of the push's dtype, host
// memory, any alignment. Either one packed buffer, or one address per row:
// a shard reads a push's rows where they arrived, in pieces of the network's
// receive buffers, and a piece boundary can fall anywhere. A view: the
// caller keeps the bytes and the address array alive through the call.
class GradientRows {
 public:
  // Packed: row i at bytes.data() + i * row bytes.
  GradientRows(absl::Span<const uint8_t> bytes)  // NOLINT: a packed buffer is the common form
      : data_(bytes.data()), bytes_(bytes.size()) {}
  // By address: rows.size() rows of `row_bytes` each, row i at rows[i].
  GradientRows(absl::Span<const uint8_t* const> rows, size_t row_bytes)
      : at_(rows.data()), bytes_(rows.size() * row_bytes) {}

  // The bytes of all rows.
  size_t bytes() const { return bytes_; }
  // Row i of a push whose rows are `row_bytes` long.
  const uint8_t* row(size_t i, size_t row_bytes) const {
    return at_ != nullptr ? at_[i] : data_ + i * row_bytes;
  }
  // The packed buffer; null when the rows are given by address.
  const uint8_t* packed() const { return at_ != nullptr ? nullptr : data_; }

 private:
  const uint8_t* data_ = nullptr;
  const uint8_t* const* at_ = nullptr;
  size_t bytes_ = 0;
};

class EmbeddingStore {
 public:
  virtual ~EmbeddingStore();
  EmbeddingStore(const EmbeddingStore&) = delete;
  EmbeddingStore& operator=(const EmbeddingStore&) = delete;

  const TableConfig& config() const { return config_; }

  // Copies the rows of `keys` into `out` ((n, dim) of `out_dtype`), in key
  // order. A missing key is answered with its initial row (rounded to the
  // storage dtype, exactly what an insert would store) and is not stored.
  // `found`, if given, receives n flags (1 = stored). Counts as an access
  // for LRU/LFU.
  absl::StatusOr<FindResult> Find(absl::Span<const uint64_t> keys, DType out_dtype,
                                  absl::Span<uint8_t> out, uint8_t* found = nullptr);

  // As Find, but missing keys are inserted with their initial row first
  // (evicting by the table's policy when full). With admission
  // (config().admission), each missing occurrence counts in the sketch and
  // the key is inserted only once it has been counted min_count times.
  absl::StatusOr<FindResult> FindOrInsert(absl::Span<const uint64_t> keys, DType out_dtype,
                                          absl::Span<uint8_t> out);

  // Applies `grads` ((n, dim) of `grad_dtype`, every element finite) with the
  // table's optimizer. Gradients of duplicate keys are summed in key order
  // first, then each distinct key gets one optimizer step. Missing keys are
  // inserted with their initial row first; with admission, only those
  // counted min_count times, the others' gradients are dropped and counted.
  absl::StatusOr<PushResult> ApplyGradients(absl::Span<const uint64_t> keys, DType grad_dtype,
                                            absl::Span<const uint8_t> grads);

  // The rows of `keys` with their optimizer state, without any effect on
  // the table: nothing is inserted, no admission count, eviction score or
  // TTL stamp changes (so Peek may run at any moment without changing what
  // later calls do). An absent key is answered with the row and state an
  // insert would give it. Each row is read atomically with respect to
  // pushes. A trainer's early fetch uses it to bring rows forward with
  // opt::StepStoredRow. UNIMPLEMENTED where a store cannot (the CUDA store).
  absl::Status Peek(absl::Span<const uint64_t> keys, const PeekedRows& out);
  // Whether Peek is implemented.
  virtual bool CanPeek() const { return false; }

  // Removes the keys; returns how many were stored. Missing keys are ignored.
  absl::StatusOr<size_t> Erase(absl::Span<const uint64_t> keys);

  // Appends up to `max_rows` rows to `out` (after clearing it) and advances
  // the cursor.
  absl::Status Export(ExportCursor* cursor, size_t max_rows, ExportedRows* out);

  // Inserts or overwrites the given rows, state, steps and scores. Shapes as
  // in ExportedRows; values are rounded to the storage dtype.
  absl::Status Import(const ExportedRows& rows);

  // Copies part of a snapshot into `out` (after clearing it) and advances
  // the cursor; call until `cursor->done`, with the same kind throughout.
  // A store copies its rows in units (a lock stripe of the CPU store, the
  // whole table for the CUDA store), each atomically with respect to every
  // other call, so a row is never half-updated and every row that stayed
  // stored through the scan is copied exactly once; a batch ends at a unit
  // boundary once it holds `max_rows` rows (so it may hold more). A unit is
  // marked clean as it is copied: the next kDelta holds only what changed
  // after it. For a snapshot of one instant the caller must hold off
  // writers (the shard's checkpoint cut does); lookups may run meanwhile.
  // FAILED_PRECONDITION for kDelta when no snapshot was taken before
  // (changes are tracked from the first snapshot on) and UNIMPLEMENTED where
  // a store cannot track changes: take a kFull one then.
  absl::Status Snapshot(SnapshotKind kind, ExportCursor* cursor, size_t max_rows,
                        SnapshotBatch* out);


  // Counters and sizes; the admission counts are the base class's own.
  StoreStats Stats() const;

  // TTL (config().ttl): a row is stamped with the store's TTL time whenever
  // it is inserted, looked up or pushed. The owner advances that time
  // (seconds since start, or its latest step) and evicts the rows stamped
  // before `older_than`, returning how many (counted in Stats().expired).
  // The default: no TTL support (UNIMPLEMENTED from EvictExpired).
  virtual void SetTtlTime(uint32_t now) { (void)now; }
  virtual absl::StatusOr<uint64_t> EvictExpired(uint32_t older_than);

  // A hint that about `rows` more rows are coming (a restore knows how
  // many), so that the store can size its index once instead of growing it
  // step by step. May do nothing.
  virtual void Reserve(uint64_t rows) { (void)rows; }

  // Checks the shapes and values of a push without applying it; the same
  // checks ApplyGradients makes. Lets a caller validate a multi-table request
  // before changing any table.
  absl::Status ValidateGradients(absl::Span<const uint64_t> keys, DType grad_dtype,
                                 const GradientRows& grads) const;

  // ApplyGradients for a caller that has already had ValidateGradients
  // accept exactly these arguments: only the (cheap) shape checks are
  // repeated, not the scan of every gradient value.
  absl::StatusOr<PushResult> ApplyValidatedGradients(absl::Span<const uint64_t> keys,
                                                     DType grad_dtype, const GradientRows& grads);

 protected:
  explicit EmbeddingStore(TableConfig config);

  virtual StoreStats StatsImpl() const = 0;

  // Arguments are validated; see the public twins for the contracts.
  virtual absl::StatusOr<FindResult> FindImpl(absl::Span<const uint64_t> keys, DType out_dtype,
                                              uint8_t* out, uint8_t* found, bool insert) = 0;
  virtual absl::StatusOr<PushResult> ApplyGradientsImpl(absl::Span<const uint64_t> keys,
                                                        DType grad_dtype,
                                                        const GradientRows& grads) = 0;
  virtual absl::StatusOr<size_t> EraseImpl(absl::Span<const uint64_t> keys) = 0;
  // The default: UNIMPLEMENTED.
  virtual absl::Status PeekImpl(absl::Span<const uint64_t> keys, const PeekedRows& out);
  virtual absl::Status ExportImpl(ExportCursor* cursor, size_t max_rows, ExportedRows* out) = 0;
  virtual absl::Status ImportImpl(const ExportedRows& rows) = 0;
  // The default suits a store whose calls are serialised: a kFull snapshot
  // is one ExportImpl call over every row (atomic, one unit); kDelta is
  // UNIMPLEMENTED.
  virtual absl::Status SnapshotImpl(SnapshotKind kind, ExportCursor* cursor, size_t max_rows,
                                    SnapshotBatch* out);

 private:
  absl::Status ValidateRowBuffer(absl::string_view field, size_t n, DType dtype,
                                 size_t bytes) const;
  // FindOrInsert and ApplyGradients through the admission filter.
  absl::StatusOr<FindResult> FindOrInsertAdmitted(absl::Span<const uint64_t> keys, DType dtype,
                                                  uint8_t* out);
  absl::StatusOr<PushResult> ApplyAdmitted(absl::Span<const uint64_t> keys, DType grad_dtype,
                                           const GradientRows& grads);

  const TableConfig config_;
  std::unique_ptr<CountMinSketch> admission_;  // null: admission off
  std::atomic<uint64_t> admission_rejected_{0};
  std::atomic<uint64_t> admission_dropped_{0};
};

// RESOURCE_EXHAUSTED for `failed` new keys a full table refused; `what` says
// what became of them ("new keys not inserted", ...). Every store words it so.
absl::Status TableFullError(const TableConfig& config, size_t failed, absl::string_view what);

// Creates the host-memory store for `config` (validated here).
absl::StatusOr<std::unique_ptr<EmbeddingStore>> NewCpuStore(const TableConfig& config);

}  // namespace ember
