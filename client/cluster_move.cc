#include "ember/cluster_move.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/admin_stubs.h"
#include "common/status_macros.h"

namespace ember {
namespace {

// Runs fn(i) for i in [0, n) on threads; the statuses by i.
std::vector<absl::Status> InParallel(size_t n, const std::function<absl::Status(size_t)>& fn) {
  std::vector<absl::Status> out(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) threads.emplace_back([&, i] { out[i] = fn(i); });
  for (std::thread& t : threads) t.join();
  return out;
}

absl::Status FirstError(const std::vector<absl::Status>& statuses) {
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MoveResult> MoveCluster(const MoveOptions& options) {
  if (options.from.empty() || options.to.empty()) {
    return absl::InvalidArgumentError(
        "a move needs the cluster's shards (from) and the new ones (to)");
  }
  EMBER_RETURN_IF_ERROR(options.tls.Validate());
  const absl::flat_hash_set<std::string> old(options.from.begin(), options.from.end());
  const absl::flat_hash_set<std::string> next(options.to.begin(), options.to.end());
  if (old.size() != options.from.size() || next.size() != options.to.size()) {
    return absl::InvalidArgumentError("an address appears twice in from or in to");
  }
  AdminStubs shards(options.tls, options.auth_token, options.timeout);
  for (const auto& a : options.from) EMBER_RETURN_IF_ERROR(shards.Open(a));
  for (const auto& a : options.to) EMBER_RETURN_IF_ERROR(shards.Open(a));

  // The old cluster: one epoch, each shard at its index.
  std::vector<v1::GetShardInfoResponse> infos(options.from.size());
  uint64_t epoch = 0;
  std::string routing;
  int64_t latest = -1;
  for (size_t i = 0; i < options.from.size(); ++i) {
    EMBER_RETURN_IF_ERROR(shards.ShardInfo(options.from[i], &infos[i]));
    const v1::GetShardInfoResponse& info = infos[i];
    if (info.joining() || info.retired() || info.shard_index() != i ||
        info.shard_count() != options.from.size() || (i > 0 && info.routing_epoch() != epoch)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "from[", i, "] ", options.from[i], ": expected shard ", i, " of ", options.from.size(),
          i > 0 ? absl::StrCat(" at routing epoch ", epoch) : "", ", received shard ",
          info.shard_index(), " of ", info.shard_count(), " at routing epoch ",
          info.routing_epoch(), info.joining() ? " (joining)" : "",
          info.retired() ? " (retired)" : "", info.move_held() ? " (held by a move's cut)" : ""));
    }
    if (info.move_held()) {
      return absl::FailedPreconditionError(
          absl::StrCat("from[", i, "] ", options.from[i],
                       ": another move's cut holds its pushes (AbortMove releases them)"));
    }
    epoch = info.routing_epoch();
    routing = info.routing();
    for (const auto& w : info.workers()) latest = std::max(latest, w.applied_step());
  }
  for (size_t j = 0; j < options.to.size(); ++j) {
    if (old.contains(options.to[j])) continue;
    v1::GetShardInfoResponse info;
    EMBER_RETURN_IF_ERROR(shards.ShardInfo(options.to[j], &info));
    if (!info.joining()) {
      return absl::FailedPreconditionError(
          absl::StrCat("to[", j, "] ", options.to[j],
                       ": a shard new to the cluster must wait to join "
                       "(ember-server --join); it is shard ",
                       info.shard_index(), " of ", info.shard_count(), " at routing epoch ",
                       info.routing_epoch()));
    }
  }

