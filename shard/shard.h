// Shard: the core of one ember-server process, without any networking.
//
// It owns the tables of this shard (one EmbeddingStore each), validates
// requests completely before changing anything, checks that every key is
// routed here, and runs lookups and pushes against the stores. The gRPC
// services are thin wrappers over it, and tests drive it directly.
//
// Thread safety: every method may be called concurrently. Dropping a table
// while requests use it is safe: in-flight requests finish on the old store.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "common/key_router.h"
#include "common/rw_mutex.h"
#include "ember/v1/admin_service.pb.h"
#include "ember/v1/embedding_service.pb.h"
#include "kernels/embedding_store.h"
#include "kernels/store_factory.h"
#include "shard/shard_metrics.h"
#include "shard/ssp_clock.h"
#include "shard/push_gate.h"

namespace ember {

// A push's gradients left where they arrived (ReceivedExchange): for each
// table of the request, the pieces of its `gradients` value, whose field in
// the message is then empty; null for a table whose value was not on the
// wire (empty). An empty span: every table's gradients are in its field.
using GradientPieces = absl::Span<const std::vector<absl::string_view>* const>;

// A shard's state at a checkpoint's cut, copied to memory (Shard::Snapshot).
struct ShardSnapshot {
  struct Table {
    v1::TableConfig config;  // normalized
    // true: every row; false: changes since the previous snapshot.
    bool full = true;
    std::vector<SnapshotBatch> batches;
    uint64_t rows = 0;
    uint64_t removed_keys = 0;
  };
  // The cut; -1 when no worker was registered and no step was asked for.
  int64_t step = -1;
  // Registered workers' progress at the cut.
  std::map<uint32_t, SspClock::Progress> workers;
  std::vector<Table> tables;  // sorted by name
  absl::Duration cut_wait;    // waiting for the workers to reach the cut
  absl::Duration copy;        // copying the tables, later pushes held
};

// A restored table, built outside the shard and handed to InstallRestored.
struct RestoredTable {
  v1::TableConfig config;  // normalized
  std::unique_ptr<EmbeddingStore> store;
};

// Where a shard sits in its cluster: replaced whole by a restore before
// serving, and by a move (Shard::InstallMoved) while it serves.
struct ShardPlacement {
  uint32_t index = 0;  // in [0, count)
  uint32_t count = 1;
  KeyRouter router;  // of `count` shards
  // GetShardInfoResponse.routing_epoch; 0 while joining.
  uint64_t epoch = 1;
  // Waiting for a move to give it a place (ember-server --join), or left
  // the cluster by one: serves no Lookup, Push or Exchange.
  bool joining = false;
  bool retired = false;
  // The cluster's addresses by index, as the last move named them.
  std::vector<std::string> addresses;
};

struct ShardOptions {
  // This shard's index in [0, shard_count).
  uint32_t shard_index = 0;
  // Shards in the cluster.
  uint32_t shard_count = 1;
  // How keys are routed to shards (common/key_router.h) when the shard
  // starts empty. A restore of a checkpoint part of the same shard count
  // keeps the routing the checkpoint records; a restore that reshards
  // routes by this one.
  std::string routing = kDefaultRouting;
  // Start outside any cluster, serving nothing until a move's CommitMove
  // gives the shard its place (shard_index and shard_count are ignored).
  bool join = false;
  // Most keys one Lookup or Push may carry over all its tables.
  uint64_t max_keys_per_request = uint64_t{8} << 20;
  // Largest request or response message; a lookup whose answer would be
  // larger is refused up front.
  uint64_t max_message_bytes = uint64_t{256} << 20;
  // Most tables on the shard (CreateTable beyond: RESOURCE_EXHAUSTED).
  uint32_t max_tables = 1024;
  // Most rows over all the shard's tables; 0: no limit but the tables'
  // capacities and the machine's memory. A writing lookup or a push that
  // would insert past it is refused whole (RESOURCE_EXHAUSTED) and changes
  // nothing; requests running at the same time may overshoot it by at most
  // their keys.
  uint64_t max_rows = 0;
  // Longest a lookup waits for the consistency clock (its own deadline may
  // end the wait earlier).
  absl::Duration max_ssp_wait = absl::Seconds(60);
  // How long the write log (which rows recent pushes wrote, for early
  // fetch's changed_since) is kept after the last peek; until a trainer
  // peeks, pushes record nothing. absl::InfiniteDuration(): always kept.
  absl::Duration write_log_keep = absl::Seconds(60);
  // Where the tables live: host memory, or one GPU's memory.
  StoreDevice device;

