// ember-soak: N trainer clients against 2 real shards for T seconds, with
// tables created while they train, shards restarted (SIGTERM, checkpoint on
// exit, --restore_from=latest) and clients disconnecting mid-stream; then
// checks what a production user relies on:
// - no error other than the transient ones a restart causes (UNAVAILABLE,
//   DEADLINE_EXCEEDED, CANCELLED), and every step is acknowledged in the end;
// - no acknowledged push is lost or applied twice: every row equals a model
//   kept on the side (SGD with learning rate 1 and integer gradients, so a
//   row is exactly minus the sum of its gradients, in any order);
// - each shard stayed within its row limit (--max_rows) and its peak
//   resident memory within --rss_limit_mb.
// Prints its figures and exits 0 only if every check holds.
//   ember-soak --clients=8 --seconds=600     # the documented soak
//   ember-soak --clients=8 --seconds=60      # the CTest version (Soak60s)
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/wire.h"
#include "ember/client.h"
#include "ember/v1/admin_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/server/server_process.h"

ABSL_FLAG(int, clients, 8, "Trainer clients, each its own worker and thread.");
ABSL_FLAG(int, seconds, 60, "How long the clients train.");
ABSL_FLAG(int, restart_every_s, 10, "A shard is restarted (SIGTERM, restore) this often.");
ABSL_FLAG(int, disconnect_every, 150, "A client drops its connections about every N steps.");
ABSL_FLAG(int, keys_per_table, 2000, "Key space of each table.");
ABSL_FLAG(int, max_tables, 10, "Tables created over the run (2 at the start).");
ABSL_FLAG(uint64_t, max_rows, 100000, "Each shard's --max_rows.");
ABSL_FLAG(int, rss_limit_mb, 1024, "Largest peak resident memory a shard may reach.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the clients' choices.");

namespace ember::soak {
namespace {

using testing::ServerProcess;

// The rows every acknowledged push should have made: table -> key -> minus
// the sum of its gradients, per element. Integer sums are exact in float up
// to 2^24 and do not depend on the order the shards applied them in.
class Model {
 public:
  void Add(const std::string& table, uint32_t dim, const std::vector<uint64_t>& keys,
           const std::vector<int>& grads) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& rows = tables_[table];
    for (size_t i = 0; i < keys.size(); ++i) {
      auto& row = rows[keys[i]];
      row.resize(dim, 0);
      for (uint32_t d = 0; d < dim; ++d) row[d] -= grads[i * dim + d];
    }
  }
  std::map<std::string, std::map<uint64_t, std::vector<int64_t>>> Snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tables_;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::map<uint64_t, std::vector<int64_t>>> tables_;
};

struct Table {
  std::string name;
  uint32_t dim;
};

// What went wrong, and what was expected to go wrong.
struct Counters {
  std::atomic<uint64_t> steps{0};
  std::atomic<uint64_t> keys_pushed{0};
  std::atomic<uint64_t> transient{0};
  std::atomic<uint64_t> duplicates{0};
  std::atomic<uint64_t> reconnects{0};
  std::atomic<uint64_t> restarts{0};
  std::mutex mu;
  std::vector<std::string> unexpected;
  void Unexpected(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (unexpected.size() < 20) unexpected.push_back(what);
    else if (unexpected.size() == 20) unexpected.push_back("(more not listed)");
  }
};

bool Transient(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kCancelled;
}

v1::TableConfig SgdTable(const Table& t, uint64_t capacity) {
  v1::TableConfig c;
  c.set_name(t.name);
  c.set_dim(t.dim);
  c.set_dtype(v1::DTYPE_FP32);
  c.mutable_initializer()->mutable_zeros();
  c.mutable_optimizer()->mutable_sgd()->set_learning_rate(1.0f);
  c.set_capacity(capacity);
  return c;
}

// The cluster: shard processes that a restarter replaces one at a time.
class Cluster {
 public:
  Cluster(std::string dir, uint64_t max_rows) : dir_(std::move(dir)), max_rows_(max_rows) {}

