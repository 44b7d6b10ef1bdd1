// ember-server: flags -> ServerOptions, start, wait for SIGTERM/SIGINT.
#include <csignal>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/abseil_mode.h"
#include "server/protobuf_log.h"
#include "server/server.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace {
// Each flag's default is its option's (server/server.h): written once.
const ember::ServerOptions& Defaults() {
  static const ember::ServerOptions defaults;
  return defaults;
}
}  // namespace

ABSL_FLAG(std::string, address, Defaults().address, "Address to listen on (0.0.0.0 in containers).");
ABSL_FLAG(int, port, Defaults().port, "gRPC port; 0 picks a free one and prints it.");
ABSL_FLAG(uint32_t, shard_index, Defaults().shard.shard_index, "This shard's index, 0 <= shard_index < shard_count.");
ABSL_FLAG(uint32_t, shard_count, Defaults().shard.shard_count, "Number of shards in the cluster.");
ABSL_FLAG(std::string, routing, Defaults().shard.routing,
          "How keys map to shards when the shard starts empty or reshards a restore: "
          "splitmix64-jump65536 (moves 1/(n+1) of the keys from n to n+1 shards) or "
          "splitmix64-fastrange32 (older checkpoints' routing; moves half). A restore of a "
          "part of the same shard count keeps the routing its checkpoint records.");
ABSL_FLAG(int, worker_threads, Defaults().worker_threads,
          "--rpc_mode=async: the threads kept for calls that may block (lookups that wait "
          "for the SSP clock, admin calls); more start while all are busy, so a ready call "
          "never queues behind waiting ones. --rpc_mode=sync: gRPC threads polling for "
          "requests; more start while all are busy.");
ABSL_FLAG(std::string, rpc_mode, "async",
          "How calls run: async (the default: gRPC's async API, each call on the completion "
          "thread that read it, calls that may block on the worker_threads pool; fewest "
          "thread hand-offs per message; no reflection service), sync (gRPC's synchronous "
          "API, a polling thread per call, the same handlers; serves gRPC reflection, for "
          "grpcurl and other tools that discover the API from the shard).");
ABSL_FLAG(int, completion_threads, Defaults().completion_threads,
          "--rpc_mode=async: threads each polling a completion queue and running its calls; 1 "
          "hands off least, more serve many trainers in parallel.");
ABSL_FLAG(std::string, table_config_file, "",
          "Optional text-format ember.v1.TableConfigList created at start-up.");
ABSL_FLAG(uint64_t, max_keys_per_request, Defaults().shard.max_keys_per_request,
          "Most keys one Lookup or Push may carry.");
ABSL_FLAG(uint64_t, max_message_bytes, Defaults().shard.max_message_bytes,
          "Largest request or response message in bytes.");
ABSL_FLAG(absl::Duration, max_ssp_wait, Defaults().shard.max_ssp_wait,
          "Longest a lookup waits for slower workers' pushes (SSP), e.g. 30s.");
ABSL_FLAG(absl::Duration, write_log_keep, Defaults().shard.write_log_keep,
          "How long the record of which rows recent pushes wrote (for trainers' early fetch at "
          "s = 0) is kept after the last peek; nothing is recorded until a trainer peeks. "
          "inf: always.");
ABSL_FLAG(int, metrics_port, Defaults().metrics_port,
          "Prometheus endpoint port (GET /metrics); 0 picks a free one; -1: no metrics.");
ABSL_FLAG(std::string, metrics_bearer_token_file, "",
          "A file whose first line is a token every scrape of the metrics endpoint must send "
          "(Authorization: Bearer; Prometheus' authorization.credentials_file); else 401.");
ABSL_FLAG(std::string, device, "cpu",
          "Where tables live: cpu (host memory) or cuda:N (GPU N's memory).");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Directory of this shard's checkpoints (one subdirectory each); empty: none.");
ABSL_FLAG(absl::Duration, checkpoint_interval, Defaults().checkpoint.interval,
          "Time between periodic checkpoints, e.g. 10m; 0: only on request (and on exit).");
ABSL_FLAG(bool, checkpoint_incremental, Defaults().checkpoint.incremental,
          "Periodic checkpoints hold only the rows changed since the previous one.");
ABSL_FLAG(int, checkpoint_full_every, Defaults().checkpoint.full_every,
          "With --checkpoint_incremental, every N-th periodic checkpoint is a full one.");
ABSL_FLAG(int, checkpoint_keep, Defaults().checkpoint.keep,
          "Full checkpoints kept, with the deltas on them; older ones are deleted. 0: all.");
ABSL_FLAG(bool, checkpoint_on_exit, true,
          "With --checkpoint_dir, write a checkpoint on SIGTERM/SIGINT after serving stops.");
ABSL_FLAG(bool, join, false,
          "Start outside any cluster, to join one in a move to more shards (ember-move): "
          "serves no Lookup, Push or Exchange until the move gives it its index and shard "
          "count (--shard_index and --shard_count are then ignored).");
ABSL_FLAG(std::string, restore_from, "",
          "Restore before serving: 'latest' (newest valid checkpoint in --checkpoint_dir, "
          "none is fine), a checkpoint directory, or every part of a cluster checkpoint "
          "separated by commas (PART0,PART1,...: any shard count or routing; this shard "
          "reads the rows it owns under --shard_count and --routing).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of this shard: serve both services over TLS (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificate(s): mutual TLS, every client must present a certificate it signed.");
ABSL_FLAG(uint32_t, max_tables, Defaults().shard.max_tables, "Most tables on this shard.");
ABSL_FLAG(uint64_t, max_rows, Defaults().shard.max_rows,
          "Most rows over all of this shard's tables; writing lookups and pushes that would "
          "insert past it are refused (RESOURCE_EXHAUSTED); 0: no shard-wide limit.");
