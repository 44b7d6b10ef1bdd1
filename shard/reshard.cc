#include "shard/reshard.h"

#include <unistd.h>

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kernels/table_config_proto.h"
#include "shard/checkpoint_chain.h"
#include "shard/checkpoint_format.h"

#ifndef EMBER_VERSION
#define EMBER_VERSION "dev"
#endif

namespace ember {
namespace {

std::string ManifestOf(const std::string& part) { return JoinPath(part, kManifestFileName); }

// Where two parts' cuts differ, or "" if they are the same.
std::string CutDifference(const v1::CheckpointManifest& a, const v1::CheckpointManifest& b) {
  if (a.step() != b.step()) return absl::StrCat("step ", b.step(), " against ", a.step());
  const auto wa = WorkersOf(a), wb = WorkersOf(b);
  for (const auto& [id, p] : wa) {
    auto it = wb.find(id);
    if (it == wb.end()) return absl::StrCat("worker ", id, " missing");
    if (it->second.applied != p.applied || it->second.done_ahead != p.done_ahead) {
      return absl::StrCat("worker ", id, " at step ", it->second.applied, " against ", p.applied);
    }
  }
  for (const auto& [id, p] : wb) {
    if (!wa.contains(id)) return absl::StrCat("worker ", id, " that shard 0 does not have");
  }
  return "";
}

// A part's files of one table, newest first, back to the table's full file.
absl::StatusOr<std::vector<std::pair<std::string, const v1::CheckpointTable*>>> FilesOf(
    const std::vector<v1::CheckpointManifest>& chain, const std::string& part,
    const std::string& table) {
  std::vector<std::pair<std::string, const v1::CheckpointTable*>> files;
  const std::string dir = ParentDir(part);
  for (size_t d = chain.size(); d-- > 0;) {
    const v1::CheckpointTable* entry = nullptr;
    for (const v1::CheckpointTable& t : chain[d].tables()) {
      if (t.config().name() == table) entry = &t;
    }
    if (entry == nullptr) break;
    files.emplace_back(JoinPath(JoinPath(dir, chain[d].id()), entry->file()), entry);
    if (entry->full()) return files;
  }
  return absl::DataLossError(absl::StrCat("checkpoint '", part, "': table '", table,
                                          "' has no full data file in its chain"));
}

void AppendRow(const ExportedRows& from, size_t i, size_t dim, size_t state_floats,
               ExportedRows* to) {
  to->keys.push_back(from.keys[i]);
  to->values.insert(to->values.end(), from.values.begin() + i * dim,
                    from.values.begin() + (i + 1) * dim);
  to->state.insert(to->state.end(), from.state.begin() + i * state_floats,
                   from.state.begin() + (i + 1) * state_floats);
  to->steps.push_back(from.steps[i]);
  to->scores.push_back(from.scores[i]);
}

}  // namespace

std::map<uint32_t, SspClock::Progress> WorkersOf(const v1::CheckpointManifest& m) {
  std::map<uint32_t, SspClock::Progress> workers;
  for (const v1::WorkerStep& w : m.workers()) {
    workers[w.worker_id()] = SspClock::Progress{
        w.applied_step(), std::vector<int64_t>(w.done_ahead().begin(), w.done_ahead().end())};
  }
  return workers;
}

uint64_t RoutingEpochOf(const v1::CheckpointManifest& m) {
  return std::max<uint64_t>(m.routing_epoch(), 1);
}

std::vector<std::string> SplitParts(const std::string& what) {
  return absl::StrSplit(what, ',', absl::SkipEmpty());
}

absl::StatusOr<CheckpointParts> OpenCheckpointParts(FileSystem* fs,
                                                    const std::vector<std::string>& parts) {
  if (parts.empty()) {
    return absl::InvalidArgumentError("cluster checkpoint: expected its parts, received none");
  }
  CheckpointParts c;
  for (size_t i = 0; i < parts.size(); ++i) {
    EMBER_ASSIGN_OR_RETURN(std::vector<v1::CheckpointManifest> chain, ReadChain(fs, parts[i]));
    const v1::CheckpointManifest& m = chain.back();
    if (i == 0) {
      c.shard_count = m.shard_count();
      c.routing = m.routing();
      c.routing_epoch = RoutingEpochOf(m);
      c.paths.resize(c.shard_count);
      c.chains.resize(c.shard_count);
    }
    const std::string where = ManifestOf(parts[i]);
    if (m.shard_count() != c.shard_count || m.routing() != c.routing ||
        RoutingEpochOf(m) != c.routing_epoch) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cluster checkpoint: part '", where, "' is shard ", m.shard_index(), " of ",
          m.shard_count(), " routed by '", m.routing(), "' at routing epoch ", RoutingEpochOf(m),
          ", part '", ManifestOf(parts[0]), "' of ", c.shard_count, " routed by '", c.routing,
          "' at routing epoch ", c.routing_epoch, ": parts of different clusters"));
    }
    if (!c.paths[m.shard_index()].empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cluster checkpoint: parts '", c.paths[m.shard_index()], "' and '", parts[i],
                       "' are both shard ", m.shard_index(), " of ", c.shard_count));
    }
    c.paths[m.shard_index()] = parts[i];
    c.chains[m.shard_index()] = std::move(chain);
  }
  for (uint32_t s = 0; s < c.shard_count; ++s) {
    if (c.paths[s].empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cluster checkpoint of ", c.shard_count, " shards: no part of shard ", s, " among the ",
          parts.size(), " given (incomplete; pass every shard's checkpoint of the same id)"));
    }
  }
  const v1::CheckpointManifest& first = c.chains[0].back();
  c.step = first.step();
  c.workers = WorkersOf(first);
  for (const v1::CheckpointTable& t : first.tables()) c.tables.push_back(t.config());
  for (uint32_t s = 1; s < c.shard_count; ++s) {
    const v1::CheckpointManifest& m = c.chains[s].back();
    const std::string where = ManifestOf(c.paths[s]);
    if (std::string diff = CutDifference(first, m); !diff.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cluster checkpoint: part '", where, "' is cut at another point than shard 0's '",
          ManifestOf(c.paths[0]), "': ", diff,
          " (not one cluster checkpoint: take one with the client's Checkpoint)"));
    }
    if (m.tables_size() != first.tables_size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cluster checkpoint: part '", where, "' holds ", m.tables_size(),
                       " tables, shard 0's holds ", first.tables_size()));
    }
    for (int t = 0; t < m.tables_size(); ++t) {
      const v1::TableConfig& a = first.tables(t).config();
      const v1::TableConfig& b = m.tables(t).config();
      std::string diff = a.name() != b.name() ? absl::StrCat("table '", b.name(),
                                                             "' where shard 0 has '", a.name(), "'")
                                              : TableConfigDifference(a, b);
      if (!diff.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("cluster checkpoint: part '", where, "' differs from shard 0's: ", diff));
      }
    }
  }
  for (uint32_t s = 0; s < c.shard_count; ++s) {
    for (const v1::TableConfig& t : c.tables) {
      EMBER_ASSIGN_OR_RETURN(auto files, FilesOf(c.chains[s], c.paths[s], t.name()));
      for (const auto& [path, entry] : files) {
        c.bytes += entry->file_bytes();
      }
    }
  }
  return c;
}

