// Server: one ember-server process: the Shard, its gRPC services, the health
// service and reflection.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/tls.h"
#include "shard/inflight_limit.h"
#include "shard/shard.h"
#include "shard/shard_host.h"
#include "shard/shard_metrics.h"
#include "shard/token_auth.h"

namespace grpc {
class Server;
}

namespace ember {

struct ServerOptions {
  // Address to listen on; "0.0.0.0" in containers.
  std::string address = "127.0.0.1";
  // TCP port; 0 picks a free one (see Server::port()).
  int port = 50051;
  // kSync: gRPC threads polling for requests (gRPC starts more while all
  // are busy); kAsync: the threads kept by the pool for calls that may block
  // (it adds more while all are busy: shard/work_pool.h).
  int worker_threads = 4;
  // How calls run (server/embedding_service.h, server/async_service.h):
  //   kAsync: gRPC's async API, each call on the completion thread that
  //     read it and only calls that may block on the worker_threads pool;
  //     the fewest thread hand-offs (docs/design.md); no reflection service.
  //   kSync: gRPC's synchronous API, each call on a polling thread, running
  //     the same handlers; serves gRPC reflection (grpcurl and other tools
  //     that discover the API from the shard), which is a sync-API service.
  enum class RpcMode { kSync, kAsync };
  RpcMode rpc_mode = RpcMode::kAsync;
  // kAsync: threads that each poll a completion queue and run its calls.
  // One is the fewest thread hand-offs per message; more serve many
  // trainers' streams in parallel.
  int completion_threads = 1;
  // Optional: protobuf text file with an ember.v1.TableConfigList whose
  // tables are created at start-up.
  std::string table_config_file;
  // Shard identity and request limits.
  ShardOptions shard;
  // Port of the Prometheus endpoint (GET /metrics on `address`); 0 picks a
  // free one (see Server::metrics_port()); -1: no metrics.
  int metrics_port = -1;
  // A bearer token for that endpoint (optional).
  MetricsHttpOptions metrics_http;
  // Checkpoints: where, how often, how many kept.
  CheckpointerOptions checkpoint;
  // "latest" (the newest checkpoint in checkpoint.directory that verifies;
  // none is fine) or a checkpoint directory's path; empty: start empty.
  // Restored before the tables of table_config_file are created and before
  // the shard serves.
  std::string restore_from;
  // TLS / mutual TLS for both services (plaintext when not enabled).
  ServerTlsOptions tls;
  // Bearer tokens and their roles (shard/token_auth.h); empty: every call
  // is accepted.
  std::string auth_tokens_file;
  // Request bytes calls may hold at once, per connection and in total
  // (shard/inflight_limit.h); beyond, RESOURCE_EXHAUSTED.
  InflightLimit::Options inflight{.total = uint64_t{1} << 30, .per_connection = uint64_t{512} << 20};

  absl::Status Validate() const;
};

class Server {
 public:
  // Validates the options, creates the configured tables and starts serving.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();

  // The bound port (the chosen one when options.port was 0).
  int port() const { return port_; }
  // The metrics port (the chosen one when options.metrics_port was 0); -1
  // without metrics.
  int metrics_port() const;
  Shard& shard() { return host_->shard(); }
  Checkpointer& checkpointer() { return host_->checkpointer(); }

  // Stops accepting calls, lets in-flight calls finish for up to `grace`,
  // then cancels the rest. Idempotent; thread-safe.
  void Shutdown(absl::Duration grace);
  // Blocks until the server has shut down.
  void Wait();

 private:
  Server() = default;
  struct Services;

  std::unique_ptr<metrics::Registry> registry_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  std::unique_ptr<ShardHost> host_;
  std::unique_ptr<TokenAuth> auth_;  // null: no authentication
  std::unique_ptr<InflightLimit> inflight_;  // outlives the services' calls
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int port_ = 0;
  std::once_flag async_stopped_;
};

}  // namespace ember