  absl::Status Start() {
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<std::unique_ptr<ServerProcess>> p = ServerProcess::Start(Args(i, 0));
      if (!p.ok()) return p.status();
      ports_.push_back((*p)->port());
      shards_.push_back(std::move(*p));
    }
    return absl::OkStatus();
  }
  std::vector<std::string> Addresses() const {
    std::vector<std::string> a;
    for (int port : ports_) a.push_back(absl::StrCat("127.0.0.1:", port));
    return a;
  }
  // SIGTERM (drain, checkpoint on exit), then the same shard on the same
  // port restored from its latest checkpoint.
  absl::Status Restart(int i) {
    peak_rss_kb_ = std::max(peak_rss_kb_, PeakRssKb(i));
    absl::StatusOr<int> status = shards_[i]->Stop(SIGTERM, absl::Seconds(60));
    if (!status.ok()) return status.status();
    if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
      return absl::InternalError(absl::StrCat("shard ", i, " exited with wait status ", *status));
    }
    absl::StatusOr<std::unique_ptr<ServerProcess>> p = ServerProcess::Start(Args(i, ports_[i]));
    if (!p.ok()) return p.status();
    shards_[i] = std::move(*p);
    return absl::OkStatus();
  }
  // The largest peak resident memory of any shard process so far.
  uint64_t PeakRssKb() {
    for (int i = 0; i < 2; ++i) peak_rss_kb_ = std::max(peak_rss_kb_, PeakRssKb(i));
    return peak_rss_kb_;
  }

 private:
  std::vector<std::string> Args(int i, int port) const {
    std::vector<std::string> args = {
        absl::StrCat("--shard_index=", i), "--shard_count=2", "--worker_threads=2",
        absl::StrCat("--max_rows=", max_rows_),
        absl::StrCat("--checkpoint_dir=", dir_, "/shard", i), "--restore_from=latest"};
    if (port != 0) args.push_back(absl::StrCat("--port=", port));
    return args;
  }
  uint64_t PeakRssKb(int i) const {
    std::ifstream in(absl::StrCat("/proc/", shards_[i]->pid(), "/status"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10);
    }
    return 0;
  }

  const std::string dir_;
  const uint64_t max_rows_;
  std::vector<std::unique_ptr<ServerProcess>> shards_;
  std::vector<int> ports_;
  uint64_t peak_rss_kb_ = 0;
};

class Soak {
 public:
  Soak(std::vector<std::string> shards, Model* model, Counters* counters)
      : shards_(std::move(shards)), model_(model), counters_(counters) {}

  ClientOptions Options(bool streams) const {
    ClientOptions o;
    o.shards = shards_;
    o.rpc_timeout = absl::Seconds(10);
    o.retry_budget = absl::Seconds(20);
    o.max_backoff = absl::Milliseconds(200);
    o.exchange_streams = streams;
    return o;
  }