absl::Status StreamRoutedRows(FileSystem* fs, const CheckpointParts& cluster, size_t table,
                              const KeyRouter& to, const std::function<bool(uint32_t)>& wanted,
                              const RoutedSink& sink, uint64_t* moved, size_t batch_rows) {
  const std::string& name = cluster.tables[table].name();
  EMBER_ASSIGN_OR_RETURN(TableConfig config, TableConfigFromProto(cluster.tables[table]));
  const size_t dim = config.dim;
  const size_t state_floats = dim * OptimizerStateFloatsPerElement(config.optimizer.kind);
  std::vector<SnapshotBatch> out(to.shard_count());
  auto flush = [&](uint32_t s) -> absl::Status {
    if (out[s].rows.keys.empty()) return absl::OkStatus();
    absl::Status st = sink(s, out[s]);
    out[s].Clear();
    return st;
  };
  SnapshotBatch in;
  for (uint32_t p = 0; p < cluster.shard_count; ++p) {
    EMBER_ASSIGN_OR_RETURN(auto files, FilesOf(cluster.chains[p], cluster.paths[p], name));
    // Keys a newer file of this part holds or removed: their older versions
    // are not the part's.
    absl::flat_hash_set<uint64_t> newer;
    for (size_t f = 0; f < files.size(); ++f) {
      const bool older_follow = f + 1 < files.size();
      EMBER_ASSIGN_OR_RETURN(std::unique_ptr<TableFileReader> reader,
                             TableFileReader::Open(fs, files[f].first, *files[f].second, config));
      bool done = false;
      while (true) {
        EMBER_RETURN_IF_ERROR(reader->Next(&in, &done));
        if (done) break;
        const ExportedRows& rows = in.rows;
        for (size_t i = 0; i < rows.keys.size(); ++i) {
          const uint64_t key = rows.keys[i];
          if (f > 0 && newer.contains(key)) continue;
          if (older_follow) newer.insert(key);
          const uint32_t s = to.ShardOf(key);
          if (!wanted(s)) continue;
          if (moved != nullptr && s != p) ++*moved;
          AppendRow(rows, i, dim, state_floats, &out[s].rows);
          if (out[s].rows.keys.size() >= batch_rows) EMBER_RETURN_IF_ERROR(flush(s));
        }
        if (older_follow) newer.insert(in.removed.begin(), in.removed.end());
      }
    }
  }
  for (uint32_t s = 0; s < to.shard_count(); ++s) EMBER_RETURN_IF_ERROR(flush(s));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RestoredTable>> LoadOwnedTables(
    FileSystem* fs, const CheckpointParts& cluster, const KeyRouter& to, uint32_t shard_index,
    const StoreDevice& device, uint64_t* moved) {
  std::vector<RestoredTable> out;
  for (size_t t = 0; t < cluster.tables.size(); ++t) {
    EMBER_ASSIGN_OR_RETURN(TableConfig config, TableConfigFromProto(cluster.tables[t]));
    RestoredTable table;
    table.config = cluster.tables[t];
    EMBER_ASSIGN_OR_RETURN(table.store, NewStore(config, device));
    EmbeddingStore* store = table.store.get();
    uint64_t imported = 0;
    EMBER_RETURN_IF_ERROR(StreamRoutedRows(
        fs, cluster, t, to, [&](uint32_t s) { return s == shard_index; },
        [&](uint32_t, const SnapshotBatch& rows) -> absl::Status {
          if (absl::Status s = store->Import(rows.rows); !s.ok()) {
            return absl::Status(s.code(), absl::StrCat("table '", config.name, "': ", s.message()));
          }
          imported += rows.rows.keys.size();
          return absl::OkStatus();
        },
        moved));
    // A table with eviction makes room by evicting: a share larger than its
    // capacity would lose rows silently.
    if (const uint64_t kept = store->Stats().rows; kept < imported) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "table '", config.name, "': shard ", shard_index, " of ", to.shard_count(), " owns ",
          imported, " rows of the checkpoint, its store kept ", kept, " (capacity ",
          config.capacity, " per shard): give the table more shards or a larger capacity"));
    }
    out.push_back(std::move(table));
  }
  return out;
}