ABSL_FLAG(uint64_t, max_inflight_bytes, Defaults().inflight.total,
          "Request bytes the calls running at once may hold over all connections; beyond, "
          "RESOURCE_EXHAUSTED. 0: no limit.");
ABSL_FLAG(uint64_t, max_inflight_bytes_per_connection, Defaults().inflight.per_connection,
          "Request bytes the calls of one connection may hold at once; beyond, "
          "RESOURCE_EXHAUSTED. 0: no limit.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "Lines of '<token> <role>' (role trainer or admin): every call must carry "
          "'authorization: Bearer <token>'; empty: no authentication.");
ABSL_FLAG(double, shutdown_grace_seconds, 5.0,
          "On SIGTERM/SIGINT, how long in-flight calls may finish.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Ember embedding shard server");
  absl::ParseCommandLine(argc, argv);
  ember::DisableAbslDeadlockDetection();  // see common/abseil_mode.h
  // Logs go to stderr; stdout carries only the EMBER_READY line.
  spdlog::set_default_logger(spdlog::stderr_color_mt("ember-server"));
  // Before any thread parses a request: a client must not be able to write
  // a log line per request (server/protobuf_log.h).
  ember::RouteProtobufLogs();

  ember::ServerOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  options.port = absl::GetFlag(FLAGS_port);
  options.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  options.completion_threads = absl::GetFlag(FLAGS_completion_threads);
  const std::string rpc_mode = absl::GetFlag(FLAGS_rpc_mode);
  if (rpc_mode == "sync") {
    options.rpc_mode = ember::ServerOptions::RpcMode::kSync;
  } else if (rpc_mode == "async") {
    options.rpc_mode = ember::ServerOptions::RpcMode::kAsync;
  } else {
    std::fprintf(stderr,
                 "ember-server: --rpc_mode: expected async or sync, "
                 "received '%s'\n", rpc_mode.c_str());
    return 2;
  }
  options.table_config_file = absl::GetFlag(FLAGS_table_config_file);
  options.shard.shard_index = absl::GetFlag(FLAGS_shard_index);
  options.shard.shard_count = absl::GetFlag(FLAGS_shard_count);
  options.shard.routing = absl::GetFlag(FLAGS_routing);
  options.shard.join = absl::GetFlag(FLAGS_join);
  options.shard.max_keys_per_request = absl::GetFlag(FLAGS_max_keys_per_request);
  options.shard.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  options.inflight.total = absl::GetFlag(FLAGS_max_inflight_bytes);
  options.inflight.per_connection = absl::GetFlag(FLAGS_max_inflight_bytes_per_connection);
  options.shard.max_tables = absl::GetFlag(FLAGS_max_tables);
  options.shard.max_rows = absl::GetFlag(FLAGS_max_rows);
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.shard.max_ssp_wait = absl::GetFlag(FLAGS_max_ssp_wait);
  options.shard.write_log_keep = absl::GetFlag(FLAGS_write_log_keep);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_http.bearer_token_file = absl::GetFlag(FLAGS_metrics_bearer_token_file);
  options.checkpoint.directory = absl::GetFlag(FLAGS_checkpoint_dir);
  options.checkpoint.interval = absl::GetFlag(FLAGS_checkpoint_interval);
  options.checkpoint.incremental = absl::GetFlag(FLAGS_checkpoint_incremental);
  options.checkpoint.full_every = absl::GetFlag(FLAGS_checkpoint_full_every);
  options.checkpoint.keep = absl::GetFlag(FLAGS_checkpoint_keep);
  options.restore_from = absl::GetFlag(FLAGS_restore_from);
  auto device = ember::ParseStoreDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    spdlog::error("ember-server: --device: {}", device.status().ToString());
    return 2;
  }
  options.shard.device = *device;

  // Block the stop signals in every thread (gRPC's threads inherit the mask)
  // and take them synchronously below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (options.shard.join && !options.restore_from.empty()) {
    spdlog::error(
        "ember-server: --join starts a shard with nothing; --restore_from='{}' with it "
        "would be dropped by the move that gives it its place",
        options.restore_from);
    return 2;
  }
  auto server = ember::Server::Start(options);
  if (!server.ok()) {
    spdlog::error("ember-server: {}", server.status().ToString());
    return 2;
  }
  spdlog::info("shard {}/{} serving on {}:{}", options.shard.shard_index,
               options.shard.shard_count, options.address, (*server)->port());
  // Machine-readable line for scripts and tests that started us with --port=0.
  std::printf("EMBER_READY port=%d metrics_port=%d\n", (*server)->port(),
              (*server)->metrics_port());
  std::fflush(stdout);

  int signal = 0;
  sigwait(&stop_signals, &signal);
  spdlog::info("signal {}: shutting down", signal);
  const absl::Duration grace = absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds));
  (*server)->Shutdown(grace);
  (*server)->Wait();
  if (!options.checkpoint.directory.empty() && absl::GetFlag(FLAGS_checkpoint_on_exit)) {
    // Serving has stopped: the state is cut as it is, every worker's
    // progress recorded (workers at different steps would never reach a
    // common cut now).
    ember::v1::CheckpointResponse response;
    absl::Status s = (*server)->checkpointer().CheckpointOnExit(options.checkpoint.incremental,
                                                                absl::Now() + grace, &response);
    if (!s.ok()) spdlog::error("checkpoint on exit failed: {}", s.ToString());
  }
  spdlog::info("stopped");
  return 0;
}
