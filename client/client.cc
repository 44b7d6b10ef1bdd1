#include "ember/client.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/admin_stubs.h"
#include "client/grpc_channel.h"
#include "client/in_process_channel.h"
#include "client/request_plan.h"
#include "common/status_macros.h"

namespace ember {

namespace {

// The options with "inproc:N" in `shards` read as in_process.shards = N.
absl::StatusOr<ClientOptions> Resolved(const ClientOptions& options) {
  ClientOptions out = options;
  if (options.shards.size() == 1 && absl::StartsWith(options.shards[0], kInProcessPrefix)) {
    uint32_t n = 0;
    if (!absl::SimpleAtoi(absl::string_view(options.shards[0]).substr(strlen(kInProcessPrefix)),
                          &n) ||
        n == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shards: expected 'inproc:N' with N >= 1, received '", options.shards[0], "'"));
    }
    if (options.in_process.shards != 0 && options.in_process.shards != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("in_process.shards: expected ", n, " (as shards '", options.shards[0],
                       "' says), received ", options.in_process.shards));
    }
    out.in_process.shards = n;
    out.shards.clear();
  }
  return out;
}

}  // namespace

absl::Status ClientOptions::Validate() const {
  EMBER_ASSIGN_OR_RETURN(const ClientOptions resolved, Resolved(*this));
  const InProcessOptions& in = resolved.in_process;
  if (in.shards > 0) {
    if (!resolved.shards.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shards: expected no address with in_process.shards = ", in.shards,
                       ", received ", resolved.shards.size()));
    }
    EMBER_RETURN_IF_ERROR(CheckInProcessDevice(in.device));
    if (in.checkpoint_interval < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("in_process.checkpoint_interval: expected >= 0, received ",
                       absl::FormatDuration(in.checkpoint_interval)));
    }
    if (in.checkpoint_dir.empty() &&
        (!in.restore_from.empty() || in.checkpoint_interval > absl::ZeroDuration())) {
      return absl::InvalidArgumentError(
          "in_process.checkpoint_dir: expected a directory for restore_from or "
          "checkpoint_interval, received ''");
    }
  } else {
    if (shards.empty()) {
      return absl::InvalidArgumentError("shards: expected >= 1 address, received 0");
    }
    for (size_t i = 0; i < shards.size(); ++i) {
      if (shards[i].empty() || shards[i].find(':') == std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("shards[", i, "]: expected host:port, received '", shards[i], "'"));
      }
    }
  }
  const std::pair<const char*, absl::Duration> positive[] = {{"rpc_timeout", rpc_timeout},
                                                            {"connect_timeout", connect_timeout},
                                                            {"initial_backoff", initial_backoff},
                                                            {"max_backoff", max_backoff}};
  for (const auto& [name, d] : positive) {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": expected > 0, received ", absl::FormatDuration(d)));
    }
  }
  EMBER_RETURN_IF_ERROR(tls.Validate());
  if (retry_budget < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("retry_budget: expected >= 0, received ",
                                                   absl::FormatDuration(retry_budget)));
  }
  return absl::OkStatus();
}

std::string InProcessCheckpointDir(const std::string& checkpoint_dir, uint32_t shard) {
  return absl::StrCat(checkpoint_dir, "/shard-", shard);
}

