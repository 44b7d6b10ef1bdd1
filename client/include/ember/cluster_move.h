// MoveCluster: changes the shard count of a running cluster while trainers
// run (docs/operations.md, "Changing the shard count online"; the tool is
// ember-move).
//
// The move is a cut at a step boundary, then a switch:
//  1. The cut: a cluster checkpoint of the old shards at one step t with
//     CheckpointRequest.hold_for_move. Once a shard has copied its tables,
//     it refuses pushes of steps > t with UNAVAILABLE, which clients retry
//     (lookups go on, reading the rows as of t).
//  2. The switch: CommitMove on every shard of the new cluster (old shards
//     that stay, and shards started with `ember-server --join`): each loads
//     the rows the new routing gives it from every part of the cut and
//     takes its new index, shard count and routing epoch (the old one + 1);
//     from then on the retried pushes, and every call of the old epoch, are
//     refused with ABORTED. No push after the cut is applied anywhere, so
//     none is applied half under the old routing. Old shards not in the new
//     cluster retire.
// A trainer's client then connects again (Client::ConnectToCluster finds
// the new addresses) and resumes at the step after the cut
// (Client::AppliedStep); the clock carried through the cut makes every
// push apply exactly once.
//
// What it costs: the pushes of every trainer wait from the cut until the
// last commit: a checkpoint write of every row and every new shard's read
// of all of it (docs/measurements/2026-12-07-online-move.md).
//
// Needs: every part of the cut readable by every new shard at the path its
// shard wrote it (a shared or the same file system), and the admin role.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls_options.h"
#include "ember/v1/admin_service.pb.h"

namespace ember {

struct MoveOptions {
  // The cluster now, by shard index ("host:port").
  std::vector<std::string> from;
  // The cluster after the move, by new shard index. An address in both
  // keeps serving (its index may change); one only here must be a shard
  // started with --join; one only in `from` retires.
  std::vector<std::string> to;
  // The new cluster's routing; empty: the cluster's.
  std::string routing;
  // The cut's checkpoint id on every old shard; empty: "move-<epoch>-<unix ms>".
  std::string id;
  ClientTlsOptions tls;
  // Bearer token with the admin role (shards with --auth_tokens_file).
  std::string auth_token;
  // Deadline of each call (the cut's wait for the workers and its write; a
  // commit's load).
  absl::Duration timeout = absl::Minutes(5);
};

struct MoveResult {
  uint64_t routing_epoch = 0;                  // of the new cluster
  int64_t step = -1;                           // the cut
  std::vector<std::string> parts;              // the cut, by old shard index
  std::vector<v1::CommitMoveResponse> shards;  // by new shard index
  uint64_t rows = 0;                           // over the new shards
  uint64_t moved_rows = 0;                     // of them, rows on another shard index than before
  // From the first call of the cut until every shard committed: the time
  // pushes of steps past the cut waited (at most).
  double held_seconds = 0;
  double cut_seconds = 0;     // the cut (checkpoint) on the slowest shard
  double commit_seconds = 0;  // the commits, all shards in parallel
};

// Refuses, changing nothing, `from` that is not one cluster (each shard at
// its index of from.size(), one routing epoch), a `to` shard that is neither
// in `from` nor joining (FAILED_PRECONDITION naming it), and a cut that
// fails on any shard (the others' holds are released). A commit that
// fails is tried twice more; one that still fails after others succeeded
// leaves its shard holding the pushes, and the error names the shard and the
// cut (CommitMove is idempotent: sending it the same request finishes the
// move).
absl::StatusOr<MoveResult> MoveCluster(const MoveOptions& options);

}  // namespace ember
