#include "client/in_process_channel.h"

#include <atomic>
#include <latch>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/internal/exchange_answer_fill.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "ember/trainer_metrics.h"
#include "shard/shard_edge.h"
#include "shard/shard_host.h"
#include "shard/work_pool.h"

namespace ember {
namespace {

class InProcessChannel final : public ShardChannel {
 public:
  // `registries[i]` (empty without metrics) holds shard i's series; they
  // are exposed with the trainer's, labelled shard="i", while the channel lives.
  InProcessChannel(const ClientOptions& options,
                   std::vector<std::unique_ptr<metrics::Registry>> registries,
                   std::vector<std::unique_ptr<ShardHost>> hosts)
      : options_(options), registries_(std::move(registries)), hosts_(std::move(hosts)) {
    // In-process calls carry no token and no peer: the edges check the
    // routing, order the halves and count the calls as a server would.
    for (const auto& host : hosts_) {
      edges_.push_back(std::make_unique<ShardEdge>(&host->shard(), host->metrics()));
    }
    if (options.in_process.threads > 0) {
      pool_ = std::make_unique<WorkPool>(static_cast<int>(options.in_process.threads));
    }
    for (size_t i = 0; i < registries_.size(); ++i) {
      options_.metrics->registry().Attach(registries_[i].get(), "shard", absl::StrCat(i));
    }
  }
  ~InProcessChannel() override {
    for (const auto& r : registries_) options_.metrics->registry().Detach(r.get());
    if (pool_) pool_->Stop();
  }

  uint32_t shard_count() const override { return static_cast<uint32_t>(hosts_.size()); }
  std::string ShardName(uint32_t shard) const override {
    return absl::StrCat("shard ", shard, " (in-process)");
  }
  bool in_process() const override { return true; }

  absl::Status GetShardInfo(absl::Duration, bool,
                            std::vector<v1::GetShardInfoResponse>* responses) override {
    return OnShards("GetShardInfo", All(), responses,
                    [](const ShardEdge& edge, uint32_t, auto* response) {
                      edge.shard().GetShardInfo(response);
                      // The process's CPU is the trainer's: it would be counted twice.
                      response->clear_process_cpu_seconds();
                      return absl::OkStatus();
                    });
  }
  absl::Status CreateTable(absl::Span<const v1::CreateTableRequest> requests,
                           std::vector<v1::CreateTableResponse>* responses) override {
    return OnShards("CreateTable", All(), responses,
                    [&](const ShardEdge& edge, uint32_t i, auto* response) {
                      return edge.shard().CreateTable(requests[i].config(), response);
                    });
  }
  absl::Status ListTables(const std::vector<bool>& active,
                          std::vector<v1::ListTablesResponse>* responses) override {
    return OnShards("ListTables", active, responses,
                    [](const ShardEdge& edge, uint32_t, auto* response) {
                      edge.shard().ListTables(response);
                      return absl::OkStatus();
                    });
  }
  absl::Status Lookup(absl::Span<const v1::LookupRequest> requests, const std::vector<bool>& active,
                      std::vector<v1::LookupResponse>* responses) override {
    return ThroughEdges("Lookup", active, requests, responses, &ShardEdge::Lookup);
  }
  absl::Status Push(absl::Span<const v1::PushRequest> requests,
                    std::vector<v1::PushResponse>* responses) override {
    return ThroughEdges("Push", All(), requests, responses, &ShardEdge::Push);
  }
  absl::Status Exchange(const ExchangeCall& call, std::vector<ExchangeAnswer>* answers,
                        std::vector<ShardCall>* calls) override;
  // Exchange with the shards at once, on the pool and the calling thread.
  absl::Status ExchangeOnPool(const ExchangeCall& call, std::vector<ExchangeAnswer>* answers,
                              std::vector<ShardCall>* calls);
  absl::Status RegisterWorker(absl::Span<const v1::RegisterWorkerRequest> requests,
                              std::vector<v1::RegisterWorkerResponse>* responses) override {
    return ThroughEdges("RegisterWorker", All(), requests, responses, &ShardEdge::RegisterWorker);
  }
  absl::Status UnregisterWorker(absl::Span<const v1::UnregisterWorkerRequest> requests,
                                std::vector<v1::UnregisterWorkerResponse>* responses) override {
    return ThroughEdges("UnregisterWorker", All(), requests, responses,
                        &ShardEdge::UnregisterWorker);
  }
  absl::Status Checkpoint(absl::Span<const v1::CheckpointRequest> requests, absl::Duration timeout,
                          std::vector<v1::CheckpointResponse>* responses) override;
  ClientStats Stats() const override { return ClientStats{calls_.load(), 0, failures_.load()}; }

