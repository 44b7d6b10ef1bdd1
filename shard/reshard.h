// Resharding: the parts of a cluster checkpoint (one per shard of M, any
// routing) re-routed to N shards, streaming: rows are read block by block
// from the parts' table files and each goes where the new routing sends it.
// Memory holds a block and a few thousand rows per new shard, never a table
// (docs/checkpoints.md, "Resharding").
//
// A part may be a delta: its chain is read newest first, and of every key
// only its newest version is kept (a key a newer file removed or holds is
// skipped in older files); that needs the keys of the part's deltas in
// memory, not its base's.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/file_system.h"
#include "common/key_router.h"
#include "ember/v1/admin_service.pb.h"
#include "ember/v1/checkpoint.pb.h"
#include "kernels/store_factory.h"
#include "shard/shard.h"
#include "shard/ssp_clock.h"

namespace ember {

// The parts of one cluster checkpoint, read and checked against each other.
struct CheckpointParts {
  uint32_t shard_count = 0;                                 // of the cluster that wrote it
  std::string routing;                                      // its routing
  uint64_t routing_epoch = 1;                               // its routing epoch
  // The epoch of every reshard of it (the tool's parts, a resharded restore).
  uint64_t resharded_epoch() const { return routing_epoch + 1; }
  std::vector<std::string> paths;                           // by shard index
  std::vector<std::vector<v1::CheckpointManifest>> chains;  // by shard index, base first
  // The cut, the same in every part.
  int64_t step = -1;
  std::map<uint32_t, SspClock::Progress> workers;
  // The tables at the cut (from shard 0's newest manifest; every part has
  // the same), by name.
  std::vector<v1::TableConfig> tables;
  // Data bytes of every file a reshard reads.
  uint64_t bytes = 0;
};

// Reads the manifests of `parts` (checkpoint directories, any order) and
// checks that they are one cluster checkpoint: every shard index of one
// shard count exactly once, one routing, the same cut (step and every
// worker's progress) and the same tables. FAILED_PRECONDITION naming the
// part's file and what differs (mixed or incomplete), or a manifest's own
// error. Reads no data file (the reshard verifies each as it streams it).
absl::StatusOr<CheckpointParts> OpenCheckpointParts(FileSystem* fs,
                                                    const std::vector<std::string>& parts);

// Streams the rows of table `table` (an index into cluster.tables) of every
// part, each key once in its newest version, to `sink(shard, rows)` with
// shard = to.ShardOf(key), in batches of at most `batch_rows`; shards for
// which `wanted(shard)` is false are skipped. Each data file is verified as
// a restore verifies it (sizes, counts, CRC32C): DATA_LOSS naming it.
// `moved`, if given, is increased by the rows sent that change shard index
// (from part p to a shard other than p): the keys a reshard moves.
using RoutedSink = std::function<absl::Status(uint32_t shard, const SnapshotBatch& rows)>;
absl::Status StreamRoutedRows(FileSystem* fs, const CheckpointParts& cluster, size_t table,
                              const KeyRouter& to, const std::function<bool(uint32_t)>& wanted,
                              const RoutedSink& sink, uint64_t* moved = nullptr,
                              size_t batch_rows = 4096);

// The tables shard `shard_index` owns under `to`, from every part of the
// cluster checkpoint, in fresh stores on `device` (a restore that
// reshards: ember-server --restore_from=PART0,PART1,...). `moved`, if
// given, gets the rows taken from other shard indexes' parts.
absl::StatusOr<std::vector<RestoredTable>> LoadOwnedTables(
    FileSystem* fs, const CheckpointParts& cluster, const KeyRouter& to, uint32_t shard_index,
    const StoreDevice& device, uint64_t* moved = nullptr);

struct ReshardOptions {
  uint32_t shard_count = 0;  // N, the new shard count
  std::string routing = kDefaultRouting;
  // Where the new parts go: `<out_dir>/shard-<i>/<id>`, so that shard i
  // of N may start with --checkpoint_dir=<out_dir>/shard-<i>
  // --restore_from=latest.
  std::string out_dir;
  // The new parts' id; empty: the old parts' id when they share one, else
  // "reshard-<step>".
  std::string id;
};
struct ReshardResult {
  std::vector<std::string> paths;  // the new parts, by shard index
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t rows = 0;  // rows written (every key once)
  uint64_t moved_rows = 0;  // of them, rows now on another shard index than before
  double seconds = 0;
};
// Writes the cluster checkpoint as N full checkpoint parts (each written to
// a temporary directory and renamed into place, as a shard writes one):
// every row, optimizer state, eviction score and TTL stamp as stored, the
// same cut and clock in every part, and the next routing epoch
// (cluster.routing_epoch + 1: clients of the old routing are refused). Refuses an out_dir that
// already holds a part of that id.
absl::StatusOr<ReshardResult> Reshard(FileSystem* fs, const CheckpointParts& cluster,
                                      const ReshardOptions& options);

// The clock a manifest records: each registered worker's progress.
std::map<uint32_t, SspClock::Progress> WorkersOf(const v1::CheckpointManifest& m);

// The routing epoch a manifest records (1 for manifests older than epochs).
uint64_t RoutingEpochOf(const v1::CheckpointManifest& m);

// `--restore_from` values naming several parts: "PART0,PART1,...".
std::vector<std::string> SplitParts(const std::string& what);

}  // namespace ember
