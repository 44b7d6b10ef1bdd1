#include "shard/checkpointer.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/key_router.h"
#include "common/status_macros.h"
#include "kernels/table_config_proto.h"
#include "shard/checkpoint_chain.h"
#include "shard/checkpoint_format.h"
#include "shard/reshard.h"
#include "shard/shard_move.h"
#include "spdlog/spdlog.h"

#ifndef EMBER_VERSION
#define EMBER_VERSION "dev"
#endif

namespace ember {
namespace {

constexpr absl::string_view kTempMarker = ".tmp-";

absl::Status ValidateId(const std::string& id) {
  const bool chars_ok = std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == '-';
  });
  if (id.empty() || id.size() > 128 || !chars_ok || id[0] == '.') {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'id': expected 1-128 characters of [A-Za-z0-9_.-] not starting with '.', "
        "received '", id, "'"));
  }
  return absl::OkStatus();
}

// Applies one table's data file to its store; a null store: reads and
// verifies the whole file as a restore does (every check but the store's
// own), keeping nothing.
absl::Status LoadTableFile(FileSystem* fs, const std::string& path,
                           const v1::CheckpointTable& entry, const TableConfig& config,
                           EmbeddingStore* store) {
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<TableFileReader> reader,
                         TableFileReader::Open(fs, path, entry, config));
  if (store != nullptr) store->Reserve(entry.rows());
  SnapshotBatch batch;
  bool done = false;
  while (true) {
    EMBER_RETURN_IF_ERROR(reader->Next(&batch, &done));
    if (done) return absl::OkStatus();
    if (store == nullptr) continue;
    EMBER_RETURN_IF_ERROR(store->Erase(batch.removed).status());
    if (absl::Status s = store->Import(batch.rows); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("checkpoint file '", path, "': ", s.message()));
    }
  }
}

// A checkpoint's table files, each read whole against its manifest entry.
absl::Status VerifyTableFiles(FileSystem* fs, const std::string& path,
                              const v1::CheckpointManifest& manifest) {
  for (const v1::CheckpointTable& entry : manifest.tables()) {
    absl::StatusOr<TableConfig> config = TableConfigFromProto(entry.config());
    if (!config.ok()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file '", JoinPath(path, kManifestFileName), "': table '",
                       entry.config().name(), "': ", config.status().message()));
    }
    EMBER_RETURN_IF_ERROR(
        LoadTableFile(fs, JoinPath(path, entry.file()), entry, *config, /*store=*/nullptr));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckpointerOptions::Validate() const {
  if (interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint_interval: expected >= 0, received ",
                                                   absl::FormatDuration(interval)));
  }
  if (interval > absl::ZeroDuration() && directory.empty()) {
    return absl::InvalidArgumentError(
        "checkpoint_interval: periodic checkpoints need a checkpoint_dir, received none");
  }
  if (full_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_full_every: expected >= 1, received ", full_every));
  }
  if (keep < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint_keep: expected >= 0, received ", keep));
  }
  return absl::OkStatus();
}

CheckpointListing ListCheckpointDirectory(FileSystem* fs, const std::string& directory,
                                          ListCheck check) {
  CheckpointListing listing;
  auto names = fs->ListDir(directory);
  if (!names.ok()) return listing;
  for (const std::string& name : *names) {
    if (name.empty() || name[0] == '.') continue;  // temporary directories
    const std::string path = JoinPath(directory, name);
    if (!fs->IsDirectory(path)) continue;
    absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(fs, path);
    if (!m.ok()) {
      listing.invalid.push_back(absl::StrCat(name, ": ", m.status().message()));
    } else if (m->id() != name) {
      listing.invalid.push_back(absl::StrCat(name, ": its manifest names it '", m->id(), "'"));
    } else {
      listing.valid.push_back(*std::move(m));
    }
  }
  std::sort(listing.valid.begin(), listing.valid.end(),
            [](const auto& a, const auto& b) { return a.sequence() < b.sequence(); });
  if (check == ListCheck::kManifests) return listing;
  // By sequence, so that a parent is judged before its deltas.
  std::vector<v1::CheckpointManifest> verified;
  std::set<std::string> accepted;
  for (v1::CheckpointManifest& m : listing.valid) {
    absl::Status s;
    if (m.kind() == v1::CHECKPOINT_KIND_DELTA && !accepted.contains(m.parent_id())) {
      s = absl::DataLossError(
          absl::StrCat("its parent '", m.parent_id(), "' is refused or missing"));
    }
    if (s.ok()) s = CheckPlacement(m, JoinPath(JoinPath(directory, m.id()), kManifestFileName));
    if (s.ok()) s = VerifyTableFiles(fs, JoinPath(directory, m.id()), m);
    if (s.ok()) {
      accepted.insert(m.id());
      verified.push_back(std::move(m));
    } else {
      listing.invalid.push_back(absl::StrCat(m.id(), ": ", s.message()));
    }
  }
  listing.valid = std::move(verified);
  return listing;
}