Client::Client(std::unique_ptr<ShardChannel> channel, const ClientOptions& options)
    : options_(options), channel_(std::move(channel)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& given) {
  EMBER_ASSIGN_OR_RETURN(const ClientOptions options, Resolved(given));
  EMBER_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<ShardChannel> channel;
  if (options.in_process.shards > 0) {
    EMBER_ASSIGN_OR_RETURN(channel, NewInProcessChannel(options));
  } else {
    EMBER_ASSIGN_OR_RETURN(channel, NewGrpcChannel(options));
  }
  return Connect(std::move(channel), options);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(std::unique_ptr<ShardChannel> channel,
                                                        const ClientOptions& options) {
  if (channel == nullptr || channel->shard_count() == 0) {
    return absl::InvalidArgumentError("channel: expected one with >= 1 shard");
  }
  std::unique_ptr<Client> client(new Client(std::move(channel), options));
  std::vector<v1::GetShardInfoResponse> infos;
  // wait_for_ready: a shard may still be starting. A refused TLS handshake
  // looks the same from here as a shard that is not up yet.
  if (absl::Status s = client->channel_->GetShardInfo(options.connect_timeout,
                                                      /*wait_for_ready=*/true, &infos);
      !s.ok()) {
    if (!absl::IsDeadlineExceeded(s)) return s;
    return absl::DeadlineExceededError(absl::StrCat(
        s.message(), " (no connection within connect_timeout ",
        absl::FormatDuration(options.connect_timeout), ": is the shard up, and do its TLS "
        "settings match the client's: TLS ", options.tls.enabled ? "on" : "off",
        options.tls.cert_file.empty() ? ", no client certificate" : ", a client certificate",
        "?)"));
  }
  const uint32_t n = client->shard_count();
  for (uint32_t i = 0; i < n; ++i) {
    const v1::GetShardInfoResponse& info = infos[i];
    if (!info.joining() && !info.retired()) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        client->ShardName(i),
        info.joining() ? ": waits to join a cluster (ember-server --join), serving nothing yet"
                       : absl::StrCat(": left its cluster in a move; the cluster is now ",
                                      absl::StrJoin(info.cluster_addresses(), ","),
                                      " (Client::ConnectToCluster follows it)")));
  }
  for (uint32_t i = 0; i < n; ++i) {
    const v1::GetShardInfoResponse& info = infos[i];
    if (info.shard_index() != i || info.shard_count() != n) {
      return absl::FailedPreconditionError(
          absl::StrCat(client->ShardName(i), ": expected shard ", i, " of ", n, ", received shard ",
                       info.shard_index(), " of ", info.shard_count(),
                       " (list the shard addresses in shard-index order)"));
    }
    if (info.routing() != infos[0].routing()) {
      return absl::FailedPreconditionError(
          absl::StrCat(client->ShardName(i), ": expected routing '", infos[0].routing(),
                       "' (as shard 0), received '", info.routing(), "'"));
    }
    if (info.routing_epoch() != infos[0].routing_epoch()) {
      return absl::FailedPreconditionError(absl::StrCat(
          client->ShardName(i), ": expected routing epoch ", infos[0].routing_epoch(),
          " (as shard 0), received ", info.routing_epoch(),
          " (shards restored from different reshards of a checkpoint, or a shard started apart "
          "from its cluster)"));
    }
  }
  absl::StatusOr<KeyRouter> router = KeyRouter::Make(infos[0].routing(), n);
  if (!router.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(client->ShardName(0),
                                                      ": this client cannot route by the shards' ",
                                                      router.status().message()));
  }
  client->router_ = *std::move(router);
  client->routing_epoch_ = infos[0].routing_epoch();
  client->channel_->SetRoutingEpoch(client->routing_epoch_);
  return client;
}