absl::StatusOr<ReshardResult> Reshard(FileSystem* fs, const CheckpointParts& cluster,
                                      const ReshardOptions& options) {
  const absl::Time start = absl::Now();
  EMBER_ASSIGN_OR_RETURN(KeyRouter to, KeyRouter::Make(options.routing, options.shard_count));
  if (options.out_dir.empty()) {
    return absl::InvalidArgumentError("reshard: out_dir: expected a directory, received none");
  }
  std::string id = options.id;
  if (id.empty()) {
    id = cluster.chains[0].back().id();
    for (const auto& chain : cluster.chains) {
      if (chain.back().id() != id) id = absl::StrCat("reshard-", cluster.step);
    }
  }
  if (id.empty() || id[0] == '.' || id.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reshard: id: expected a directory name not starting with '.', received '", id, "'"));
  }
  const uint32_t n = to.shard_count();
  ReshardResult result;
  std::vector<std::string> temps(n);
  auto remove_temps = absl::MakeCleanup([&] {
    for (const std::string& t : temps) {
      if (!t.empty()) (void)fs->RemoveAll(t);
    }
  });
  uint64_t sequence = 0;
  for (const auto& chain : cluster.chains) sequence = std::max(sequence, chain.back().sequence());
  std::vector<v1::CheckpointManifest> manifests(n);
  for (uint32_t s = 0; s < n; ++s) {
    const std::string dir = JoinPath(options.out_dir, absl::StrCat("shard-", s));
    result.paths.push_back(JoinPath(dir, id));
    if (fs->IsDirectory(result.paths.back())) {
      return absl::AlreadyExistsError(absl::StrCat("reshard: '", result.paths.back(),
                                                   "' exists; choose another id or out_dir"));
    }
    temps[s] = JoinPath(dir, absl::StrCat(".", id, ".tmp-", ::getpid()));
    EMBER_RETURN_IF_ERROR(fs->RemoveAll(temps[s]));
    EMBER_RETURN_IF_ERROR(fs->CreateDirs(temps[s]));
    v1::CheckpointManifest& m = manifests[s];
    m.set_format_version(kCheckpointFormatVersion);
    m.set_id(id);
    m.set_kind(v1::CHECKPOINT_KIND_FULL);
    m.set_sequence(sequence);
    m.set_shard_index(s);
    m.set_shard_count(n);
    m.set_routing(to.routing());
    m.set_routing_epoch(cluster.resharded_epoch());
    m.set_step(cluster.step);
    *m.mutable_workers() = cluster.chains[0].back().workers();
    m.set_created_unix_micros(absl::ToUnixMicros(absl::Now()));
    m.set_ember_version(EMBER_VERSION);
  }
  for (size_t t = 0; t < cluster.tables.size(); ++t) {
    const v1::TableConfig& proto = cluster.tables[t];
    EMBER_ASSIGN_OR_RETURN(TableConfig config, TableConfigFromProto(proto));
    std::vector<std::unique_ptr<TableFileWriter>> writers(n);
    for (uint32_t s = 0; s < n; ++s) {
      EMBER_ASSIGN_OR_RETURN(
          writers[s],
          TableFileWriter::Create(fs, JoinPath(temps[s], TableFileName(proto.name())), config));
    }
    EMBER_RETURN_IF_ERROR(StreamRoutedRows(
        fs, cluster, t, to, [](uint32_t) { return true; },
        [&](uint32_t s, const SnapshotBatch& rows) { return writers[s]->Append(rows); },
        &result.moved_rows));
    for (uint32_t s = 0; s < n; ++s) {
      v1::CheckpointTable* entry = manifests[s].add_tables();
      *entry->mutable_config() = proto;
      entry->set_file(TableFileName(proto.name()));
      entry->set_full(true);
      EMBER_RETURN_IF_ERROR(writers[s]->Finish(entry));
      if (config.capacity > 0 && entry->rows() > config.capacity) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "reshard: table '", proto.name(), "': shard ", s, " of ", n, " would hold ",
            entry->rows(), " rows, more than its capacity of ", config.capacity,
            " per shard: give the table more shards or a larger capacity"));
      }
      result.bytes_written += entry->file_bytes();
      result.rows += entry->rows();
    }
  }
  for (uint32_t s = 0; s < n; ++s) {
    EMBER_RETURN_IF_ERROR(WriteManifest(fs, temps[s], manifests[s]));
    EMBER_RETURN_IF_ERROR(fs->SyncDir(temps[s]));
    EMBER_RETURN_IF_ERROR(fs->Rename(temps[s], result.paths[s]));
    temps[s].clear();
    EMBER_RETURN_IF_ERROR(fs->SyncDir(ParentDir(result.paths[s])));
  }
  result.bytes_read = cluster.bytes;
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

}  // namespace ember