Checkpointer::Checkpointer(Shard* shard, CheckpointerOptions options, FileSystem* fs,
                           ShardMetrics* metrics)
    : shard_(shard), options_(std::move(options)), fs_(fs), metrics_(metrics) {
  if (options_.directory.empty()) return;
  if (auto names = fs_->ListDir(options_.directory); names.ok()) {
    for (const std::string& name : *names) {
      if (name[0] == '.' && absl::StrContains(name, kTempMarker)) {
        spdlog::warn("removing the unfinished checkpoint '{}' in {}", name, options_.directory);
        (void)fs_->RemoveAll(JoinPath(options_.directory, name));
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& m : ListCheckpointDirectory(fs_, options_.directory).valid) {
    next_sequence_ = std::max(next_sequence_, m.sequence() + 1);
  }
}

Checkpointer::~Checkpointer() { StopPeriodic(); }

void Checkpointer::StartPeriodic() {
  if (options_.interval <= absl::ZeroDuration() || periodic_.joinable()) return;
  periodic_ = std::thread([this] { PeriodicLoop(); });
}

void Checkpointer::StopPeriodic() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (periodic_.joinable()) periodic_.join();
}

void Checkpointer::PeriodicLoop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(stop_mu_);
      if (stop_cv_.wait_for(lock, absl::ToChronoSeconds(options_.interval), [&] { return stop_; })) {
        return;
      }
    }
    v1::CheckpointRequest request;
    request.set_incremental(options_.incremental && periodic_count_ % options_.full_every != 0);
    ++periodic_count_;
    v1::CheckpointResponse response;
    absl::Status s = Checkpoint(request, absl::Now() + options_.cut_timeout, &response);
    if (!s.ok()) spdlog::error("periodic checkpoint failed: {}", s.ToString());
  }
}

absl::Status Checkpointer::Checkpoint(const v1::CheckpointRequest& request, absl::Time deadline,
                                      v1::CheckpointResponse* response) {
  if (options_.directory.empty()) {
    return absl::FailedPreconditionError(
        "this shard has no checkpoint directory (start ember-server with --checkpoint_dir)");
  }
  if (!request.id().empty()) EMBER_RETURN_IF_ERROR(ValidateId(request.id()));
  if (request.has_step() && request.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'step': expected >= 0, received ", request.step()));
  }
  absl::Status taken = Take(request, deadline, /*as_is=*/false, response);
  // A move's cut that was not written is no cut: let the pushes go.
  if (!taken.ok() && request.hold_for_move()) shard_->ReleaseMoveHold();
  return taken;
}

absl::Status Checkpointer::CommitMove(const v1::CommitMoveRequest& request,
                                      v1::CommitMoveResponse* response) {
  std::lock_guard<std::mutex> lock(mu_);
  EMBER_RETURN_IF_ERROR(ember::CommitMove(shard_, fs_, metrics_, request, response));
  // The next checkpoint is of the new placement: no delta on the old one.
  last_id_.reset();
  return absl::OkStatus();
}

absl::Status Checkpointer::CheckpointOnExit(bool incremental, absl::Time deadline,
                                            v1::CheckpointResponse* response) {
  if (options_.directory.empty()) {
    return absl::FailedPreconditionError(
        "this shard has no checkpoint directory (start ember-server with --checkpoint_dir)");
  }
  v1::CheckpointRequest request;
  request.set_incremental(incremental);
  return Take(request, deadline, /*as_is=*/true, response);
}