 private:
  std::vector<bool> All() const { return std::vector<bool>(shard_count(), true); }
  // An in-process call: no token, no peer, no routing epoch (the trainer's
  // own shards never move), the channel's timeout.
  EdgeCall Call(absl::string_view rpc) const {
    EdgeCall call;
    call.rpc = rpc;
    call.deadline = absl::Now() + options_.rpc_timeout;
    return call;
  }

  // Shard i's failure of `method`, as the gRPC channel words it.
  absl::Status Failed(uint32_t shard, absl::string_view method, const absl::Status& status) {
    ++failures_;
    return absl::Status(status.code(),
                        absl::StrCat(ShardName(shard), " ", method, ": ", status.message()));
  }

  // Runs `call(edge, i, &(*responses)[i])` for every shard i with
  // active[i], in order, each recorded in the trainer metrics (if any);
  // the first failure ends the call.
  template <typename Response, typename Call>
  absl::Status OnShards(absl::string_view method, const std::vector<bool>& active,
                        std::vector<Response>* responses, Call call) {
    responses->resize(shard_count());
    for (uint32_t i = 0; i < shard_count(); ++i) {
      if (!active[i]) continue;
      (*responses)[i].Clear();
      ++calls_;
      const absl::Time start = absl::Now();
      const absl::Status status = call(*edges_[i], i, &(*responses)[i]);
      Record(i, method, status.code(), start, absl::Now());
      if (!status.ok()) return Failed(i, method, status);
    }
    return absl::OkStatus();
  }

  // OnShards of `method` of each shard's edge on requests[i].
  template <typename Request, typename Response, typename Method>
  absl::Status ThroughEdges(absl::string_view rpc, const std::vector<bool>& active,
                            absl::Span<const Request> requests, std::vector<Response>* responses,
                            Method method) {
    const EdgeCall call = Call(rpc);
    return OnShards(rpc, active, responses, [&](const ShardEdge& edge, uint32_t i, Response* r) {
      return (edge.*method)(call, requests[i], r);
    });
  }

  // The call in the trainer's series (the shard's edge counts it in the
  // shard's).
  void Record(uint32_t shard, absl::string_view method, absl::StatusCode code, absl::Time start,
              absl::Time end) {
    if (options_.metrics == nullptr) return;
    options_.metrics->RecordRpc(shard, method, code, absl::ToDoubleSeconds(end - start));
  }