  absl::Status Validate() const;
};

class Shard {
 public:
  explicit Shard(ShardOptions options);

  // The options it was started with; its place in the cluster is
  // placement() (a move changes it while serving).
  const ShardOptions& options() const { return options_; }
  // Its place now: index, shard count, the routing it checks keys against
  // and the routing epoch (1 for a shard that starts empty, the
  // checkpoint's for one restored, one more after every reshard or move).
  std::shared_ptr<const ShardPlacement> placement() const;
  uint64_t routing_epoch() const { return placement()->epoch; }
  // ABORTED, naming both epochs and what to do, when `epoch` (a call's
  // ember-routing-epoch; 0: not sent, not checked) is not this shard's:
  // the call was routed by another shard count or routing and must not be
  // served. A joining shard refuses every call (UNAVAILABLE), a retired one
  // every call (ABORTED, naming the cluster it left for). `rpc` names the call.
  absl::Status CheckRoutingEpoch(uint64_t epoch, absl::string_view rpc) const;

  // Creates a table; see AdminService.CreateTable for the semantics.
  absl::Status CreateTable(const v1::TableConfig& config, v1::CreateTableResponse* response);
  // NOT_FOUND if the table does not exist.
  absl::Status DropTable(absl::string_view name);
  // Sorted by name.
  void ListTables(v1::ListTablesResponse* response) const;
  void GetShardInfo(v1::GetShardInfoResponse* response) const;

  // `deadline` bounds the wait for the consistency clock when the request
  // carries a step (see LookupRequest.step).
  absl::Status Lookup(const v1::LookupRequest& request, v1::LookupResponse* response,
                      absl::Time deadline = absl::InfiniteFuture());
  // `in_place`: see GradientPieces; its pieces must stay unchanged through
  // the call.
  absl::Status Push(const v1::PushRequest& request, v1::PushResponse* response,
                    GradientPieces in_place = {});
  // Whether the request could wait for the consistency clock (its lookup
  // has a step that some worker has not reached, counting the request's own
  // push): the gRPC service runs such calls off its completion threads.
  bool MayWait(const v1::LookupRequest& lookup, const v1::PushRequest* push = nullptr) const;
  // Push, then Lookup; see EmbeddingService.Exchange.
  absl::Status Exchange(const v1::ExchangeRequest& request, v1::ExchangeResponse* response,
                        absl::Time deadline = absl::InfiniteFuture(),
                        GradientPieces in_place = {});
  // Exchange in two halves, for a caller that runs the lookup elsewhere:
  // the push (never waits), then the lookup (may wait; its error says the
  // push was applied). Exchange is ExchangePush then ExchangeLookup.
  absl::Status ExchangePush(const v1::ExchangeRequest& request, v1::ExchangeResponse* response,
                            GradientPieces in_place = {});
  absl::Status ExchangeLookup(const v1::ExchangeRequest& request, v1::ExchangeResponse* response,
                              absl::Time deadline);
  // Counts this shard's traffic in `metrics` (which must outlive the shard).
  // Call before serving. The gauges come from shard/shard_gauges.h.
  void SetMetrics(ShardMetrics* metrics);

  // Copies the shard's state at a step boundary into memory: holds pushes of
  // registered workers at steps > the cut, waits (until `deadline`) for
  // every registered worker to have applied the cut step, copies every
  // table (lookups go on), then lets the held pushes go. The cut is `step`,
  // or without one the latest step a registered worker has pushed or
  // started to push. `delta`: tables copy only their changes since the
  // previous snapshot where their store can (ShardSnapshot::Table::full
  // says which did). One snapshot at a time (later callers wait).
  // FAILED_PRECONDITION if a worker already pushed past `step`;
  // DEADLINE_EXCEEDED naming the slowest worker.
  //
  // `as_is`: for a shard that has stopped serving (the checkpoint on exit),
  // where workers at different steps would never reach a common cut: nothing
  // is held or waited for, `step` is ignored, the snapshot holds every
  // worker's progress as it is (gaps included) and its step is the smallest
  // worker's applied step.
  //
  // `hold_for_move`: a move's cut. Once the copy is made, pushes of later
  // steps, and pushes of unregistered workers, are refused (UNAVAILABLE,
  // which clients retry) until InstallMoved or ReleaseMoveHold: none is
  // applied to tables the move replaces, and no server thread waits.
  // Any snapshot but `as_is` is UNAVAILABLE while a move holds.
  absl::StatusOr<ShardSnapshot> Snapshot(std::optional<int64_t> step, bool delta,
                                         absl::Time deadline, bool as_is = false,
                                         bool hold_for_move = false);
  // Whether a move's cut holds pushes (refusing those past it).
  bool move_held() const;
  // Ends a move's hold under the placement the shard has (an aborted
  // move): pushes past the cut are applied again. Returns whether it held.
  bool ReleaseMoveHold();