absl::Status Checkpointer::Take(const v1::CheckpointRequest& request, absl::Time deadline,
                                bool as_is, v1::CheckpointResponse* response) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = Write(request, deadline, as_is, response);
  if (metrics_ != nullptr) {
    const bool delta = s.ok() ? response->manifest().kind() == v1::CHECKPOINT_KIND_DELTA
                              : request.incremental();
    metrics_->RecordCheckpoint(delta ? "delta" : "full",
                               s.ok() ? "ok" : absl::StatusCodeToString(s.code()));
    if (s.ok()) {
      metrics_->RecordCheckpointSuccess(
          absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()), response->bytes(),
          response->manifest().step(), response->cut_wait_seconds(), response->copy_seconds(),
          response->write_seconds());
    }
  }
  if (s.ok()) {
    const auto& m = response->manifest();
    spdlog::info("checkpoint '{}' ({}, step {}, {} tables, {} bytes) written to {}: cut wait {:.3f} s, "
                 "copy {:.3f} s, write {:.3f} s",
                 m.id(), m.kind() == v1::CHECKPOINT_KIND_DELTA ? "delta" : "full", m.step(),
                 m.tables_size(), response->bytes(), response->path(), response->cut_wait_seconds(),
                 response->copy_seconds(), response->write_seconds());
  }
  return s;
}

absl::Status Checkpointer::Write(const v1::CheckpointRequest& request, absl::Time deadline,
                                 bool as_is, v1::CheckpointResponse* response) {
  const std::string& dir = options_.directory;
  const uint64_t sequence = next_sequence_;
  const std::string id =
      request.id().empty() ? absl::StrFormat("ckpt-%012d", sequence) : request.id();
  const std::string final_path = JoinPath(dir, id);
  if (fs_->IsDirectory(final_path)) {
    return absl::AlreadyExistsError(absl::StrCat("field 'id': checkpoint '", final_path, "' exists"));
  }
  std::optional<std::string> parent;
  if (request.incremental() && last_id_.has_value() && fs_->IsDirectory(JoinPath(dir, *last_id_))) {
    parent = last_id_;
  }
  std::optional<int64_t> step;
  if (request.has_step()) step = request.step();

  absl::StatusOr<ShardSnapshot> snap =
      shard_->Snapshot(step, parent.has_value(), deadline, as_is, request.hold_for_move());
  if (!snap.ok()) {
    // A refused or timed-out cut copied nothing; any other failure may have
    // marked some rows clean, so the next checkpoint cannot be a delta.
    if (!absl::IsFailedPrecondition(snap.status()) && !absl::IsDeadlineExceeded(snap.status())) {
      last_id_.reset();
    }
    return snap.status();
  }
  // From here on the stores count the copied rows as saved: until this
  // checkpoint is in place, the next one cannot be a delta.
  last_id_.reset();
  const std::string temp = JoinPath(dir, absl::StrCat(".", id, kTempMarker, ::getpid()));
  absl::Cleanup remove_temp = [&] { (void)fs_->RemoveAll(temp); };
  const absl::Time write_start = absl::Now();
  EMBER_RETURN_IF_ERROR(fs_->CreateDirs(dir));
  EMBER_RETURN_IF_ERROR(fs_->RemoveAll(temp));
  EMBER_RETURN_IF_ERROR(fs_->CreateDirs(temp));

  const std::shared_ptr<const ShardPlacement> placement = shard_->placement();
  v1::CheckpointManifest manifest;
  manifest.set_format_version(kCheckpointFormatVersion);
  manifest.set_id(id);
  manifest.set_kind(parent ? v1::CHECKPOINT_KIND_DELTA : v1::CHECKPOINT_KIND_FULL);
  if (parent) manifest.set_parent_id(*parent);
  manifest.set_sequence(sequence);
  manifest.set_shard_index(placement->index);
  manifest.set_shard_count(placement->count);
  manifest.set_routing(placement->router.routing());
  manifest.set_routing_epoch(placement->epoch);
  manifest.set_step(snap->step);
  for (const auto& [worker, progress] : snap->workers) {
    v1::WorkerStep* w = manifest.add_workers();
    w->set_worker_id(worker);
    w->set_applied_step(progress.applied);
    for (int64_t step : progress.done_ahead) w->add_done_ahead(step);
  }
  manifest.set_created_unix_micros(absl::ToUnixMicros(absl::Now()));
  manifest.set_ember_version(EMBER_VERSION);
  uint64_t bytes = 0;
  for (ShardSnapshot::Table& t : snap->tables) {
    EMBER_ASSIGN_OR_RETURN(TableConfig config, TableConfigFromProto(t.config));
    v1::CheckpointTable* entry = manifest.add_tables();
    *entry->mutable_config() = t.config;
    entry->set_file(TableFileName(t.config.name()));
    entry->set_full(t.full);
    EMBER_ASSIGN_OR_RETURN(std::unique_ptr<TableFileWriter> writer,
                           TableFileWriter::Create(fs_, JoinPath(temp, entry->file()), config));
    for (SnapshotBatch& batch : t.batches) {
      EMBER_RETURN_IF_ERROR(writer->Append(batch));
      batch = SnapshotBatch{};  // give the copy's memory back as it is written
    }
    EMBER_RETURN_IF_ERROR(writer->Finish(entry));
    bytes += entry->file_bytes();
  }
  EMBER_RETURN_IF_ERROR(WriteManifest(fs_, temp, manifest));
  EMBER_RETURN_IF_ERROR(fs_->SyncDir(temp));
  EMBER_RETURN_IF_ERROR(fs_->Rename(temp, final_path));
  std::move(remove_temp).Cancel();
  if (absl::Status s = fs_->SyncDir(dir); !s.ok()) {
    // The rename may not be durable: a failed checkpoint leaves no trace.
    (void)fs_->RemoveAll(final_path);
    return s;
  }
  next_sequence_ = sequence + 1;
  last_id_ = id;

  *response->mutable_manifest() = manifest;
  response->set_path(final_path);
  response->set_bytes(bytes);
  response->set_cut_wait_seconds(absl::ToDoubleSeconds(snap->cut_wait));
  response->set_copy_seconds(absl::ToDoubleSeconds(snap->copy));
  response->set_write_seconds(absl::ToDoubleSeconds(absl::Now() - write_start));
  DeleteOld();
  return absl::OkStatus();
}