  const ClientOptions options_;
  std::vector<std::unique_ptr<metrics::Registry>> registries_;  // outlive the hosts' metrics
  std::vector<std::unique_ptr<ShardHost>> hosts_;
  std::vector<std::unique_ptr<ShardEdge>> edges_;  // edges_[i]: of hosts_[i]
  std::unique_ptr<WorkPool> pool_;                 // null: calls run on the calling thread
  std::atomic<uint64_t> calls_{0}, failures_{0};
};

absl::Status InProcessChannel::Exchange(const ExchangeCall& call,
                                        std::vector<ExchangeAnswer>* answers,
                                        std::vector<ShardCall>* calls) {
  if (pool_) return ExchangeOnPool(call, answers, calls);
  const uint32_t n = shard_count();
  answers->resize(n);
  std::vector<absl::Status> statuses(n);
  std::vector<absl::Time> starts(n);
  const std::vector<bool> active = call.Active();
  const EdgeCall edge_call = Call("Exchange");
  std::vector<std::optional<ShardEdge::Exchange>> exchanges(n);
  // Every push first (see shard/shard_edge.h).
  for (uint32_t i = 0; i < n; ++i) {
    if (!active[i]) continue;
    (*answers)[i].Clear();
    ++calls_;
    starts[i] = absl::Now();
    exchanges[i].emplace(*edges_[i], edge_call);
    statuses[i] = exchanges[i]->Push(
        *call.requests[i], internal::ExchangeAnswerFill::MutableMessage((*answers)[i]), 0);
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (!active[i]) continue;
    if (statuses[i].ok()) {
      statuses[i] = exchanges[i]->Answer(
          *call.requests[i], internal::ExchangeAnswerFill::MutableMessage((*answers)[i]),
          edge_call.deadline);
    }
    const absl::Time end = absl::Now();
    Record(i, "Exchange", statuses[i].code(), starts[i], end);
    if (calls != nullptr) calls->push_back({i, 0, starts[i], end, statuses[i].code()});
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (active[i] && !statuses[i].ok()) return Failed(i, "Exchange", statuses[i]);
  }
  return absl::OkStatus();
}

absl::Status InProcessChannel::ExchangeOnPool(const ExchangeCall& call,
                                              std::vector<ExchangeAnswer>* answers,
                                              std::vector<ShardCall>* calls) {
  const uint32_t n = shard_count();
  answers->resize(n);
  std::vector<absl::Status> statuses(n);
  std::vector<absl::Time> starts(n), ends(n);
  std::vector<uint32_t> active;
  const std::vector<bool> sent = call.Active();
  for (uint32_t i = 0; i < n; ++i) {
    if (sent[i]) active.push_back(i);
  }
  const EdgeCall edge_call = Call("Exchange");
  // Each shard's push, then its lookup, on its own thread: a lookup that
  // waits keeps no other shard's push back.
  auto run = [&](uint32_t i) {
    ++calls_;
    starts[i] = absl::Now();
    (*answers)[i].Clear();
    v1::ExchangeResponse* response = internal::ExchangeAnswerFill::MutableMessage((*answers)[i]);
    ShardEdge::Exchange exchange(*edges_[i], edge_call);
    statuses[i] = exchange.Push(*call.requests[i], response, 0);
    if (statuses[i].ok()) {
      statuses[i] = exchange.Answer(*call.requests[i], response, edge_call.deadline);
    }
    ends[i] = absl::Now();
  };
  if (!active.empty()) {
    // A std::latch, not absl::BlockingCounter: Debian's Abseil is not built
    // with TSan, which would not see the hand-over of the pool's results.
    // Shared with the closures: the last count_down may still be inside the
    // latch when wait() returns here.
    auto pending = std::make_shared<std::latch>(static_cast<std::ptrdiff_t>(active.size()) - 1);
    for (size_t j = 1; j < active.size(); ++j) {
      pool_->Post([&run, pending, i = active[j]] {
        run(i);
        pending->count_down();
      });
    }
    run(active[0]);
    pending->wait();
  }
  for (uint32_t i : active) {
    Record(i, "Exchange", statuses[i].code(), starts[i], ends[i]);
    if (calls != nullptr) calls->push_back({i, 0, starts[i], ends[i], statuses[i].code()});
  }
  for (uint32_t i : active) {
    if (!statuses[i].ok()) return Failed(i, "Exchange", statuses[i]);
  }
  return absl::OkStatus();
}

absl::Status InProcessChannel::Checkpoint(absl::Span<const v1::CheckpointRequest> requests,
                                          absl::Duration timeout,
                                          std::vector<v1::CheckpointResponse>* responses) {
  // All at once: each shard holds later pushes until its own cut, and a
  // worker held on one shard must not keep another shard from its cut.
  const uint32_t n = shard_count();
  responses->assign(n, {});
  std::vector<absl::Status> statuses(n);
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < n; ++i) {
    ++calls_;
    threads.emplace_back([&, i] {
      statuses[i] = hosts_[i]->checkpointer().Checkpoint(requests[i], deadline, &(*responses)[i]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (uint32_t i = 0; i < n; ++i) {
    if (!statuses[i].ok()) return Failed(i, "Checkpoint", statuses[i]);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckInProcessDevice(const std::string& device) {
  return ParseShardDevices(device, "in_process.device").status();
}

absl::StatusOr<std::unique_ptr<ShardChannel>> NewInProcessChannel(const ClientOptions& options) {
  const InProcessOptions& in = options.in_process;
  EMBER_ASSIGN_OR_RETURN(const std::vector<StoreDevice> devices,
                         ParseShardDevices(in.device, "in_process.device"));
  // With trainer metrics, each shard's own series (rows, memory, calls,
  // checkpoints, SSP) go to the trainer's endpoint too.
  std::vector<std::unique_ptr<metrics::Registry>> registries;
  std::vector<std::unique_ptr<ShardHost>> hosts;
  for (uint32_t i = 0; i < in.shards; ++i) {
    if (options.metrics != nullptr) registries.push_back(std::make_unique<metrics::Registry>());
    ShardHostOptions host;
    host.shard.shard_index = i;
    host.shard.shard_count = in.shards;
    host.shard.max_rows = in.max_rows;
    host.shard.device = devices[i % devices.size()];
    if (!in.checkpoint_dir.empty()) {
      host.checkpoint.directory = InProcessCheckpointDir(in.checkpoint_dir, i);
      host.checkpoint.interval = in.checkpoint_interval;
    }
    if (in.restore_from == "latest") {
      host.restore_from = "latest";
    } else if (!in.restore_from.empty()) {
      host.restore_from = absl::StrCat(host.checkpoint.directory, "/", in.restore_from);
    }
    absl::StatusOr<std::unique_ptr<ShardHost>> started =
        ShardHost::Start(host, registries.empty() ? nullptr : registries.back().get());
    if (!started.ok()) {
      return absl::Status(started.status().code(),
                          absl::StrCat("in-process shard ", i, ": ", started.status().message()));
    }
    hosts.push_back(std::move(*started));
  }
  return std::make_unique<InProcessChannel>(options, std::move(registries), std::move(hosts));
}

}  // namespace ember