absl::StatusOr<std::unique_ptr<Client>> Client::ConnectToCluster(const ClientOptions& given) {
  EMBER_ASSIGN_OR_RETURN(const ClientOptions options, Resolved(given));
  if (options.in_process.shards > 0) return Connect(options);
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  for (;;) {
    // The addresses the newest routing epoch names, or the ones given.
    ClientOptions now = options;
    AdminStubs stubs(options.tls, options.auth_token, options.rpc_timeout);
    uint64_t newest = 0;
    for (const std::string& address : options.shards) {
      v1::GetShardInfoResponse info;
      if (!stubs.Open(address).ok() || !stubs.ShardInfo(address, &info).ok()) continue;
      if (info.routing_epoch() > newest && info.cluster_addresses_size() > 0) {
        newest = info.routing_epoch();
        now.shards.assign(info.cluster_addresses().begin(), info.cluster_addresses().end());
      }
    }
    absl::StatusOr<std::unique_ptr<Client>> client = Connect(now);
    // Shards of two epochs, or a joining one: a move is committing.
    if (client.ok() || !absl::IsFailedPrecondition(client.status()) || absl::Now() > deadline) {
      return client;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<int64_t> Client::AppliedStep(uint32_t worker_id) {
  EMBER_ASSIGN_OR_RETURN(std::vector<v1::GetShardInfoResponse> infos, ShardInfos());
  int64_t applied = std::numeric_limits<int64_t>::max();
  for (const v1::GetShardInfoResponse& info : infos) {
    int64_t here = -1;
    for (const v1::WorkerStep& w : info.workers()) {
      if (w.worker_id() == worker_id) here = w.applied_step();
    }
    applied = std::min(applied, here);
  }
  return applied;
}

uint32_t Client::shard_count() const { return channel_->shard_count(); }
const ClientOptions& Client::options() const { return options_; }
uint32_t Client::ShardOf(uint64_t key) const { return router_.ShardOf(key); }
std::string Client::ShardName(uint32_t shard) const { return channel_->ShardName(shard); }
bool Client::in_process() const { return channel_->in_process(); }

absl::Status Client::CheckShardCount(absl::string_view method, size_t requests) const {
  if (requests == shard_count()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(method, ": expected ", shard_count(),
                                                 " requests (one per shard), received ", requests));
}

absl::Status Client::CreateTable(const v1::TableConfig& config) {
  std::vector<v1::CreateTableRequest> requests(shard_count());
  for (auto& r : requests) *r.mutable_config() = config;
  std::vector<v1::CreateTableResponse> responses;
  return channel_->CreateTable(requests, &responses);
}

absl::StatusOr<std::vector<v1::TableInfo>> Client::ListTables() {
  std::vector<bool> only_first(shard_count(), false);
  only_first[0] = true;
  std::vector<v1::ListTablesResponse> responses;
  EMBER_RETURN_IF_ERROR(channel_->ListTables(only_first, &responses));
  return std::vector<v1::TableInfo>(responses[0].tables().begin(), responses[0].tables().end());
}

absl::StatusOr<uint64_t> Client::StoredRows(const std::string& table) {
  std::vector<v1::ListTablesResponse> responses;
  EMBER_RETURN_IF_ERROR(channel_->ListTables(std::vector<bool>(shard_count(), true), &responses));
  uint64_t rows = 0;
  for (uint32_t s = 0; s < shard_count(); ++s) {
    bool found = false;
    for (const v1::TableInfo& t : responses[s].tables()) {
      if (t.config().name() == table) {
        rows += t.rows();
        found = true;
      }
    }
    if (!found) {
      return absl::NotFoundError(absl::StrCat("table '", table, "' not found on ", ShardName(s)));
    }
  }
  return rows;
}

absl::Status Client::Lookup(absl::Span<const v1::LookupRequest> requests,
                            std::vector<v1::LookupResponse>* responses) {
  EMBER_RETURN_IF_ERROR(CheckShardCount("Lookup", requests.size()));
  std::vector<bool> active(shard_count());
  for (uint32_t i = 0; i < shard_count(); ++i) {
    active[i] = requests[i].tables_size() > 0 || requests[i].has_step();
  }
  return channel_->Lookup(requests, active, responses);
}

absl::Status Client::Push(absl::Span<const v1::PushRequest> requests,
                          std::vector<v1::PushResponse>* responses) {
  EMBER_RETURN_IF_ERROR(CheckShardCount("Push", requests.size()));
  return channel_->Push(requests, responses);
}

absl::Status Client::Exchange(const ExchangeCall& call, std::vector<ExchangeAnswer>* answers,
                              std::vector<ShardCall>* calls) {
  EMBER_RETURN_IF_ERROR(CheckShardCount("Exchange", call.requests.size()));
  return channel_->Exchange(call, answers, calls);
}

namespace {

// The answers' rows copied into responses' fields.
void TakeMessages(std::vector<ExchangeAnswer>* answers,
                  std::vector<v1::ExchangeResponse>* responses) {
  responses->resize(answers->size());
  for (size_t i = 0; i < answers->size(); ++i) (*responses)[i] = (*answers)[i].TakeMessage();
}

}  // namespace

absl::Status Client::Exchange(absl::Span<const v1::ExchangeRequest> requests,
                              std::vector<v1::ExchangeResponse>* responses,
                              std::vector<ShardCall>* calls) {
  // Not owned: the channel reads them only during the call.
  std::vector<std::shared_ptr<const v1::ExchangeRequest>> views(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) views[i] = {std::shared_ptr<void>(), &requests[i]};
  std::vector<ExchangeAnswer> answers;
  absl::Status status = Exchange({views, /*handed_over=*/false}, &answers, calls);
  TakeMessages(&answers, responses);
  return status;
}

absl::Status Client::Exchange(std::vector<std::shared_ptr<const v1::ExchangeRequest>> requests,
                              std::vector<v1::ExchangeResponse>* responses,
                              std::vector<ShardCall>* calls) {
  std::vector<ExchangeAnswer> answers;
  absl::Status status = Exchange(std::move(requests), &answers, calls);
  TakeMessages(&answers, responses);
  return status;
}

absl::Status Client::Exchange(std::vector<std::shared_ptr<const v1::ExchangeRequest>> requests,
                              std::vector<ExchangeAnswer>* answers,
                              std::vector<ShardCall>* calls) {
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("Exchange: request ", i, " is null"));
    }
  }
  return Exchange({requests, /*handed_over=*/true}, answers, calls);
}