void Checkpointer::DeleteOld() {
  if (options_.keep == 0) return;
  const CheckpointListing listing = ListCheckpointDirectory(fs_, options_.directory);
  // Keep everything from the keep-th newest full checkpoint on: every kept
  // delta's chain starts there or later.
  int fulls = 0;
  uint64_t oldest_kept = 0;
  for (auto it = listing.valid.rbegin(); it != listing.valid.rend(); ++it) {
    if (it->kind() == v1::CHECKPOINT_KIND_FULL && ++fulls == options_.keep) {
      oldest_kept = it->sequence();
      break;
    }
  }
  if (fulls < options_.keep) return;
  for (const auto& m : listing.valid) {
    if (m.sequence() >= oldest_kept) break;
    if (absl::Status s = fs_->RemoveAll(JoinPath(options_.directory, m.id())); !s.ok()) {
      spdlog::warn("cannot delete old checkpoint '{}': {}", m.id(), s.ToString());
    }
  }
}

void Checkpointer::List(v1::ListCheckpointsResponse* response) {
  if (options_.directory.empty()) return;
  CheckpointListing listing =
      ListCheckpointDirectory(fs_, options_.directory, ListCheck::kDataFiles);
  for (auto& m : listing.valid) *response->add_checkpoints() = std::move(m);
  for (auto& why : listing.invalid) response->add_invalid(std::move(why));
}

namespace {

// Builds the tables of a chain (base first) in fresh stores.
absl::StatusOr<std::vector<RestoredTable>> LoadChain(
    FileSystem* fs, const std::string& dir, const std::vector<v1::CheckpointManifest>& chain,
    const StoreDevice& device) {
  std::map<std::string, RestoredTable> tables;
  for (const v1::CheckpointManifest& m : chain) {
    const std::string path = JoinPath(dir, m.id());
    std::map<std::string, RestoredTable> next;
    for (const v1::CheckpointTable& entry : m.tables()) {
      const std::string& name = entry.config().name();
      const std::string where = JoinPath(path, kManifestFileName);
      absl::StatusOr<TableConfig> config = TableConfigFromProto(entry.config());
      if (!config.ok()) {
        return absl::DataLossError(absl::StrCat("checkpoint file '", where, "': table '", name,
                                                "': ", config.status().message()));
      }
      RestoredTable table;
      if (entry.full()) {
        table.config = entry.config();
        absl::StatusOr<std::unique_ptr<EmbeddingStore>> store = NewStore(*config, device);
        if (!store.ok()) {  // e.g. a capacity this device cannot hold
          return absl::Status(store.status().code(),
                              absl::StrCat("checkpoint file '", where, "': table '", name, "': ",
                                           store.status().message()));
        }
        table.store = *std::move(store);
      } else {
        auto it = tables.find(name);
        if (it == tables.end()) {
          return absl::DataLossError(absl::StrCat("checkpoint file '", where, "': table '", name,
                                                  "' holds changes, but its parent '",
                                                  m.parent_id(), "' has no such table"));
        }
        if (std::string diff = TableConfigDifference(it->second.config, entry.config());
            !diff.empty()) {
          return absl::DataLossError(absl::StrCat("checkpoint file '", where, "': table '", name,
                                                  "' differs from its parent's: ", diff));
        }
        table = std::move(it->second);
      }
      EMBER_RETURN_IF_ERROR(
          LoadTableFile(fs, JoinPath(path, entry.file()), entry, *config, table.store.get()));
      next.emplace(name, std::move(table));
    }
    tables = std::move(next);
  }
  std::vector<RestoredTable> out;
  for (auto& [name, t] : tables) out.push_back(std::move(t));
  return out;
}

}  // namespace

