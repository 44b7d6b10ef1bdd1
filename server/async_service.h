// The shard's services on gRPC's async API (ember-server --rpc_mode=async):
// a few threads, each polling its own completion queue, run the calls that
// complete there; only a call that may block (a lookup or exchange waiting
// for the SSP clock, any AdminService call) goes to a pool (shard/work_pool.h),
// which adds threads while all are busy.
//
// Why: in gRPC 1.51 (epoll1) one thread at a time polls the sockets of the
// whole process, and a thread that polls hands that role on to another
// waiting thread before it handles what it read. The sync server keeps 4-5
// pollers waiting beside the thread that runs a stream, so each message
// woke two or three threads. Here, with one completion thread (the
// default), the thread that reads a message also runs it and writes the
// answer, and nothing else waits to poll.
//
// The price of that: nothing in the process may use the sync API, whose
// pollers would take turns again, and nothing may use the callback API,
// whose threads would: so the reflection service (sync-only in gRPC) is not
// served in this mode, and the health check is answered here
// (server/shard_health.h) instead of by gRPC's default service. Every
// EmbeddingService and AdminService method is served.
// Calls are answered exactly as the sync server answers them: each one runs
// the sync service's own handler (EmbeddingServiceImpl, AdminServiceImpl).
//
// Life cycle: Register before the server is built, Start after, Stop after
// the server's Shutdown has returned.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "ember/v1/admin_service.grpc.pb.h"
#include "ember/v1/embedding_service.grpc.pb.h"
#include "server/admin_service.h"
#include "server/embedding_service.h"
#include "shard/work_pool.h"

namespace grpc {
class AsyncGenericService;
class ServerBuilder;
class ServerCompletionQueue;
}  // namespace grpc

namespace ember {

class ShardHealth;

class AsyncServices {
 public:
  // The generated async services, Exchange and ExchangeStream taken raw
  // (their messages parsed in place, their answers sent as their own
  // slices: ServedExchanges).
  using Embedding = v1::EmbeddingService::WithAsyncMethod_Lookup<
      v1::EmbeddingService::WithAsyncMethod_Push<v1::EmbeddingService::WithRawMethod_Exchange<
          v1::EmbeddingService::WithRawMethod_ExchangeStream<
              v1::EmbeddingService::WithAsyncMethod_RegisterWorker<
                  v1::EmbeddingService::WithAsyncMethod_UnregisterWorker<
                      v1::EmbeddingService::Service>>>>>>;
  using Admin = v1::AdminService::AsyncService;

  // `embedding`, `admin` and `shard` must outlive this object; their
  // handlers answer every call. The pool that runs the calls that may block
  // keeps `pool_threads` threads, and adds more while all are busy.
  AsyncServices(EmbeddingServiceImpl* embedding, AdminServiceImpl* admin, Shard* shard,
                int pool_threads);
  // Stops, if Stop was not called.
  ~AsyncServices();
  AsyncServices(const AsyncServices&) = delete;
  AsyncServices& operator=(const AsyncServices&) = delete;

  // Before builder.BuildAndStart(): registers both services, the health
  // check (a ShardHealth, the server's GetHealthCheckService) and one
  // completion queue per thread (`completion_threads` >= 1), and keeps the
  // reflection plugin out of this server (see above).
  void Register(grpc::ServerBuilder* builder, int completion_threads);
  // After BuildAndStart: asks for each method's first call on every queue
  // and starts the threads.
  void Start();
  // After the server's Shutdown has returned (every call has ended or been
  // cancelled): runs what the pool holds, waits for those calls to finish on
  // their queues (a lookup waiting for the clock is not woken: it ends at
  // its deadline or --max_ssp_wait), then shuts down and drains the queues
  // and joins their threads. Idempotent; not concurrent with itself.
  void Stop();

  // One pending operation of a call (asking for a call, a read, a write, a
  // finish): gRPC hands it back on the call's queue with whether it
  // succeeded, and the call takes its next step there. Public for the call
  // types in async_service.cc.
  class Tag {
   public:
    virtual ~Tag() = default;
    virtual void Proceed(bool ok) = 0;
  };
  // The pool, and how many calls it holds: sent there and not yet done.
  // Stop waits for them, since each comes back to its queue to finish.
  struct Offload {
    explicit Offload(int threads) : pool(threads) {}
    WorkPool pool;
    std::atomic<int> calls{0};
  };

 private:
  struct Methods;
  void ListenAll(grpc::ServerCompletionQueue* cq);

  EmbeddingServiceImpl* embedding_impl_;
  Embedding embedding_;
  Admin admin_;
  std::unique_ptr<grpc::AsyncGenericService> generic_;  // health checks, unknown methods
  const ShardHealth* health_ = nullptr;  // owned by the server
  Offload offload_;
  std::unique_ptr<Methods> methods_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs_;
  std::vector<std::thread> threads_;
  bool stopped_ = false;
};

}  // namespace ember
