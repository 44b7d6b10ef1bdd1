// Checkpointer: writes a shard's checkpoints to a directory and restores
// them (format: shard/checkpoint_format.h, docs/checkpoints.md).
//
// A checkpoint is taken in two phases. First Shard::Snapshot copies the
// tables to memory at a step boundary: pushes of later steps wait for that
// copy (about a memory copy of the tables), lookups go on. Then the copy is
// written to `<dir>/.<id>.tmp-<pid>`, every file fsync'd, the MANIFEST last,
// the directory renamed to `<dir>/<id>` and `<dir>` fsync'd, while the shard
// serves normally. A crash at any point leaves either the new checkpoint
// complete or no trace of it but a temporary directory, which the next
// start removes. The cost is memory: the copy holds every row once more
// (every changed row for a delta) until it is written.
//
// Deltas: with `incremental`, a checkpoint holds only what changed since
// the previous one this process wrote to the same directory (a table new
// since then goes in whole); the first one after a start, and the first
// after a failed one, is full. `full_every` bounds a chain's length: every
// full_every-th periodic checkpoint is full, the compaction into a new base.
//
// Thread safety: every method may be called concurrently; checkpoints are
// written one at a time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/file_system.h"
#include "ember/v1/admin_service.pb.h"
#include "shard/shard.h"

namespace ember {

struct CheckpointerOptions {
  // Where checkpoints go, one subdirectory each; empty: no checkpoints.
  std::string directory;
  // Time between periodic checkpoints; zero: only on request.
  absl::Duration interval = absl::ZeroDuration();
  // Periodic checkpoints are deltas, every full_every-th one full.
  bool incremental = false;
  int full_every = 8;
  // Full checkpoints kept (with the deltas on them); older ones are deleted
  // after each successful checkpoint. 0 keeps everything.
  int keep = 3;
  // Longest a checkpoint waits for the workers to reach its cut.
  absl::Duration cut_timeout = absl::Seconds(60);

  absl::Status Validate() const;
};

// A checkpoint directory's listing: manifests that verified, by sequence,
// and the directories that did not, with why.
struct CheckpointListing {
  std::vector<v1::CheckpointManifest> valid;
  std::vector<std::string> invalid;
};
// How much of each checkpoint a listing verifies. kManifests reads only the
// manifests (cheap: for sequence numbers and retention). kDataFiles also
// reads every table file whole as a restore does (size, header, blocks,
// counts, CRC32C) and refuses a delta whose parent is refused or missing:
// what it lists as valid is what a restore would accept, short of the
// memory to hold it, at the cost of reading every file (ListCheckpoints,
// ember-checkpoint list).
enum class ListCheck { kManifests, kDataFiles };
CheckpointListing ListCheckpointDirectory(FileSystem* fs, const std::string& directory,
                                          ListCheck check = ListCheck::kManifests);

// Verifies the checkpoint at `path` and, for a delta, each parent back to
// its full checkpoint, as a restore reads them (manifests, then every data
// file whole), keeping nothing; no shard identity is checked. OK, or the
// first damage found, naming the file (ember-checkpoint verify). Returns
// the chain's manifests, base first.
absl::StatusOr<std::vector<v1::CheckpointManifest>> VerifyCheckpoint(FileSystem* fs,
                                                                     const std::string& path);

// Loads the checkpoint at `path` (its whole chain verified, as a restore
// does) into fresh host-memory stores, for tools such as ember-export; no
// shard identity is checked. `manifest` (optional) receives its manifest.
absl::StatusOr<std::vector<RestoredTable>> LoadCheckpointTables(FileSystem* fs,
                                                                const std::string& path,
                                                                v1::CheckpointManifest* manifest);

// Compaction: restores the newest valid checkpoint of `directory` (a base
// and its deltas) and writes it as one full checkpoint, a new base with the
// next sequence number (named `id`, or "ckpt-<sequence>"), without a shard
// process. Older checkpoints stay until retention deletes them.
absl::StatusOr<v1::CheckpointResponse> CompactCheckpoints(FileSystem* fs,
                                                          const std::string& directory,
                                                          const std::string& id = "");

class Checkpointer {
 public:
  // `shard` (and `fs`, and `metrics` when given) must outlive the
  // checkpointer. Removes temporary directories a crashed writer left in
  // options.directory.
  Checkpointer(Shard* shard, CheckpointerOptions options, FileSystem* fs = FileSystem::Posix(),
               ShardMetrics* metrics = nullptr);
  ~Checkpointer();

  // Starts the periodic checkpoints (no-op without an interval).
  void StartPeriodic();
  // Stops them; a checkpoint in progress finishes first.
  void StopPeriodic();

  // See AdminService.Checkpoint. `deadline` bounds the wait for the cut.
  absl::Status Checkpoint(const v1::CheckpointRequest& request, absl::Time deadline,
                          v1::CheckpointResponse* response);
  // The checkpoint of a shard that has stopped serving (ember-server on
  // SIGTERM): cut as it is (Shard::Snapshot's `as_is`), since workers at
  // different steps would never reach a common cut; every worker's progress
  // is recorded, so that retries of its pushes are duplicates after a restore.
  absl::Status CheckpointOnExit(bool incremental, absl::Time deadline,
                                v1::CheckpointResponse* response);
  void List(v1::ListCheckpointsResponse* response);
  // See AdminService.CommitMove (shard/shard_move.h); one at a time with
  // the checkpoints.
  absl::Status CommitMove(const v1::CommitMoveRequest& request, v1::CommitMoveResponse* response);

  // Restores the shard from `what`: "latest" (the newest checkpoint in
  // options.directory whose whole chain verifies, falling back to older ones
  // and logging why each newer one was refused; nothing to restore is OK)
  // or the path of one checkpoint directory (refused if it does not verify).
  // A refused checkpoint changes nothing. Returns the restored manifest's
  // path, or "" if there was nothing to restore.
  absl::StatusOr<std::string> Restore(const std::string& what);

 private:
  absl::Status Take(const v1::CheckpointRequest& request, absl::Time deadline, bool as_is,
                    v1::CheckpointResponse* response);
  absl::Status Write(const v1::CheckpointRequest& request, absl::Time deadline, bool as_is,
                     v1::CheckpointResponse* response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeleteOld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PeriodicLoop();

  Shard* const shard_;
  const CheckpointerOptions options_;
  FileSystem* const fs_;
  ShardMetrics* const metrics_;  // null: none

  std::mutex mu_;  // one checkpoint at a time
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  // The last checkpoint this process wrote: a delta's parent.
  std::optional<std::string> last_id_ ABSL_GUARDED_BY(mu_);
  int periodic_count_ = 0;  // periodic thread only

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread periodic_;
};

}  // namespace ember
