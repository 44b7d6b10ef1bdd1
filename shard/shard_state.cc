// Shard's durable state: snapshots for checkpoints, restore, and TTL expiry
// (declared in shard/shard.h with the rest of Shard).
#include <algorithm>
#include <limits>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "shard/shard.h"

namespace ember {

absl::StatusOr<ShardSnapshot> Shard::Snapshot(std::optional<int64_t> step, bool delta,
                                              absl::Time deadline, bool as_is, bool hold_for_move) {
  std::lock_guard<std::mutex> one_at_a_time(snapshot_mu_);
  if (gate_.held() && !as_is) {
    return absl::UnavailableError(
        "a move of the cluster holds this shard's pushes at its cut: no other checkpoint until it "
        "is committed or aborted (ember-move)");
  }
  ShardSnapshot snap;
  const absl::Time start = absl::Now();
  bool holding = false;
  absl::Cleanup release = [&] {
    if (holding) clock_.ReleaseHold();
    if (hold_for_move) gate_.Release();
  };
  if (as_is) {
    const int64_t min_applied = clock_.MinApplied();
    snap.step = min_applied == std::numeric_limits<int64_t>::max() ? -1 : min_applied;
  } else {
    snap.step = step.has_value() ? *step : clock_.LatestStep();
    EMBER_RETURN_IF_ERROR(clock_.HoldAfter(snap.step));
    holding = true;
    if (snap.step >= 0) {
      EMBER_RETURN_IF_ERROR(clock_.WaitFor(
          snap.step, deadline, absl::StrCat("checkpoint at step ", snap.step)));
    }
  }
  if (hold_for_move) {
    // Pushes of unregistered workers are not held by the clock: the gate
    // refuses the next ones and waits for those under way.
    EMBER_RETURN_IF_ERROR(gate_.Hold(deadline));
  }
  snap.workers = clock_.Workers();
  const absl::Time cut = absl::Now();
  snap.cut_wait = cut - start;

  std::vector<std::shared_ptr<Table>> tables = TableList();
  std::sort(tables.begin(), tables.end(),
            [](const auto& a, const auto& b) { return a->config.name() < b->config.name(); });
  // A batch ends at the first store unit (stripe) boundary past this many
  // rows: a few MB per file write.
  constexpr size_t kBatchRows = size_t{1} << 16;
  for (const auto& t : tables) {
    ShardSnapshot::Table& out = snap.tables.emplace_back();
    out.config = t->config;
    SnapshotKind kind = delta ? SnapshotKind::kDelta : SnapshotKind::kFull;
    ExportCursor cursor;
    while (!cursor.done) {
      SnapshotBatch& batch = out.batches.emplace_back();
      absl::Status s = t->store->Snapshot(kind, &cursor, kBatchRows, &batch);
      if (kind == SnapshotKind::kDelta && out.batches.size() == 1 &&
          (absl::IsFailedPrecondition(s) || absl::IsUnimplemented(s))) {
        // The store has no changes to give (new since the last snapshot, or
        // it does not track them): this table goes in whole.
        kind = SnapshotKind::kFull;
        cursor = ExportCursor{};
        out.batches.clear();
        continue;
      }
      EMBER_RETURN_IF_ERROR(s);
      out.rows += batch.rows.keys.size();
      out.removed_keys += batch.removed.size();
    }
    out.full = kind == SnapshotKind::kFull;
  }
  snap.copy = absl::Now() - cut;
  if (hold_for_move) {
    // From here until the move's end, pushes past the cut are refused
    // (UNAVAILABLE: clients retry) rather than held: a held push would keep
    // its thread, and the server's threads must answer the move's calls.
    // Set before the clock lets them go, so that none is applied.
    gate_.HoldPast(snap.step);
    std::move(release).Cancel();
    if (holding) clock_.ReleaseHold();
  }
  return snap;
}

bool Shard::move_held() const { return gate_.held(); }

bool Shard::ReleaseMoveHold() {
  // One snapshot at a time: a move's cut is made, or refused, whole.
  std::lock_guard<std::mutex> one_at_a_time(snapshot_mu_);
  return gate_.Release();
}

uint64_t Shard::ExpireRows(absl::Duration since_start) {
  const std::vector<std::shared_ptr<Table>> tables = TableList();
  const int64_t seconds = absl::ToInt64Seconds(since_start);
  const int64_t step = clock_.LatestStep();
  uint64_t evicted = 0;
  for (const auto& t : tables) {
    const TtlConfig ttl{t->config.ttl().seconds(), t->config.ttl().steps()};
    if (!ttl.enabled()) continue;
    // Stamps are 32 bits: seconds for 136 years, steps up to 2^32.
    const int64_t now = std::clamp<int64_t>(ttl.seconds > 0 ? seconds : step, 0, 0xffffffffLL);
    t->store->SetTtlTime(static_cast<uint32_t>(now));
    if (now <= static_cast<int64_t>(ttl.limit())) continue;
    absl::StatusOr<uint64_t> n =
        t->store->EvictExpired(static_cast<uint32_t>(now - static_cast<int64_t>(ttl.limit())));
    if (n.ok()) evicted += *n;
  }
  return evicted;
}

void Shard::InstallRestored(std::vector<RestoredTable> restored,
                            const std::map<uint32_t, SspClock::Progress>& workers,
                            const KeyRouter& router, uint64_t routing_epoch,
                            const std::string& source) {
  auto placement = std::make_shared<ShardPlacement>(*this->placement());
  placement->router = router;
  placement->epoch = routing_epoch;
  Install(std::move(restored), workers, std::move(placement), source);
}

void Shard::InstallMoved(std::vector<RestoredTable> tables,
                         const std::map<uint32_t, SspClock::Progress>& workers,
                         ShardPlacement placement, const std::string& source) {
  std::lock_guard<std::mutex> one_at_a_time(snapshot_mu_);
  Install(std::move(tables), workers, std::make_shared<const ShardPlacement>(std::move(placement)),
          source);
  gate_.Release();
}

void Shard::Install(std::vector<RestoredTable> restored,
                    const std::map<uint32_t, SspClock::Progress>& workers,
                    std::shared_ptr<const ShardPlacement> placement, const std::string& source) {
  absl::flat_hash_map<std::string, std::shared_ptr<Table>> tables;
  for (RestoredTable& r : restored) {
    auto table = std::make_shared<Table>(std::move(r.config), std::move(r.store));
    if (metrics_ != nullptr) table->series = metrics_->Table(table->config.name());
    tables.emplace(table->config.name(), std::move(table));
  }
  {
    WriterLock lock(&mu_);
    for (auto& [name, table] : tables_) table->moved_out.store(true, std::memory_order_release);
    tables_.swap(tables);
    SetPlacement(std::move(placement));
    restored_from_ = source;
  }
  gate_.log().ForgetAll();  // every row may differ from what a trainer peeked
  for (const auto& [id, applied] : clock_.AppliedSteps()) clock_.Unregister(id);
  for (const auto& [id, progress] : workers) clock_.Restore(id, progress);
}

}  // namespace ember
