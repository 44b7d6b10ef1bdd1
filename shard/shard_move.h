// A shard's side of an online move to another shard count (AdminService
// CommitMove and AbortMove; docs/operations.md, "Changing the shard count
// online"). The move's cut is a cluster checkpoint taken with
// CheckpointRequest.hold_for_move, which leaves every old shard holding the
// pushes of later steps; CommitMove loads the rows the new routing gives this
// shard from every part of that checkpoint and installs them with the new
// placement while the pushes wait, so that no push is applied between the
// cut and the switch.
#pragma once

#include "absl/status/status.h"
#include "common/file_system.h"
#include "ember/v1/admin_service.pb.h"
#include "shard/shard.h"
#include "shard/shard_metrics.h"

namespace ember {

// See AdminService.CommitMove. `metrics` may be null. Refuses, changing
// nothing: parts that are not one cluster checkpoint (OpenCheckpointParts's
// errors), a place outside the new shard count, addresses not one per new
// shard (INVALID_ARGUMENT); a shard of the old cluster whose epoch is not
// the parts' or whose pushes no move's cut holds (FAILED_PRECONDITION: a
// push after the cut would be lost). A commit the shard already made (same
// epoch and place) is answered OK again, so that the driver may retry.
absl::Status CommitMove(Shard* shard, FileSystem* fs, ShardMetrics* metrics,
                        const v1::CommitMoveRequest& request, v1::CommitMoveResponse* response);

}  // namespace ember