absl::Status Client::RegisterWorker(uint32_t worker_id, int64_t first_step) {
  std::vector<v1::RegisterWorkerRequest> requests(shard_count());
  for (auto& r : requests) {
    r.set_worker_id(worker_id);
    r.set_first_step(first_step);
  }
  std::vector<v1::RegisterWorkerResponse> responses;
  return channel_->RegisterWorker(requests, &responses);
}

absl::Status Client::UnregisterWorker(uint32_t worker_id) {
  std::vector<v1::UnregisterWorkerRequest> requests(shard_count());
  for (auto& r : requests) r.set_worker_id(worker_id);
  std::vector<v1::UnregisterWorkerResponse> responses;
  return channel_->UnregisterWorker(requests, &responses);
}

absl::StatusOr<std::vector<v1::GetShardInfoResponse>> Client::ShardInfos() {
  std::vector<v1::GetShardInfoResponse> infos;
  EMBER_RETURN_IF_ERROR(channel_->GetShardInfo(options_.rpc_timeout, false, &infos));
  return infos;
}

absl::StatusOr<ClusterCheckpoint> Client::Checkpoint(const CheckpointOptions& options) {
  constexpr int kTries = 3;
  for (int attempt = 0;; ++attempt) {
    int64_t step = -1;
    if (options.step.has_value()) {
      step = *options.step;
    } else {
      EMBER_ASSIGN_OR_RETURN(std::vector<v1::GetShardInfoResponse> infos, ShardInfos());
      for (const auto& info : infos) {
        for (const auto& w : info.workers()) step = std::max(step, w.applied_step());
      }
      if (attempt > 0) step += 2;  // workers moved on: cut a little ahead of them
    }
    ClusterCheckpoint out;
    out.step = step;
    out.id = options.id.empty()
                 ? absl::StrCat("cluster-", step, "-", absl::ToUnixMillis(absl::Now()))
                 : options.id;
    std::vector<v1::CheckpointRequest> requests(shard_count());
    for (auto& r : requests) {
      r.set_id(out.id);
      // No worker anywhere (-1): each shard cuts at what it has applied.
      if (step >= 0) r.set_step(step);
      r.set_incremental(options.incremental);
    }
    absl::Status s = channel_->Checkpoint(requests, options.timeout, &out.shards);
    const bool passed = absl::IsFailedPrecondition(s) &&
                        absl::StrContains(s.message(), "has already pushed step");
    if (s.ok() || !passed || options.step.has_value() || attempt + 1 == kTries) {
      if (!s.ok()) return s;
      return out;
    }
  }
}

absl::StatusOr<std::vector<float>> Client::LookupRows(const std::string& table,
                                                      absl::Span<const uint64_t> keys,
                                                      bool read_only) {
  const uint32_t n = shard_count();
  const std::vector<std::string> tables = {table};
  // The dim is the shards' answer; the plan reads it when it scatters.
  std::vector<uint32_t> dims = {0};
  const std::vector<std::vector<uint64_t>> table_keys = {{keys.begin(), keys.end()}};
  RequestPlan plan;
  plan.Route(*this, tables, dims, table_keys);
  std::vector<v1::LookupRequest> requests(n);
  for (uint32_t s = 0; s < n; ++s) {
    if (plan.HasKeys(s)) plan.FillLookup(s, read_only, &requests[s]);
  }
  std::vector<v1::LookupResponse> responses;
  EMBER_RETURN_IF_ERROR(Lookup(requests, &responses));
  std::vector<float> rows;
  uint64_t received = 0;
  for (uint32_t s = 0; s < n; ++s) {
    if (!plan.HasKeys(s)) continue;
    if (responses[s].tables_size() > 0 && dims[0] == 0) {
      dims[0] = responses[s].tables(0).dim();
      rows.resize(keys.size() * dims[0]);
    }
    EMBER_RETURN_IF_ERROR(plan.ScatterRows(s, responses[s], {rows.data()}, &received));
  }
  return rows;
}

ClientStats Client::Stats() const { return channel_->Stats(); }

}  // namespace ember
