// ember.v1.EmbeddingService over a Shard: deadline check, call, status conversion.
#pragma once

#include "ember/v1/embedding_service.grpc.pb.h"
#include "server/shard.h"
#include "server/shard_metrics.h"

namespace ember {

class EmbeddingServiceImpl final : public v1::EmbeddingService::Service {
 public:
  // `shard` and `metrics` (null: none) must outlive the service.
  EmbeddingServiceImpl(Shard* shard, ShardMetrics* metrics) : shard_(shard), metrics_(metrics) {}

  grpc::Status Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  grpc::Status Push(grpc::ServerContext* context, const v1::PushRequest* request,
                    v1::PushResponse* response) override;
  grpc::Status Exchange(grpc::ServerContext* context, const v1::ExchangeRequest* request,
                        v1::ExchangeResponse* response) override;
  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status UnregisterWorker(grpc::ServerContext* context,
                                const v1::UnregisterWorkerRequest* request,
                                v1::UnregisterWorkerResponse* response) override;

 private:
  // Runs `call`, then counts it per method and status code with its latency.
  template <typename Call>
  grpc::Status Measured(ShardMetrics::Rpc rpc, Call call);

  Shard* shard_;
  ShardMetrics* metrics_;
};

}  // namespace ember
