// ember.v1.EmbeddingService over a shard's edge (shard/shard_edge.h, which
// authorises, admits, checks the routing and counts each call): reading the
// call's metadata, the exchanges' bytes, and the status conversion. EmbeddingServiceImpl's handlers serve gRPC's synchronous API
// (every call on one of the server's polling threads) and, called by
// server/async_service.h, its async API (the default).
#pragma once

#include "ember/v1/embedding_service.grpc.pb.h"
#include "shard/shard_edge.h"

namespace ember {

// Exchanges as the shard serves them from their bytes, whichever thread
// runs each half: Open once per call, then per message Receive, Push (which
// never waits: it runs where the message was read, since a lookup waiting
// elsewhere may need it), then Answer (the lookup, which may wait for the
// SSP clock when MayWait). The sync server runs the halves in its stream
// loop; the async server (server/async_service.h) runs Answer on its pool
// when it may wait, for streams and for unary Exchange calls (one message).
// The gradients are read where they arrived (ReceivedExchange) and the rows
// sent as their own slices (SerializeAliased).
//
// Thread safety: none; one step at a time. `context` must outlive it.
class ServedExchanges {
 public:
  // `rpc`: "ExchangeStream" or "Exchange", for authorization, limits and
  // errors. The service's shard must outlive it.
  ServedExchanges(const class EmbeddingServiceImpl& service,
                  const grpc::ServerContextBase* context, const char* rpc);
  ~ServedExchanges();
  ServedExchanges(const ServedExchanges&) = delete;
  ServedExchanges& operator=(const ServedExchanges&) = delete;

  // The call's deadline (not passed in queue) and authorization; not OK
  // ends the call with it.
  grpc::Status Open();
  // Reads one message (and empties `in`); INVALID_ARGUMENT if it is not an
  // ExchangeRequest.
  grpc::Status Receive(grpc::ByteBuffer* in);
  // Admits the received message (in-flight bytes) and applies its push. Not
  // OK ends the call with it (and counts it in the metrics).
  grpc::Status Push();
  // Whether Answer may block waiting for slower workers (SSP); after Push.
  bool MayWait() const;
  // Runs the lookup, counts the exchange in the metrics, and serialises the
  // answer into `out`, whose slices point into a response of this object
  // until gRPC has sent them. Not OK ends the call with it.
  grpc::Status Answer(grpc::ByteBuffer* out);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

class EmbeddingServiceImpl final : public v1::EmbeddingService::Service {
 public:
  // `edge` must outlive the service.
  explicit EmbeddingServiceImpl(const ShardEdge* edge);

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
  friend class ServedExchanges;
  // ExchangeStream, taken raw (the constructor installs it in place of the
  // generated handler): its messages are parsed here and its answers
  // serialised by SerializeAliased (common/aliased_serialize.h), so that
  // rows are not copied again on the way out. The
  // wire bytes are the same. One thread of the sync server per open stream,
  // for the stream's life.
  grpc::Status ExchangeStreamRaw(grpc::ServerContext* context,
                                 grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream);
  const ShardEdge* edge_;
};

}  // namespace ember
