#include "server/server.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/admin_service.h"
#include "server/async_service.h"
#include "server/embedding_service.h"
#include "server/protobuf_log.h"
#include "spdlog/spdlog.h"

namespace ember {

struct Server::Services {
  Services(const ServerOptions& options, Shard* shard, ShardMetrics* metrics,
           Checkpointer* checkpointer, const TokenAuth* auth, InflightLimit* inflight)
      : edge(shard, metrics, auth, inflight), embedding(&edge), admin(&edge, checkpointer) {
    if (options.rpc_mode == ServerOptions::RpcMode::kAsync) {
      async = std::make_unique<AsyncServices>(&embedding, &admin, shard, options.worker_threads);
    }
  }
  ShardEdge edge;
  // kSync registers these handlers with gRPC; kAsync runs the same handlers
  // from its completion threads (`async`), and registers nothing else.
  EmbeddingServiceImpl embedding;
  AdminServiceImpl admin;
  std::unique_ptr<AsyncServices> async;
};

absl::Status ServerOptions::Validate() const {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port: expected 0..65535, received ", port));
  }
  if (worker_threads < 1 || worker_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_threads: expected 1..1024, received ", worker_threads));
  }
  if (completion_threads < 1 || completion_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("completion_threads: expected 1..1024, received ", completion_threads));
  }
  if (address.empty()) return absl::InvalidArgumentError("address: expected a host, received ''");
  if (metrics_port < -1 || metrics_port > 65535 || (metrics_port == port && port != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics_port: expected -1 (off) or 0..65535 other than port ", port, ", received ",
        metrics_port));
  }
  EMBER_RETURN_IF_ERROR(tls.Validate());
  return ShardHostOptions{.shard = shard, .checkpoint = checkpoint, .restore_from = restore_from}
      .Validate();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  EMBER_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<Server> server(new Server());
  if (options.metrics_port >= 0) {
    server->registry_ = std::make_unique<metrics::Registry>();
    metrics::AddProcessMetrics(server->registry_.get());
    auto& protobuf_lines = server->registry_->AddCounter(
        "ember_protobuf_log_lines_total",
        "Lines libprotobuf logged in this shard (e.g. one per request with invalid UTF-8), "
        "by whether the shard's rate limit wrote them or held them back (server/protobuf_log.h).",
        {"outcome"});
    metrics::Counter& logged = protobuf_lines.With({"logged"});
    metrics::Counter& held_back = protobuf_lines.With({"held_back"});
    server->registry_->OnScrape([&logged, &held_back] {
      const ProtobufLogCounts counts = ProtobufLogLines();
      logged.Mirror(static_cast<double>(counts.logged));
      held_back.Mirror(static_cast<double>(counts.held_back));
    });
    server->registry_
        ->AddGauge("ember_build_info", "Always 1; the labels say which build serves.",
                   {"version", "device", "shard"})
        .With({EMBER_VERSION, options.shard.device.ToString(),
               absl::StrCat(options.shard.shard_index, "/", options.shard.shard_count)})
        .Set(1);
  }
  EMBER_ASSIGN_OR_RETURN(server->host_,
                         ShardHost::Start({.shard = options.shard,
                                           .checkpoint = options.checkpoint,
                                           .restore_from = options.restore_from,
                                           .table_config_file = options.table_config_file},
                                          server->registry_.get()));
  Shard* shard = &server->host_->shard();
  ShardMetrics* metrics = server->host_->metrics();
  if (!options.auth_tokens_file.empty()) {
    EMBER_ASSIGN_OR_RETURN(server->auth_, TokenAuth::FromFile(options.auth_tokens_file));
    server->auth_->SetMetrics(metrics);
    spdlog::info("authentication: {} bearer tokens from {}", server->auth_->size(),
                 options.auth_tokens_file);
    if (!options.tls.enabled()) {
      spdlog::warn(
          "authentication without TLS: bearer tokens cross the network in plaintext, where "
          "anyone on the path can read and reuse them; serve TLS (--tls_cert, --tls_key)");
    }
  }
  server->inflight_ = std::make_unique<InflightLimit>(options.inflight, metrics);
  server->services_ =
      std::make_unique<Services>(options, shard, metrics, &server->host_->checkpointer(),
                                 server->auth_.get(), server->inflight_.get());
  if (options.metrics_port >= 0) {
    EMBER_ASSIGN_OR_RETURN(server->metrics_http_,
                           MetricsHttpServer::Start(options.address, options.metrics_port,
                                                    server->registry_.get(), options.metrics_http));
  }

  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                         MakeServerCredentials(options.tls));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string target = absl::StrCat(options.address, ":", options.port);
  builder.AddListeningPort(target, credentials, &server->port_);
  // gRPC sets SO_REUSEPORT by default: a second shard started on a taken
  // port would then bind too, and the two would share its connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  AsyncServices* async = server->services_->async.get();
  if (async != nullptr) {
    async->Register(&builder, options.completion_threads);
  } else {
    builder.RegisterService(&server->services_->embedding);
    builder.RegisterService(&server->services_->admin);
  }
  const int max_bytes = static_cast<int>(
      std::min<uint64_t>(options.shard.max_message_bytes, std::numeric_limits<int>::max()));
  builder.SetMaxReceiveMessageSize(max_bytes);
  builder.SetMaxSendMessageSize(max_bytes);
  // No thread quota: a sync gRPC server out of quota answers new calls with
  // RESOURCE_EXHAUSTED instead of queueing them. worker_threads threads poll
  // for calls; gRPC adds threads while all of them are busy.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS,
                              options.worker_threads);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                              std::max(options.worker_threads, 2) * 2);
  server->grpc_server_ = builder.BuildAndStart();
  if (!server->grpc_server_ || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", target, ": port ", options.port,
        " is in use (or the address is not this machine's)"));
  }
  if (async != nullptr) async->Start();
  // Health by name too: probes and load balancers ask for a service.
  grpc::HealthCheckServiceInterface* health = server->grpc_server_->GetHealthCheckService();
  health->SetServingStatus(true);
  for (const char* service : {v1::EmbeddingService::service_full_name(),
                              v1::AdminService::service_full_name()}) {
    health->SetServingStatus(service, true);
  }
  return server;
}

int Server::metrics_port() const { return metrics_http_ ? metrics_http_->port() : -1; }

Server::~Server() {
  Shutdown(absl::ZeroDuration());
  Wait();
}

void Server::Shutdown(absl::Duration grace) {
  if (host_) host_->Stop();
  if (!grpc_server_) return;
  grpc_server_->GetHealthCheckService()->SetServingStatus(false);
  grpc_server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  // The async API's queues are shut down only after the server is.
  if (services_->async) std::call_once(async_stopped_, [this] { services_->async->Stop(); });
}

void Server::Wait() {
  if (grpc_server_) grpc_server_->Wait();
}

}  // namespace ember