  MoveResult result;
  const absl::Time start = absl::Now();
  // The cut: one step on every old shard, ahead of the workers so that
  // none has pushed past it yet; if one has (a fast trainer), further
  // ahead (4x each try). The workers run on until they reach it.
  constexpr int kTries = 5;
  std::vector<v1::CheckpointResponse> cut(options.from.size());
  for (int attempt = 0;; ++attempt) {
    v1::CheckpointRequest request;
    request.set_id(options.id.empty()
                       ? absl::StrCat("move-", epoch + 1, "-", absl::ToUnixMillis(absl::Now()))
                       : options.id);
    if (attempt > 0) {
      for (const std::string& a : options.from) {
        v1::GetShardInfoResponse info;
        EMBER_RETURN_IF_ERROR(shards.ShardInfo(a, &info));
        for (const auto& w : info.workers()) latest = std::max(latest, w.applied_step());
      }
    }
    if (latest >= 0) request.set_step(latest + (int64_t{4} << (2 * attempt)));
    request.set_hold_for_move(true);
    std::vector<absl::Status> cuts = InParallel(options.from.size(), [&](size_t i) {
      return shards.Call(options.from[i], &v1::AdminService::Stub::Checkpoint, request, &cut[i],
                         "the move's cut (Checkpoint)");
    });
    absl::Status s = FirstError(cuts);
    if (s.ok()) {
      result.step = cut[0].manifest().step();
      break;
    }
    // No shard may stay held by a cut that will not be committed.
    for (size_t i = 0; i < options.from.size(); ++i) {
      v1::AbortMoveResponse aborted;
      (void)shards.Call(options.from[i], &v1::AdminService::Stub::AbortMove, v1::AbortMoveRequest(),
                        &aborted, "AbortMove");
    }
    const bool passed =
        absl::IsFailedPrecondition(s) && absl::StrContains(s.message(), "has already pushed step");
    if (!passed || latest < 0 || attempt + 1 == kTries) return s;
  }
  result.cut_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  for (const auto& c : cut) {
    result.parts.push_back(c.path());
    result.cut_seconds =
        std::max(result.cut_seconds, c.cut_wait_seconds() + c.copy_seconds() + c.write_seconds());
  }

  // The switch: every shard of the new cluster, and the retiring ones.
  struct Commit {
    std::string address;
    v1::CommitMoveRequest request;
    v1::CommitMoveResponse response;
  };
  std::vector<Commit> commits;
  for (size_t j = 0; j < options.to.size(); ++j) {
    Commit& c = commits.emplace_back();
    c.address = options.to[j];
    c.request.set_shard_index(static_cast<uint32_t>(j));
  }
  for (const std::string& a : options.from) {
    if (next.contains(a)) continue;
    Commit& c = commits.emplace_back();
    c.address = a;
    c.request.set_retire(true);
  }
  for (Commit& c : commits) {
    for (const std::string& p : result.parts) c.request.add_parts(p);
    c.request.set_shard_count(static_cast<uint32_t>(options.to.size()));
    c.request.set_routing(options.routing.empty() ? routing : options.routing);
    for (const std::string& a : options.to) c.request.add_addresses(a);
  }
  const absl::Time commit_start = absl::Now();
  constexpr int kCommitTries = 3;
  std::vector<absl::Status> committed = InParallel(commits.size(), [&](size_t i) {
    absl::Status s;
    for (int attempt = 0; attempt < kCommitTries; ++attempt) {
      if (attempt > 0) absl::SleepFor(absl::Milliseconds(200) * attempt);
      s = shards.Call(commits[i].address, &v1::AdminService::Stub::CommitMove, commits[i].request,
                      &commits[i].response, "CommitMove");
      if (s.ok() || absl::IsInvalidArgument(s)) return s;
    }
    return s;
  });
  result.commit_seconds = absl::ToDoubleSeconds(absl::Now() - commit_start);
  result.held_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::vector<std::string> failed;
  size_t succeeded = 0;
  for (size_t i = 0; i < commits.size(); ++i) {
    if (committed[i].ok()) {
      ++succeeded;
    } else {
      failed.push_back(committed[i].ToString());
    }
  }
  if (!failed.empty()) {
    if (succeeded == 0) {
      for (const std::string& a : options.from) {
        v1::AbortMoveResponse aborted;
        (void)shards.Call(a, &v1::AdminService::Stub::AbortMove, v1::AbortMoveRequest(), &aborted,
                          "AbortMove");
      }
      return absl::Status(committed[0].code(),
                          absl::StrCat("the move was not committed on any shard and is aborted "
                                       "(the pushes go on under the old routing): ",
                                       absl::StrJoin(failed, "; ")));
    }
    return absl::Status(
        absl::StatusCode::kInternal,
        absl::StrCat("the move's commit failed on ", failed.size(), " of ", commits.size(),
                     " shards, which keep holding the pushes; send them CommitMove with parts ",
                     absl::StrJoin(result.parts, ","), " again: ", absl::StrJoin(failed, "; ")));
  }
  for (size_t j = 0; j < options.to.size(); ++j) {
    const v1::CommitMoveResponse& r = commits[j].response;
    result.shards.push_back(r);
    result.rows += r.rows();
    result.moved_rows += r.moved_rows();
    result.routing_epoch = r.routing_epoch();
  }
  return result;
}

}  // namespace ember