  void AddTable(const Table& t) {
    std::lock_guard<std::mutex> lock(mu_);
    tables_.push_back(t);
  }
  std::vector<Table> Tables() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tables_;
  }

  // Creates `t` on every shard, retrying transient errors; publishes it to
  // the clients only once every shard has it.
  bool CreateTable(Client& admin, const Table& t, uint64_t capacity) {
    for (int attempt = 0; attempt < 30; ++attempt) {
      absl::Status s = admin.CreateTable(SgdTable(t, capacity));
      if (s.ok()) {
        AddTable(t);
        return true;
      }
      if (!Transient(s)) {
        counters_->Unexpected(absl::StrCat("CreateTable ", t.name, ": ", s.ToString()));
        return false;
      }
      counters_->transient++;
      absl::SleepFor(absl::Milliseconds(200));
    }
    counters_->Unexpected(absl::StrCat("CreateTable ", t.name, ": never acknowledged"));
    return false;
  }

  // One client: worker `worker`, steps 0, 1, ... until `deadline`. Each step
  // is one Exchange per shard (its push of this step's gradients, a writing
  // lookup of the same keys), repeated with the same step until acknowledged:
  // the shards apply a (worker, step) push at most once, so a retry after an
  // ambiguous failure cannot apply it twice.
  void RunClient(uint32_t worker, absl::Time deadline, uint64_t seed, int keys_per_table,
                 int disconnect_every) {
    std::mt19937_64 rng(seed);
    const bool streams = worker % 2 == 1;
    std::unique_ptr<Client> client;
    auto connect = [&]() -> bool {
      for (int attempt = 0; attempt < 30; ++attempt) {
        absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(streams));
        if (c.ok()) {
          client = std::move(*c);
          return true;
        }
        if (!Transient(c.status())) {
          counters_->Unexpected(absl::StrCat("worker ", worker, " Connect: ", c.status().ToString()));
          return false;
        }
        counters_->transient++;
        absl::SleepFor(absl::Milliseconds(200));
      }
      counters_->Unexpected(absl::StrCat("worker ", worker, ": could not connect for 6 s"));
      return false;
    };
    if (!connect()) return;
    for (int64_t step = 0; absl::Now() < deadline; ++step) {
      if (step > 0 && static_cast<int>(rng() % disconnect_every) == 0) {
        client.reset();  // its streams and channels close, maybe mid-exchange on the shard
        counters_->reconnects++;
        if (!connect()) return;
      }
      const std::vector<Table> tables = Tables();
      // 1-3 tables, each with up to 64 distinct keys and integer gradients.
      std::vector<const Table*> chosen;
      std::vector<std::vector<uint64_t>> keys;
      std::vector<std::vector<int>> grads;
      const size_t n_tables = 1 + rng() % std::min<size_t>(3, tables.size());
      std::vector<size_t> order(tables.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      for (size_t t = 0; t < n_tables; ++t) {
        const Table& table = tables[order[t]];
        std::vector<uint64_t> k;
        const size_t n = 1 + rng() % 64;
        for (size_t i = 0; i < n; ++i) k.push_back(rng() % keys_per_table);
        std::sort(k.begin(), k.end());
        k.erase(std::unique(k.begin(), k.end()), k.end());
        std::vector<int> g(k.size() * table.dim);
        for (int& v : g) v = static_cast<int>(rng() % 9) - 4;
        chosen.push_back(&table);
        keys.push_back(std::move(k));
        grads.push_back(std::move(g));
      }
      std::vector<v1::ExchangeRequest> requests(client->shard_count());
      for (auto& r : requests) {
        r.mutable_push()->set_worker_id(worker);
        r.mutable_push()->set_step(step);
      }
      for (size_t t = 0; t < chosen.size(); ++t) {
        const uint32_t dim = chosen[t]->dim;
        std::vector<std::vector<uint64_t>> shard_keys(requests.size());
        std::vector<std::vector<float>> shard_grads(requests.size());
        for (size_t i = 0; i < keys[t].size(); ++i) {
          const uint32_t s = client->ShardOf(keys[t][i]);
          shard_keys[s].push_back(keys[t][i]);
          for (uint32_t d = 0; d < dim; ++d) shard_grads[s].push_back(grads[t][i * dim + d]);
        }
        for (size_t s = 0; s < requests.size(); ++s) {
          if (shard_keys[s].empty()) continue;
          auto* push = requests[s].mutable_push()->add_tables();
          push->set_table(chosen[t]->name);
          push->set_keys(PackKeys(shard_keys[s]));
          push->set_gradients(std::string(reinterpret_cast<const char*>(shard_grads[s].data()),
                                          shard_grads[s].size() * 4));
          auto* lookup = requests[s].mutable_lookup()->add_tables();
          lookup->set_table(chosen[t]->name);
          lookup->set_keys(push->keys());
        }
      }
      bool acknowledged = false;
      for (int attempt = 0; attempt < 30 && !acknowledged; ++attempt) {
        std::vector<v1::ExchangeResponse> responses;
        absl::Status s = client->Exchange(requests, &responses);
        if (s.ok()) {
          acknowledged = true;
          for (const auto& r : responses) counters_->duplicates += r.push().duplicate() ? 1 : 0;
          if (!CheckRows(requests, responses)) {
            counters_->Unexpected(absl::StrCat("worker ", worker, " step ", step,
                                               ": lookup answer of the wrong shape"));
          }
        } else if (Transient(s)) {
          counters_->transient++;
          absl::SleepFor(absl::Milliseconds(100));
        } else {
          counters_->Unexpected(absl::StrCat("worker ", worker, " step ", step, ": ", s.ToString()));
          return;
        }
      }
      if (!acknowledged) {
        counters_->Unexpected(absl::StrCat("worker ", worker, " step ", step, ": never acknowledged"));
        return;
      }
      for (size_t t = 0; t < chosen.size(); ++t) {
        model_->Add(chosen[t]->name, chosen[t]->dim, keys[t], grads[t]);
        counters_->keys_pushed += keys[t].size();
      }
      counters_->steps++;
    }
  }

 private:
  static bool CheckRows(const std::vector<v1::ExchangeRequest>& requests,
                        const std::vector<v1::ExchangeResponse>& responses) {
    for (size_t s = 0; s < requests.size(); ++s) {
      const auto& asked = requests[s].lookup();
      if (asked.tables_size() == 0) continue;
      const auto& got = responses[s].lookup();
      if (got.tables_size() != asked.tables_size()) return false;
      for (int t = 0; t < asked.tables_size(); ++t) {
        if (got.tables(t).rows().size() != asked.tables(t).keys().size() / 8 * got.tables(t).dim() * 4) {
          return false;
        }
      }
    }
    return true;
  }

  const std::vector<std::string> shards_;
  Model* model_;
  Counters* counters_;
  mutable std::mutex mu_;
  std::vector<Table> tables_;
};

