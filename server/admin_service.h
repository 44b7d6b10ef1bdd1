// ember.v1.AdminService over a Shard.
#pragma once

#include "ember/v1/admin_service.grpc.pb.h"
#include "shard/checkpointer.h"
#include "shard/shard_edge.h"

namespace ember {

class AdminServiceImpl final : public v1::AdminService::Service {
 public:
  // `edge` (whose tokens authorise the calls) and `checkpointer` must
  // outlive the service. CreateTable, DropTable, Checkpoint and the
  // moves need the admin role; the read-only calls any role.
  AdminServiceImpl(const ShardEdge* edge, Checkpointer* checkpointer)
      : edge_(edge), checkpointer_(checkpointer) {}

  grpc::Status CreateTable(grpc::ServerContext* context, const v1::CreateTableRequest* request,
                           v1::CreateTableResponse* response) override;
  grpc::Status ListTables(grpc::ServerContext* context, const v1::ListTablesRequest* request,
                          v1::ListTablesResponse* response) override;
  grpc::Status DropTable(grpc::ServerContext* context, const v1::DropTableRequest* request,
                         v1::DropTableResponse* response) override;
  grpc::Status GetShardInfo(grpc::ServerContext* context, const v1::GetShardInfoRequest* request,
                            v1::GetShardInfoResponse* response) override;
  grpc::Status Checkpoint(grpc::ServerContext* context, const v1::CheckpointRequest* request,
                          v1::CheckpointResponse* response) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* context,
                               const v1::ListCheckpointsRequest* request,
                               v1::ListCheckpointsResponse* response) override;
  grpc::Status CommitMove(grpc::ServerContext* context, const v1::CommitMoveRequest* request,
                          v1::CommitMoveResponse* response) override;
  grpc::Status AbortMove(grpc::ServerContext* context, const v1::AbortMoveRequest* request,
                         v1::AbortMoveResponse* response) override;

 private:
  const ShardEdge* edge_;
  Checkpointer* checkpointer_;
};

}  // namespace ember