absl::StatusOr<std::vector<v1::CheckpointManifest>> VerifyCheckpoint(FileSystem* fs,
                                                                     const std::string& path) {
  EMBER_ASSIGN_OR_RETURN(std::vector<v1::CheckpointManifest> chain, ReadChain(fs, path));
  for (const v1::CheckpointManifest& m : chain) {
    EMBER_RETURN_IF_ERROR(VerifyTableFiles(fs, JoinPath(ParentDir(path), m.id()), m));
  }
  return chain;
}

absl::StatusOr<std::vector<RestoredTable>> LoadCheckpointTables(FileSystem* fs,
                                                                const std::string& path,
                                                                v1::CheckpointManifest* manifest) {
  EMBER_ASSIGN_OR_RETURN(std::vector<v1::CheckpointManifest> chain, ReadChain(fs, path));
  EMBER_ASSIGN_OR_RETURN(std::vector<RestoredTable> tables,
                         LoadChain(fs, ParentDir(path), chain, StoreDevice{}));
  if (manifest != nullptr) *manifest = chain.back();
  return tables;
}

absl::StatusOr<std::string> Checkpointer::Restore(const std::string& what) {
  std::vector<std::string> candidates;
  std::vector<std::string> refused;
  if (what == "latest") {
    if (options_.directory.empty()) {
      return absl::InvalidArgumentError(
          "restore_from: 'latest' needs a checkpoint_dir, received none");
    }
    CheckpointListing listing = ListCheckpointDirectory(fs_, options_.directory);
    for (const std::string& why : listing.invalid) {
      spdlog::warn("checkpoint refused: {}", why);
      refused.push_back(why);
    }
    for (auto it = listing.valid.rbegin(); it != listing.valid.rend(); ++it) {
      candidates.push_back(JoinPath(options_.directory, it->id()));
    }
    if (candidates.empty() && refused.empty()) {
      spdlog::info("no checkpoint in {}: starting empty", options_.directory);
      return std::string();
    }
  } else {
    candidates.push_back(what);
  }
  const ShardOptions& shard = shard_->options();
  for (const std::string& path : candidates) {
    const absl::Time start = absl::Now();
    absl::Status s = [&]() -> absl::Status {
      std::vector<RestoredTable> tables;
      std::map<uint32_t, SspClock::Progress> workers;
      KeyRouter router;
      uint64_t epoch = 1;
      uint64_t moved = 0;
      int64_t step = -1;
      size_t checkpoints = 1;
      uint64_t bytes = 0;
      std::vector<std::string> parts = SplitParts(path);
      if (parts.size() == 1) {
        EMBER_ASSIGN_OR_RETURN(std::vector<v1::CheckpointManifest> chain, ReadChain(fs_, path));
        const v1::CheckpointManifest& m = chain.back();
        if (m.shard_index() == shard.shard_index && m.shard_count() == shard.shard_count) {
          // This shard's own part: its keys are placed by its routing.
          EMBER_ASSIGN_OR_RETURN(router, KeyRouter::Make(m.routing(), m.shard_count()));
          epoch = RoutingEpochOf(m);
          EMBER_ASSIGN_OR_RETURN(tables, LoadChain(fs_, ParentDir(path), chain, shard.device));
          workers = WorkersOf(m);
          step = m.step();
          checkpoints = chain.size();
          for (const v1::CheckpointManifest& c : chain) {
            for (const v1::CheckpointTable& t : c.tables()) bytes += t.file_bytes();
          }
          parts.clear();
        } else if (m.shard_count() != 1) {
          return absl::FailedPreconditionError(
              absl::StrCat("checkpoint file '", JoinPath(path, kManifestFileName),
                           "': written by shard ", m.shard_index(), " of ", m.shard_count(),
                           ", this is shard ", shard.shard_index, " of ", shard.shard_count,
                           " (to restore into another shard count, pass every part "
                           "of the cluster checkpoint: --restore_from=PART0,PART1,...)"));
        }
      }
      if (!parts.empty()) {
        // A cluster checkpoint resharded: this shard's keys from every part.
        EMBER_ASSIGN_OR_RETURN(CheckpointParts cluster, OpenCheckpointParts(fs_, parts));
        EMBER_ASSIGN_OR_RETURN(router, KeyRouter::Make(shard.routing, shard.shard_count));
        EMBER_ASSIGN_OR_RETURN(
            tables, LoadOwnedTables(fs_, cluster, router, shard.shard_index, shard.device, &moved));
        workers = cluster.workers;
        epoch = cluster.resharded_epoch();
        step = cluster.step;
        checkpoints = parts.size();
        bytes = cluster.bytes;
        spdlog::info(
            "resharding: {} parts of {} shards routed by '{}' into shard {} of {} routed by '{}'",
            parts.size(), cluster.shard_count, cluster.routing, shard.shard_index,
            shard.shard_count, router.routing());
      }
      const size_t n = tables.size();
      shard_->InstallRestored(std::move(tables), workers, router, epoch, path);
      if (metrics_ != nullptr) {
        metrics_->RecordRestore(absl::ToDoubleSeconds(absl::Now() - start), step,
                                static_cast<uint32_t>(parts.empty() ? 1 : parts.size()), bytes,
                                moved, router.routing());
      }
      spdlog::info(
          "restored {} tables and {} workers at step {} from {} ({} checkpoints, routing epoch {}, "
          "{} rows moved from other shards' parts) in {:.3f} s",
          n, workers.size(), step, path, checkpoints, epoch, moved,
          absl::ToDoubleSeconds(absl::Now() - start));
      return absl::OkStatus();
    }();
    if (s.ok()) return path;
    spdlog::warn("checkpoint '{}' refused: {}", path, s.ToString());
    refused.push_back(absl::StrCat(path, ": ", s.message()));
    if (what != "latest") return s;
  }
  return absl::DataLossError(absl::StrCat("restore_from=latest: no checkpoint in '",
                                          options_.directory, "' verifies: ",
                                          absl::StrJoin(refused, "; ")));
}