int Run() {
  const int clients = absl::GetFlag(FLAGS_clients);
  const int seconds = absl::GetFlag(FLAGS_seconds);
  const int keys_per_table = absl::GetFlag(FLAGS_keys_per_table);
  const int max_tables = absl::GetFlag(FLAGS_max_tables);
  const uint64_t max_rows = absl::GetFlag(FLAGS_max_rows);
  if (clients < 1 || seconds < 1 || keys_per_table < 1 || max_tables < 2 ||
      absl::GetFlag(FLAGS_disconnect_every) < 1 || absl::GetFlag(FLAGS_restart_every_s) < 1) {
    fprintf(stderr, "ember-soak: --clients, --seconds, --keys_per_table, --disconnect_every and "
                    "--restart_every_s must be positive, --max_tables at least 2\n");
    return 2;
  }
  char tmpl[] = "/tmp/ember-soak-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  Cluster cluster(dir, max_rows);
  if (absl::Status s = cluster.Start(); !s.ok()) {
    fprintf(stderr, "ember-soak: starting the shards: %s\n", s.ToString().c_str());
    return 1;
  }
  Model model;
  Counters counters;
  Soak soak(cluster.Addresses(), &model, &counters);
  absl::StatusOr<std::unique_ptr<Client>> admin = Client::Connect(soak.Options(false));
  if (!admin.ok()) {
    fprintf(stderr, "ember-soak: connecting: %s\n", admin.status().ToString().c_str());
    return 1;
  }
  const uint64_t capacity = static_cast<uint64_t>(keys_per_table);
  const uint32_t dims[] = {4, 8, 16};
  int created = 0;
  for (; created < 2; ++created) {
    if (!soak.CreateTable(**admin, {absl::StrCat("soak", created), dims[created % 3]}, capacity)) {
      return 1;
    }
  }
  for (int w = 0; w < clients; ++w) {
    if (absl::Status s = (*admin)->RegisterWorker(w, 0); !s.ok()) {
      fprintf(stderr, "ember-soak: registering worker %d: %s\n", w, s.ToString().c_str());
      return 1;
    }
  }

  const absl::Time start = absl::Now();
  const absl::Time deadline = start + absl::Seconds(seconds);
  std::vector<std::thread> threads;
  for (int w = 0; w < clients; ++w) {
    threads.emplace_back([&, w] {
      soak.RunClient(w, deadline, absl::GetFlag(FLAGS_seed) * 1000 + w, keys_per_table,
                     absl::GetFlag(FLAGS_disconnect_every));
    });
  }
  // Tables come while the clients train, evenly over the first half.
  const absl::Duration table_every =
      absl::Seconds(seconds) / 2 / std::max(1, max_tables - created);
  absl::Time next_table = start + table_every;
  const absl::Duration restart_every = absl::Seconds(absl::GetFlag(FLAGS_restart_every_s));
  absl::Time next_restart = start + restart_every;
  while (absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    if (created < max_tables && absl::Now() >= next_table) {
      soak.CreateTable(**admin, {absl::StrCat("soak", created), dims[created % 3]}, capacity);
      ++created;
      next_table += table_every;
    }
    if (absl::Now() >= next_restart && absl::Now() + absl::Seconds(2) < deadline) {
      const int shard = static_cast<int>(counters.restarts % 2);
      if (absl::Status s = cluster.Restart(shard); !s.ok()) {
        counters.Unexpected(absl::StrCat("restarting shard ", shard, ": ", s.ToString()));
        break;
      }
      counters.restarts++;
      next_restart = absl::Now() + restart_every;
    }
  }
  for (auto& t : threads) t.join();
  const double trained_s = absl::ToDoubleSeconds(absl::Now() - start);

  // Every acknowledged push, and nothing else, is in the rows.
  uint64_t rows_checked = 0, lost = 0;
  std::string first_lost;
  for (const auto& [table, rows] : model.Snapshot()) {
    std::vector<uint64_t> keys;
    for (const auto& [key, unused] : rows) keys.push_back(key);
    absl::StatusOr<std::vector<float>> got = (*admin)->LookupRows(table, keys, /*read_only=*/true);
    if (!got.ok()) {
      counters.Unexpected(absl::StrCat("final lookup of ", table, ": ", got.status().ToString()));
      continue;
    }
    size_t i = 0;
    for (const auto& [key, want] : rows) {
      for (size_t d = 0; d < want.size(); ++d) {
        if ((*got)[i * want.size() + d] != static_cast<float>(want[d])) {
          if (lost == 0) {
            first_lost = absl::StrCat(table, " key ", key, " element ", d, ": expected ", want[d],
                                      ", stored ", (*got)[i * want.size() + d]);
          }
          ++lost;
          break;
        }
      }
      ++i;
      ++rows_checked;
    }
  }
  // Within the limits: rows per shard, and memory.
  uint64_t most_rows = 0;
  for (const std::string& address : cluster.Addresses()) {
    auto stub = v1::AdminService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListTablesRequest request;
    v1::ListTablesResponse list;
    grpc::Status s = stub->ListTables(&context, request, &list);
    if (!s.ok()) {
      counters.Unexpected(absl::StrCat("final ListTables on ", address, ": ", s.error_message()));
      continue;
    }
    uint64_t rows = 0;
    for (const auto& t : list.tables()) rows += t.rows();
    most_rows = std::max(most_rows, rows);
  }
  const uint64_t peak_rss_mb = cluster.PeakRssKb() / 1024;
  const bool within = most_rows <= max_rows && peak_rss_mb <= static_cast<uint64_t>(absl::GetFlag(FLAGS_rss_limit_mb));

  printf("ember-soak: %d clients x %.0f s, 2 shards\n", clients, trained_s);
  printf("  steps acknowledged     %llu (%.0f/s)\n", (unsigned long long)counters.steps.load(),
         counters.steps.load() / trained_s);
  printf("  keys pushed            %llu\n", (unsigned long long)counters.keys_pushed.load());
  printf("  tables                 %d\n", created);
  printf("  shard restarts         %llu (SIGTERM, restored from the checkpoint on exit)\n",
         (unsigned long long)counters.restarts.load());
  printf("  client reconnects      %llu\n", (unsigned long long)counters.reconnects.load());
  printf("  transient errors       %llu (retried; expected around restarts)\n",
         (unsigned long long)counters.transient.load());
  printf("  duplicate pushes       %llu (retries of pushes already applied, not applied again)\n",
         (unsigned long long)counters.duplicates.load());
  printf("  rows checked           %llu\n", (unsigned long long)rows_checked);
  printf("  lost or extra updates  %llu%s%s\n", (unsigned long long)lost,
         lost ? ": first " : "", first_lost.c_str());
  printf("  unexpected errors      %zu\n", counters.unexpected.size());
  for (const std::string& e : counters.unexpected) printf("    %s\n", e.c_str());
  printf("  most rows on a shard   %llu (limit %llu)\n", (unsigned long long)most_rows,
         (unsigned long long)max_rows);
  printf("  peak shard RSS         %llu MiB (limit %d)\n", (unsigned long long)peak_rss_mb,
         absl::GetFlag(FLAGS_rss_limit_mb));
  admin->reset();
  std::filesystem::remove_all(dir);
  const bool restarted = counters.restarts > 0 || seconds < 2 * absl::GetFlag(FLAGS_restart_every_s);
  const bool ok = counters.unexpected.empty() && lost == 0 && within && counters.steps > 0 &&
                  restarted;
  printf("ember-soak: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace ember::soak

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ember::soak::Run();
}
