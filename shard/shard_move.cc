#include "shard/shard_move.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "shard/reshard.h"
#include "spdlog/spdlog.h"

namespace ember {
namespace {

absl::Status ValidatePlace(const v1::CommitMoveRequest& request) {
  if (request.parts().empty()) {
    return absl::InvalidArgumentError(
        "field 'parts': expected the move's cut, one checkpoint path per old shard, received none");
  }
  if (request.shard_count() < 1 || request.shard_count() > kMaxShards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'shard_count': expected 1 to ", kMaxShards, ", received ", request.shard_count()));
  }
  if (!request.retire() && request.shard_index() >= request.shard_count()) {
    return absl::InvalidArgumentError(absl::StrCat("field 'shard_index': expected < shard_count ",
                                                   request.shard_count(), ", received ",
                                                   request.shard_index()));
  }
  if (static_cast<uint32_t>(request.addresses_size()) != request.shard_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'addresses': expected one per shard of the new cluster (",
                     request.shard_count(), "), received ", request.addresses_size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CommitMove(Shard* shard, FileSystem* fs, ShardMetrics* metrics,
                        const v1::CommitMoveRequest& request, v1::CommitMoveResponse* response) {
  const absl::Time start = absl::Now();
  EMBER_RETURN_IF_ERROR(ValidatePlace(request));
  EMBER_ASSIGN_OR_RETURN(CheckpointParts cluster,
                         OpenCheckpointParts(fs, std::vector<std::string>(request.parts().begin(),
                                                                          request.parts().end())));
  const std::string routing = request.routing().empty() ? cluster.routing : request.routing();
  EMBER_ASSIGN_OR_RETURN(KeyRouter router, KeyRouter::Make(routing, request.shard_count()));
  const uint64_t epoch = cluster.resharded_epoch();

  const std::shared_ptr<const ShardPlacement> now = shard->placement();
  if (now->epoch == epoch && now->count == request.shard_count() &&
      now->retired == request.retire() &&
      (request.retire() || now->index == request.shard_index())) {
    response->set_routing_epoch(epoch);  // a retry of a commit made
    for (const Shard::TableStats& t : shard->AllTableStats()) {
      response->set_rows(response->rows() + t.stats.rows);
    }
    return absl::OkStatus();
  }
  if (!now->joining) {
    if (now->epoch != cluster.routing_epoch) {
      return absl::FailedPreconditionError(absl::StrCat(
          "field 'parts': the move's cut is of routing epoch ", cluster.routing_epoch,
          ", this shard (", now->index, " of ", now->count, ") is at routing epoch ", now->epoch));
    }
    if (!shard->move_held()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", now->index, " of ", now->count,
          ": no move's cut holds its pushes (Checkpoint with hold_for_move), so pushes after the "
          "cut may have been applied and a commit would lose them; cut again"));
    }
  }

  ShardPlacement placement;
  placement.index = request.retire() ? 0 : request.shard_index();
  placement.count = request.shard_count();
  placement.router = router;
  placement.epoch = epoch;
  placement.retired = request.retire();
  placement.addresses.assign(request.addresses().begin(), request.addresses().end());

  std::vector<RestoredTable> tables;
  uint64_t moved = 0;
  if (!request.retire()) {
    EMBER_ASSIGN_OR_RETURN(tables, LoadOwnedTables(fs, cluster, router, request.shard_index(),
                                                   shard->options().device, &moved));
    response->set_bytes_read(cluster.bytes);
  }
  const std::string source = absl::StrCat("move to ", request.shard_count(), " shards from ",
                                          request.parts(0), request.parts_size() > 1 ? ",..." : "");
  shard->InstallMoved(std::move(tables),
                      request.retire() ? decltype(cluster.workers){} : cluster.workers,
                      std::move(placement), source);
  for (const Shard::TableStats& t : shard->AllTableStats()) {
    response->set_rows(response->rows() + t.stats.rows);
  }
  response->set_routing_epoch(epoch);
  response->set_moved_rows(moved);
  response->set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  if (metrics != nullptr) {
    metrics->RecordRestore(response->seconds(), cluster.step,
                           static_cast<uint32_t>(request.parts_size()), response->bytes_read(),
                           moved, routing);
  }
  if (request.retire()) {
    spdlog::info("move: left the cluster, now {} shards at routing epoch {}", request.shard_count(),
                 epoch);
  } else {
    spdlog::info(
        "move: shard {} of {} at routing epoch {} ({} rows, {} from other shards, {:.3f} s, cut at "
        "step {})",
        request.shard_index(), request.shard_count(), epoch, response->rows(), moved,
        response->seconds(), cluster.step);
  }
  return absl::OkStatus();
}

}  // namespace ember