  // Advances the TTL time of every table with a TTL (`since_start` in
  // seconds, or the latest step any registered worker has pushed) and
  // evicts the rows that expired. The server calls it every second; tests
  // call it directly. Returns the rows evicted.
  uint64_t ExpireRows(absl::Duration since_start);

  // Replaces every table, the consistency clock, the routing and its epoch
  // with restored ones (`router`: the restored keys' routing, of this
  // shard's count). Only before serving: requests running meanwhile may see
  // either state. `source` names the checkpoint (GetShardInfo.restored_from).
  void InstallRestored(std::vector<RestoredTable> tables,
                       const std::map<uint32_t, SspClock::Progress>& workers,
                       const KeyRouter& router, uint64_t routing_epoch, const std::string& source);
  // A move's commit while serving: replaces every table, the clock and the
  // placement with the new cluster's (tables and workers from the move's
  // cut), then ends the move's hold: pushes of the old routing epoch are
  // refused from then on by the epoch check. Requests that hold a table of
  // before (a lookup waiting for the clock) are refused with ABORTED once
  // they get past their wait. `source` names the cut (restored_from).
  void InstallMoved(std::vector<RestoredTable> tables,
                    const std::map<uint32_t, SspClock::Progress>& workers, ShardPlacement placement,
                    const std::string& source);

  absl::Status RegisterWorker(const v1::RegisterWorkerRequest& request,
                              v1::RegisterWorkerResponse* response);
  void UnregisterWorker(const v1::UnregisterWorkerRequest& request,
                        v1::UnregisterWorkerResponse* response);

  // Read API for gauges (shard/shard_gauges.h). Thread-safe.
  struct TableStats {
    std::string name;
    StoreStats stats;
  };
  // Every table's store counters, in no order.
  std::vector<TableStats> AllTableStats() const;
  // The latest step each registered worker has applied on this shard.
  std::map<uint32_t, int64_t> AppliedSteps() const { return clock_.AppliedSteps(); }

 private:
  // Lookup, with `reserved_bytes` of the response message already taken
  // (an Exchange's push answer) counted against max_message_bytes.
  absl::Status LookupWithin(const v1::LookupRequest& request, v1::LookupResponse* response,
                            absl::Time deadline, uint64_t reserved_bytes);

  struct Table {
    Table(v1::TableConfig c, std::unique_ptr<EmbeddingStore> s)
        : config(std::move(c)), store(std::move(s)) {}
    v1::TableConfig config;  // normalized
    std::unique_ptr<EmbeddingStore> store;
    ShardMetrics::TableSeries* series = nullptr;  // null without metrics
    // Replaced by a move: a request holding it must not read or write it.
    std::atomic<bool> moved_out{false};
  };
  // A table entry of a request, resolved and checked.
  struct Resolved {
    std::shared_ptr<Table> table;
    absl::Span<const uint64_t> keys;
    std::vector<uint64_t> key_storage;  // used when the key bytes were unaligned
    DType dtype = DType::kFp32;
  };

