// CpuStore: the host-memory EmbeddingStore.
//
// Design (see docs/design.md for the reasoning and the measurements):
// - The table is split into lock stripes (1..64, a power of two, chosen from
//   the capacity) by the top bits of StoreHash(key). Each stripe has its own
//   reader/writer lock, so lookups share locks and never queue behind one
//   table-wide lock; pushes lock only the stripes their keys fall in.
// - A stripe is an open-addressing index (linear probing, 4-byte entries:
//   24-bit row number + 8-bit hash tag, load factor <= 3/4) over a dense
//   array of row records kept in fixed-size chunks. A record is
//   [key | score | step (Adam only) | row | optimizer state], so a lookup
//   touches one index line and one record.
// - A lookup batch is cut into L2-sized sub-batches sorted by stripe; each
//   stripe's keys go through short, independent passes (probe the index and
//   prefetch the record; then confirm and copy), so the CPU keeps many
//   misses in flight. That is where the speed over a node-based map comes
//   from.
// - Capacity is split evenly over the stripes; a full stripe evicts the row
//   with the lowest score among 16 sampled rows (all of them when it holds
//   16 or fewer, which makes eviction exact for small tables).
// - Per-row overhead beyond key, row and state: the 4-byte score plus 4 to
//   10.7 bytes of index, plus at most one partly used chunk per stripe.
// - Change tracking for delta snapshots starts with the first snapshot: a
//   bit per row (set when a row is inserted or updated) and, per stripe, the
//   keys whose bit was set or whose row was removed since the stripe's last
//   snapshot, so a delta costs in proportion to the changes, not the table.
// - With a TTL the record also holds the row's last-touched stamp (4 bytes
//   after the step); expiry scans the stripes, one writer lock at a time.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "kernels/embedding_store.h"

namespace ember {
namespace cpu_detail {
struct Slot;  // kernels/cpu/cpu_store_layout.h
}  // namespace cpu_detail

class CpuStore final : public EmbeddingStore {
 public:
  // Most rows one stripe can index (24-bit row numbers).
  static constexpr uint32_t kMaxRowsPerStripe = (1u << 24) - 1;
  static constexpr uint32_t kMaxStripes = 64;
  // Stripes of a table without a capacity: at most kUnboundedStripes x
  // kMaxRowsPerStripe (about 268M) rows per table per shard.
  static constexpr uint32_t kUnboundedStripes = 16;
  // Rows sampled to choose an eviction victim.
  static constexpr uint32_t kEvictionSample = 16;

  static absl::StatusOr<std::unique_ptr<CpuStore>> Create(const TableConfig& config);
  ~CpuStore() override;
  bool CanPeek() const override { return true; }

  void Reserve(uint64_t rows) override;
  void SetTtlTime(uint32_t now) override;
  absl::StatusOr<uint64_t> EvictExpired(uint32_t older_than) override;

  uint32_t num_stripes() const { return num_stripes_; }
  // Bytes of one row record (key, score, step, row, state).
  size_t record_bytes() const { return stride_; }

 protected:
  StoreStats StatsImpl() const override;
  absl::StatusOr<FindResult> FindImpl(absl::Span<const uint64_t> keys, DType out_dtype,
                                      uint8_t* out, uint8_t* found, bool insert) override;
  absl::StatusOr<PushResult> ApplyGradientsImpl(absl::Span<const uint64_t> keys,
                                                DType grad_dtype,
                                                const GradientRows& grads) override;
  absl::StatusOr<size_t> EraseImpl(absl::Span<const uint64_t> keys) override;
  absl::Status PeekImpl(absl::Span<const uint64_t> keys, const PeekedRows& out) override;
  absl::Status ExportImpl(ExportCursor* cursor, size_t max_rows, ExportedRows* out) override;
  absl::Status ImportImpl(const ExportedRows& rows) override;
  absl::Status SnapshotImpl(SnapshotKind kind, ExportCursor* cursor, size_t max_rows,
                            SnapshotBatch* out) override;

 private:
  struct Stripe;
  struct Batch;

  explicit CpuStore(const TableConfig& config);

