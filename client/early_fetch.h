// EarlyFetch: a synchronous (s = 0) step's rows fetched while the step
// before it computes, then brought forward exactly. docs/client.md
// ("Early fetch at s = 0") states the rule and why it is exact.
//
// At s = 0 step t + 1 must see every push of step t, which exists only once
// step t's backward is done. So the pipeline (or the node's StepMerger)
// peeks at step t + 1's rows while step t computes (ExchangeRequest.peek:
// rows as of step t - 1 with their optimizer state, no effect on the
// shard), and once step t's gradients are known it applies them to the
// rows both steps share with the shard's own code (opt::StepStoredRow) on
// the same inputs: the bits the shard computes when the push arrives. The
// lookup of step t + 1 still travels after the push, with omit_rows, so the
// shard sees the calls of plain s = 0 in the same order.
//
// That is exact only while nothing but this worker's own pushes changes the
// rows. A peeked step is patched only if every shard said every table is
// replayable (no capacity limit, TTL or admission; a store that can peek)
// and no other SSP worker is registered; otherwise (Patchable() false) the
// caller fetches it after the push, as without early fetch, but of the
// replayable tables only the rows that pushes changed since the peek
// (AskChanged, ChangedRowAddresses over PeekedRows): with other workers,
// the rows any worker's push of the step before wrote.
//
// Memory: host. Not thread-safe: one network thread (a pipeline's, or the
// merger's leader) uses it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/dedup.h"
#include "client/request_plan.h"
#include "common/dtype.h"
#include "ember/client.h"
#include "ember/exchange_answer.h"
#include "kernels/table_config.h"

namespace ember {

class EarlyFetch {
 public:
  // How the shards hold one table: what a row update needs.
  struct Table {
    uint32_t dim = 0;
    DType storage = DType::kFp32;
    OptimizerConfig optimizer;
  };
  // The tables `names`, as the cluster's ListTables describes them.
  static absl::StatusOr<std::vector<Table>> Describe(Client& client,
                                                     const std::vector<std::string>& names);

  // `patch` false: never bring a step forward here; every peeked step is
  // fetched after the push, as only the rows changed since the peek
  // (PipelineOptions::early_fetch_patch), and the peek asks for no
  // optimizer state.
  explicit EarlyFetch(std::vector<Table> tables, bool patch = true);
  ~EarlyFetch();

  // Adds a peek of step `step` to each shard's request: `keys` (per table,
  // unique) as `plan` routes them, rows as of step - 2 (which the SSP clock
  // waits for), with the optimizer state of the keys in `previous` only:
  // the keys of step - 1 (per table, unique, in the order of that push's
  // gradients), whose push will patch them. Both are read now only; the
  // plan must stay unchanged until Receive. Returns the key bytes.
  uint64_t FillPeek(int64_t step, const std::vector<std::vector<uint64_t>>& keys,
                const RequestPlan& plan, const std::vector<std::vector<uint64_t>>& previous,
                uint32_t worker_id, std::vector<v1::ExchangeRequest>* requests);

  // The answers to FillPeek's requests for step `step`. INTERNAL if an
  // answer's shape is not the one asked for.
  absl::Status Receive(int64_t step, const RequestPlan& plan,
                       const std::vector<ExchangeAnswer>& answers);

  // The peeked step waiting for its patch, if any.
  std::optional<int64_t> pending() const;
  // Whether the pending step's rows can be brought forward (see above).
  bool Patchable() const;
  // Brings the pending step's rows forward through the push of the step
  // before: grads[tb] holds previous[tb].size() x dim fp32 (the gradient
  // rows exactly as pushed). Returns, per table, its rows (keys[tb].size()
  // x dim fp32) valid until the next Patch, and ends the pending step.
  // FAILED_PRECONDITION if nothing is pending or it is not Patchable.
  absl::StatusOr<std::vector<const float*>> Patch(const std::vector<const float*>& grads);
  // Patch with each gradient row by address: grad_at[tb][k] is key k's
  // (a StepMerger's sums, in its push requests).
  absl::StatusOr<std::vector<const float*>> Patch(const std::vector<std::vector<float*>>& grad_at);
  // When the pending step is not Patchable: its lookup after the push, as
  // RequestPlan::FillLookup wrote it for `shard` (with rows), asks each
  // replayable table for the rows changed since the peek only
  // (TableLookup.changed_since), to be laid over PeekedRows.
  void AskChanged(uint32_t shard, const RequestPlan& plan, v1::LookupRequest* lookup) const;
  // The pending step's peeked rows per table (keys x dim fp32, in the
  // peek's key order; null for a table that is not replayable), valid until
  // the next Receive, Patch or Drop.
  std::vector<const float*> PeekedRows() const;
  // After a Patch: the patched step's lookup as the shard must still see
  // it after the push, for `shard` (as `plan` routes it): its effects only
  // (omit_rows), and only for the keys the peek found absent. On a
  // replayable table a lookup of a stored key changes nothing (no eviction
  // score, TTL stamp or admission count: none is kept), while an absent
  // key is inserted then, as plain s = 0 inserts it. Adds no table when no
  // key was absent; returns the key bytes.
  uint64_t FillEffects(uint32_t shard, const RequestPlan& plan, v1::LookupRequest* lookup) const;
  // The pending step's lookup (step `step`, routed by `plan`) after the
  // push of the step before, as plain s = 0 has it, in each request's
  // lookup stamped by `clock`: its effects only (FillEffects) when it was
  // `patched`, else its rows changed since the peek (FillLookup with
  // AskChanged). A shard with nothing to do gets no lookup. Returns the
  // key bytes.
  uint64_t FillAfterPush(int64_t step, bool patched, const RequestPlan& plan,
                         const LookupClock& clock,
                         std::vector<v1::ExchangeRequest>* requests) const;
  // Ends the pending step unpatched (its rows came after the push instead).
  void Drop();

  // Of the last Patch: rows brought forward (keys both steps share), and
  // the bytes the peek received (rows, optimizer state, step counts).
  uint64_t rows_patched() const { return rows_patched_; }
  uint64_t peek_bytes() const { return peek_bytes_; }

 private:
  struct Peeked;
  // Whether merged key u of table tb gets the patch, so that its peek asks
  // for its optimizer state: it was in the previous step's push.
  bool Patches(const Peeked& p, size_t tb, uint32_t u) const;
  // Patch's work; grad(tb, k) is the address of key k's gradient row.
  template <typename GradOf>
  absl::StatusOr<std::vector<const float*>> PatchWith(GradOf grad);
  const std::vector<Table> tables_;
  const bool patch_;
  std::unique_ptr<Peeked> filling_;  // asked for, not answered yet
  std::unique_ptr<Peeked> peeked_;   // pending
  std::unique_ptr<Peeked> patched_;  // the last patched: its rows are in use
  std::unique_ptr<Peeked> spare_;    // memory for the next Receive
  KeyDeduplicator dedup_;
  uint64_t rows_patched_ = 0;
  uint64_t peek_bytes_ = 0;
};

}  // namespace ember