absl::StatusOr<v1::CheckpointResponse> CompactCheckpoints(FileSystem* fs,
                                                          const std::string& directory,
                                                          const std::string& id) {
  const CheckpointListing listing = ListCheckpointDirectory(fs, directory);
  if (listing.valid.empty()) {
    return absl::NotFoundError(absl::StrCat("no valid checkpoint in '", directory, "'"));
  }
  // The shard is the newest checkpoint's; restore checks every other.
  const v1::CheckpointManifest& newest = listing.valid.back();
  ShardOptions options;
  options.shard_index = newest.shard_index();
  options.shard_count = newest.shard_count();
  EMBER_RETURN_IF_ERROR(options.Validate());
  // On the heap: a Shard's mutexes on the stack would share addresses with
  // a caller's stack objects afterwards, which ThreadSanitizer (it cannot
  // see std::mutex die) takes for one mutex locked in two orders.
  auto shard = std::make_unique<Shard>(options);
  CheckpointerOptions co;
  co.directory = directory;
  co.keep = 0;
  Checkpointer checkpointer(shard.get(), co, fs);
  EMBER_ASSIGN_OR_RETURN(std::string restored, checkpointer.Restore("latest"));
  v1::CheckpointRequest request;
  request.set_id(id);
  // Every restored worker stands at the cut, so the cut is reached at once.
  v1::CheckpointResponse response;
  EMBER_RETURN_IF_ERROR(checkpointer.Checkpoint(request, absl::Now(), &response));
  spdlog::info("compacted {} into {}", restored, response.path());
  return response;
}

}  // namespace ember
