// ShardHost: a Shard with what a serving shard keeps around it, without a
// network: its checkpointer (restore at start, periodic and requested
// checkpoints), the tables of a config file, its metrics, and the TTL
// clock (Shard::ExpireRows once a second). ember-server's Server puts its
// gRPC services in front of one; a trainer's in-process shards
// (client/in_process_channel.h) are N of them called directly.
//
// Thread safety: shard() and checkpointer() may be used from any thread
// while the host lives.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "shard/checkpointer.h"
#include "shard/shard.h"
#include "shard/shard_metrics.h"

namespace ember {

struct ShardHostOptions {
  // Shard identity and request limits.
  ShardOptions shard;
  // Checkpoints: where, how often, how many kept.
  CheckpointerOptions checkpoint;
  // "latest" (the newest checkpoint in checkpoint.directory that verifies;
  // none is fine) or a checkpoint directory's path; empty: start empty.
  // Restored before the tables of table_config_file are created.
  std::string restore_from;
  // Optional: protobuf text file with an ember.v1.TableConfigList whose
  // tables are created at start-up.
  std::string table_config_file;

  absl::Status Validate() const;
};

class ShardHost {
 public:
  // Validates the options, restores, creates the configured tables and
  // starts the periodic checkpoints and the TTL clock. `registry` (null:
  // no metrics) gets the shard's families and must outlive the host.
  static absl::StatusOr<std::unique_ptr<ShardHost>> Start(const ShardHostOptions& options,
                                                          metrics::Registry* registry = nullptr);
  // Stops the periodic checkpoints and the TTL clock (Stop).
  ~ShardHost();
  ShardHost(const ShardHost&) = delete;
  ShardHost& operator=(const ShardHost&) = delete;

  Shard& shard() { return *shard_; }
  Checkpointer& checkpointer() { return *checkpointer_; }
  // Null without a registry.
  ShardMetrics* metrics() { return metrics_.get(); }

  // Stops the periodic checkpoints (one in progress finishes) and the TTL
  // clock; the shard still answers calls. Idempotent; thread-safe.
  void Stop();

 private:
  ShardHost() = default;

  std::unique_ptr<ShardMetrics> metrics_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<Checkpointer> checkpointer_;
  // Once a second: TTL expiry (Shard::ExpireRows).
  std::thread maintenance_;
  std::mutex maintenance_mu_;
  std::condition_variable maintenance_cv_;
  bool stopping_ = false;
  std::once_flag stopped_;
};

// The devices of a list of shards, "cpu" or "cuda:N" each, comma-separated
// (one per shard, or one for all): INVALID_ARGUMENT naming `field` and the
// entry it cannot read.
absl::StatusOr<std::vector<StoreDevice>> ParseShardDevices(const std::string& text,
                                                           absl::string_view field);

}  // namespace ember