  // A read of rows (a lookup or a peek), for ResolveRead's messages: the
  // RPC (Resolve's), what comes before "field 'step'", the entries' field
  // name, what the answer is called and holds, and whether its rows are
  // always fp32 (a peek's) or of the entry's dtype.
  struct ReadKind {
    absl::string_view rpc, what, entries, answer, contents;
    bool fp32_rows;
  };
  // One entry's share of the answer's size in bytes, or its own error.
  using EntryBound = std::function<absl::StatusOr<uint64_t>(
      const v1::TableLookup& entry, absl::string_view field, const Resolved& resolved)>;
  // What a read checks before the first row is read or inserted: the step,
  // the key count, each table entry (resolved), and the answer's size (the
  // entries' bounds plus `reserved_bytes`) against max_message_bytes.
  absl::StatusOr<std::vector<Resolved>> ResolveRead(const v1::LookupRequest& request,
                                                    const ReadKind& kind, uint64_t reserved_bytes,
                                                    const EntryBound& bound);
  // Waits until the clock allows `request` (a lookup or a peek, `what` in
  // the error) when it carries a step; DEADLINE_EXCEEDED past `deadline`
  // or max_ssp_wait.
  absl::Status WaitForClock(const v1::LookupRequest& request, absl::string_view what,
                            absl::Time deadline);
  // An Exchange's peek (ExchangeRequest.peek), in shard_peek.cc: rows with
  // their optimizer state, without effects on the tables.
  // `reserved_bytes` of the answer are taken by the rest of the message.
  absl::Status Peek(const v1::LookupRequest& request, v1::LookupResponse* response,
                    absl::Time deadline, uint64_t reserved_bytes);
  // Whether a table's rows change only by pushes, so that a trainer may
  // bring a peeked row forward itself (TableRows.replayable) and the write
  // log tells which rows changed: a store that can peek, no capacity limit
  // (no eviction, no insert failures), no TTL, no admission.
  static bool Replayable(const EmbeddingStore& store);
  // A lookup's changed_since and write_log (`out`: its table's answer with
  // a row per key of `r`): keeps only the rows pushes of steps >= since
  // wrote, and says which in out->changed, when the write log can tell.
  void KeepChangedRows(const Resolved& r, int64_t since, uint64_t token, v1::TableRows* out) const;
  // Resolves the table name and keys of one request entry; checks the key
  // byte size, duplicates of the table in the request and key ownership.
  absl::Status Resolve(absl::string_view rpc, absl::string_view field,
                       const std::string& table_name,
                       const std::string& key_bytes, v1::DType dtype,
                       std::vector<Resolved>* resolved);
  // Resolve's checks once the table is known.
  absl::Status ResolveTable(const ShardPlacement& placement, absl::string_view field,
                            const std::string& table_name, const std::string& key_bytes,
                            v1::DType dtype, const std::vector<Resolved>& resolved,
                            Resolved* out) const;
  // Applies a validated push to the stores.
  absl::Status Apply(const v1::PushRequest& request, const std::vector<Resolved>& resolved,
                     const std::vector<GradientRows>& grads, v1::PushResponse* response);
  absl::Status CheckKeyCount(uint64_t total_keys) const;
  // With max_rows: refuses a request whose `writes` entries of `resolved`
  // would insert past it (counting their missing keys only near the limit).
  absl::Status CheckRowBudget(const std::vector<Resolved>& resolved,
                              const std::vector<bool>& writes) const;
  absl::Status CheckOwnership(const ShardPlacement& placement, absl::string_view table,
                              absl::Span<const uint64_t> keys) const;
  // ABORTED if a move replaced one of `resolved`'s tables (`rpc` waited past
  // it): nothing of the request may touch them any more.
  static absl::Status CheckNotMoved(const std::vector<Resolved>& resolved, absl::string_view rpc);
  // Replaces tables, clock and placement (InstallRestored, InstallMoved).
  void Install(std::vector<RestoredTable> restored,
               const std::map<uint32_t, SspClock::Progress>& workers,
               std::shared_ptr<const ShardPlacement> placement, const std::string& source);
  // A DATA_LOSS of the clock (lost steps) with this shard and what it was
  // restored from; any other status as it is.
  absl::Status NameRestore(absl::Status status) const;
  void FillTableInfo(const Table& table, v1::TableInfo* info) const;
  // The tables as they are now (each stays alive while held).
  std::vector<std::shared_ptr<Table>> TableList() const;

  const ShardOptions options_;
  const absl::Time start_time_ = absl::Now();
  mutable RwMutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Table>> tables_ ABSL_GUARDED_BY(mu_);
  SspClock clock_;
  PushGate gate_;                    // move holds, untracked pushes, the write log
  std::mutex snapshot_mu_;           // one Snapshot at a time
  std::string restored_from_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const ShardPlacement> placement_ ABSL_GUARDED_BY(mu_);
  // placement_'s epoch while it serves (neither joining nor retired), else
  // kNotServing: CheckRoutingEpoch, on every call, reads this, not mu_.
  // Written with placement_, under mu_'s writer lock.
  static constexpr uint64_t kNotServing = ~uint64_t{0};
  std::atomic<uint64_t> serving_epoch_{kNotServing};
  void SetPlacement(std::shared_ptr<const ShardPlacement> placement)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ShardMetrics* metrics_ = nullptr;  // set before serving; null: no metrics
};

}  // namespace ember