  uint32_t StripeOf(uint64_t hash) const {
    return stripe_shift_ == 64 ? 0 : static_cast<uint32_t>(hash >> stripe_shift_);
  }
  uint8_t* Record(const Stripe& s, uint32_t row) const;
  uint32_t FindRow(const Stripe& s, uint64_t key, uint64_t hash) const;
  uint32_t FirstCandidate(const Stripe& s, uint64_t hash) const;
  // A staged find over the keys of one stripe in a Batch, so that the
  // cache misses of many keys overlap, each access requested a pass before
  // it is made: PrefetchIndexLines(b, stripe) (no lock: it reads the index
  // views) while the stripe before is processed; then, under the stripe's
  // lock, CandidateRows: each slot's row becomes the row its home index
  // entry names (probing where that entry is another key's), or kNoRow,
  // with `record_bytes` of its record requested; then, a pass later,
  // ConfirmedRow(slot, key): the key's row, or kNoRow.
  void PrefetchIndexLines(const Batch& b, uint32_t stripe) const;
  void CandidateRows(const Stripe& s, const Batch& b, uint32_t stripe, size_t record_bytes) const;
  uint32_t ConfirmedRow(const Stripe& s, const cpu_detail::Slot& slot, uint64_t key) const;
  uint32_t SlotOfRow(const Stripe& s, uint64_t hash, uint32_t row) const;
  // Inserts an absent key with its initial row and state (or, with
  // `initialize` false, with whatever the caller writes next); returns its
  // row, or kNoRow if the stripe is full and may not evict. Its score is
  // row::kUntouchedScore: the access that inserts it touches it next.
  uint32_t InsertRow(Stripe& s, uint64_t key, uint64_t hash, bool initialize = true);
  void EvictOne(Stripe& s);
  void RemoveRow(Stripe& s, uint32_t row);
  void DeleteSlot(Stripe& s, size_t slot);
  void GrowIndex(Stripe& s, size_t new_size);
  void PlaceEntry(Stripe& s, uint64_t hash, uint32_t row);
  void Touch(uint8_t* record, uint32_t clock) const;
  // Writes the key's initial row and the optimizer's initial state.
  void InitializeRow(uint8_t* record, uint64_t key) const;
  // Change tracking (on once tracking_ is set): the row was inserted or
  // updated; the row is about to be removed (and `last` moved into it).
  void MarkChanged(Stripe& s, uint32_t row, uint64_t key);
  void MarkRemoved(Stripe& s, uint32_t row, uint32_t last, uint64_t key);
  // Appends one record to `out` in Export's format.
  void AppendRow(const uint8_t* record, ExportedRows* out) const;
  void CopyOut(const uint8_t* record, DType out_dtype, uint8_t* out) const;
  void InitialRowOut(uint64_t key, DType out_dtype, uint8_t* out) const;
  // One optimizer step on a record; `grad` is dim fp32 at any address,
  // `scratch` holds dim floats.
  void ApplyOptimizer(uint8_t* record, const void* grad, float* scratch) const;
  // Calls fn(stripe, slot) for every key, sub-batch by sub-batch, with the
  // key's stripe locked exclusively.
  template <typename Fn>
  void ForEachKeyLocked(absl::Span<const uint64_t> keys, Fn fn);
  // Groups keys[base, base + count) by stripe into this thread's scratch.
  void GroupByStripe(absl::Span<const uint64_t> keys, size_t base, size_t count,
                     Batch* batch) const;

  const uint32_t dim_;
  const DType dtype_;
  const size_t value_bytes_;
  const size_t state_floats_;  // per row
  const bool has_step_;
  const bool has_ttl_;
  size_t ttl_offset_ = 0;  // the last-touched stamp, with a TTL
  size_t value_offset_ = 0;
  size_t state_offset_ = 0;
  size_t stride_ = 0;
  uint32_t chunk_shift_ = 0;  // rows per chunk = 1 << chunk_shift_
  uint32_t num_stripes_ = 1;
  uint32_t stripe_shift_ = 64;
  std::unique_ptr<Stripe[]> stripes_;

  std::atomic<uint32_t> clock_{0};
  // Set by the first snapshot; changes are tracked from then on.
  std::atomic<bool> tracking_{false};
  std::atomic<uint32_t> ttl_now_{0};
  std::atomic<uint64_t> expired_{0};
  std::mutex snapshot_mu_;  // one Snapshot call at a time
  std::atomic<uint64_t> rows_{0};
  std::atomic<uint64_t> memory_bytes_{0};
  std::atomic<uint64_t> inserts_{0};
  std::atomic<uint64_t> evictions_{0};
  std::atomic<uint64_t> insert_failures_{0};
};

}  // namespace ember
