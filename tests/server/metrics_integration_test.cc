// The Prometheus endpoints against the real tools: a live shard's /metrics
// counts its traffic per table, RPC and status code; a trainer's pipeline
// reports its exposed wait, overlap, staleness, unique-key ratio and bytes;
// both pass `promtool check metrics`, and so does a trainer whose shards
// are in its own process; a real Prometheus (Debian's
// `prometheus`) scrapes two live shards and a trainer, and its HTTP API
// returns their series; every metric the dashboard and the alert rules name
// is exported.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/key_router.h"
#include "common/status_macros.h"
#include "ember/client.h"
#include "ember/step_pipeline.h"
#include "ember/trainer_metrics.h"
#include "ember/v1/admin_service.grpc.pb.h"
#include "ember/v1/embedding_service.grpc.pb.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/server/http_get.h"
#include "tests/server/requests.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

extern char** environ;

namespace ember::testing {
namespace {

// The value of the sample line `series` (name{labels}) in `text`, or -1.
double Sample(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

std::unique_ptr<v1::EmbeddingService::Stub> Stub(const ServerProcess& p) {
  return v1::EmbeddingService::NewStub(
      grpc::CreateChannel(p.address(), grpc::InsecureChannelCredentials()));
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

class MetricsIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string config = TempPath("metrics_tables.textproto");
    std::ofstream(config) << R"pb(
      tables {
        name: "clicks"
        dim: 4
        initializer { zeros {} seed: 1 }
        optimizer { sgd { learning_rate: 0.1 } }
        capacity: 1000
        eviction: EVICTION_POLICY_LRU
      }
    )pb";
    for (uint32_t i = 0; i < 2; ++i) {
      auto p = ServerProcess::Start({absl::StrCat("--shard_index=", i), "--shard_count=2",
                                     "--metrics_port=0", "--table_config_file=" + config});
      ASSERT_OK(p);
      ASSERT_GT((*p)->metrics_port(), 0);
      shards_.push_back(std::move(*p));
    }
  }
  std::vector<std::unique_ptr<ServerProcess>> shards_;
};

// A trainer process's parts: its metrics, a client of the shards and one
// pipeline, both reporting to the metrics.
struct Trainer {
  TrainerMetrics metrics;
  std::unique_ptr<Client> client;
  std::unique_ptr<StepPipeline> pipe;
};

// Two features on "clicks": ids {5, 6} and {5, 5, 7}: 5 ids, 3 unique.
Batch ClicksBatch() {
  Batch b;
  b.features.push_back({{0, 1, 2}, {5, 6}, {}});
  b.features.push_back({{0, 2, 3}, {5, 5, 7}, {}});
  return b;
}

// Connects `t` to `shards` and creates its pipeline: worker `worker` with
// SSP staleness `staleness`, features "user" and "item" on "clicks".
absl::Status StartTrainer(const std::vector<std::unique_ptr<ServerProcess>>& shards,
                          uint32_t worker, int staleness, Trainer* t,
                          absl::Duration retry_budget = absl::Seconds(10)) {
  ClientOptions c;
  for (const auto& sh : shards) c.shards.push_back(sh->address());
  c.metrics = &t->metrics;
  c.retry_budget = retry_budget;
  c.max_backoff = absl::Milliseconds(50);
  EMBER_ASSIGN_OR_RETURN(t->client, Client::Connect(c));
  PipelineOptions o;
  o.worker_id = worker;
  o.features = {{"user", "clicks", Combiner::kSum}, {"item", "clicks", Combiner::kSum}};
  o.staleness = staleness;
  o.metrics = &t->metrics;
  EMBER_ASSIGN_OR_RETURN(t->pipe, StepPipeline::Create(t->client.get(), o));
  return absl::OkStatus();
}

// Runs promtool with `args` on `input`; expects it to accept. Returns its output.
std::string ExpectPromtoolAccepts(std::vector<std::string> args, const std::string& input = "") {
  args.insert(args.begin(), "promtool");
  std::string out;
  const int rc = RunCommand(args, input, &out);
  EXPECT_NE(rc, 127 << 8) << "promtool not found: deploy/install-deps.sh installs prometheus";
  EXPECT_EQ(rc, 0) << out;
  return out;
}

// Runs `steps` steps of ClicksBatch. Ahead: all prefetched before the first
// Wait, and all waited before the first Push (needs steps <= staleness + 1).
absl::Status TrainClicks(StepPipeline& pipe, int steps, bool ahead = false) {
  const std::vector<float> grad(2 * 4, 0.5f);  // batch 2 x dim 4
  if (ahead) {
    for (int t = 0; t < steps; ++t) EMBER_RETURN_IF_ERROR(pipe.Prefetch(t, ClicksBatch()));
    for (int t = 0; t < steps; ++t) EMBER_RETURN_IF_ERROR(pipe.Wait(t).status());
    for (int t = 0; t < steps; ++t) EMBER_RETURN_IF_ERROR(pipe.Push(t, {grad, grad}));
    return pipe.Flush();
  }
  for (int t = 0; t < steps; ++t) {
    EMBER_RETURN_IF_ERROR(pipe.Prefetch(t, ClicksBatch()));
    EMBER_RETURN_IF_ERROR(pipe.Wait(t).status());
    EMBER_RETURN_IF_ERROR(pipe.Push(t, {grad, grad}));
  }
  return pipe.Flush();
}

TEST_F(MetricsIntegrationTest, LiveShardCountsTrafficPerTableRpcAndCodeAndPassesPromtool) {
  auto stub = Stub(*shards_[0]);
  const std::vector<uint64_t> keys = OwnedKeys(0, 2, 64);
  v1::LookupRequest lookup;
  v1::LookupResponse looked_up;
  AddLookup(&lookup, "clicks", keys);
  ASSERT_TRUE(stub->Lookup(Context().get(), lookup, &looked_up).ok());
  ASSERT_TRUE(stub->Lookup(Context().get(), lookup, &looked_up).ok());
  v1::PushRequest push;
  v1::PushResponse pushed;
  AddGradients(&push, "clicks", keys, std::vector<float>(keys.size() * 4, 0.5f));
  ASSERT_TRUE(stub->Push(Context().get(), push, &pushed).ok());
  // A key of the other shard: refused, counted as an error of this table.
  v1::LookupRequest wrong;
  AddLookup(&wrong, "clicks", OwnedKeys(1, 2, 1));
  ASSERT_FALSE(stub->Lookup(Context().get(), wrong, &looked_up).ok());

  auto text = HttpGet(shards_[0]->metrics_port(), "/metrics");
  ASSERT_OK(text);
  const std::string& m = *text;
  EXPECT_EQ(Sample(m, "ember_rpc_requests_total{rpc=\"Lookup\",code=\"OK\"}"), 2) << m;
  EXPECT_EQ(Sample(m, "ember_rpc_requests_total{rpc=\"Lookup\",code=\"INVALID_ARGUMENT\"}"), 1);
  EXPECT_EQ(Sample(m, "ember_rpc_requests_total{rpc=\"Push\",code=\"OK\"}"), 1);
  EXPECT_EQ(Sample(m, "ember_table_keys_total{table=\"clicks\",rpc=\"Lookup\"}"), 128);
  EXPECT_EQ(Sample(m, "ember_table_keys_total{table=\"clicks\",rpc=\"Push\"}"), 64);
  EXPECT_EQ(Sample(m, "ember_table_bytes_total{table=\"clicks\",rpc=\"Lookup\"}"), 2 * 64 * 16);
  EXPECT_EQ(Sample(m, "ember_table_bytes_total{table=\"clicks\",rpc=\"Push\"}"), 64 * 16);
  EXPECT_EQ(Sample(m, "ember_table_missing_keys_total{table=\"clicks\"}"), 64);
  EXPECT_EQ(Sample(m, "ember_table_errors_total{table=\"clicks\",rpc=\"Lookup\",code=\"INVALID_ARGUMENT\"}"),
            1);
  EXPECT_EQ(Sample(m, "ember_table_rows{table=\"clicks\",device=\"cpu\"}"), 64);
  EXPECT_EQ(Sample(m, "ember_table_capacity_rows{table=\"clicks\",device=\"cpu\"}"), 1000);
  EXPECT_GT(Sample(m, "ember_table_memory_bytes{table=\"clicks\",device=\"cpu\"}"), 0);
  EXPECT_EQ(Sample(m, "ember_rpc_duration_seconds_count{rpc=\"Lookup\"}"), 3);
  EXPECT_GT(Sample(m, "process_resident_memory_bytes"), 1e6);
  EXPECT_EQ(Sample(m, "ember_build_info{version=\"0.1.0\",device=\"cpu\",shard=\"0/2\"}"), 1);
  ExpectPromtoolAccepts({"check", "metrics"}, m);
}

TEST_F(MetricsIntegrationTest, TrainerExportsWaitOverlapStalenessUniqueRatioAndBytesPerWorker) {
  // Staleness 2: steps 0, 1 and 2 are fetched before any push, so the rows
  // of step 2 lack this worker's own steps 0 and 1.
  Trainer t;
  const absl::Status started = StartTrainer(shards_, 5, 2, &t);
  ASSERT_OK(started);
  const absl::Status trained = TrainClicks(*t.pipe, 3, /*ahead=*/true);
  ASSERT_OK(trained);
  auto http = t.metrics.Serve("127.0.0.1", 0);
  ASSERT_OK(http);
  auto text = HttpGet((*http)->port(), "/metrics");
  ASSERT_OK(text);
  const std::string& m = *text;
  const std::string w = "{worker=\"5\"}";
  EXPECT_EQ(Sample(m, "ember_trainer_steps_total" + w), 3) << m;
  EXPECT_EQ(Sample(m, "ember_trainer_pushes_total" + w), 3);
  EXPECT_EQ(Sample(m, "ember_trainer_keys_total" + w), 15);
  EXPECT_EQ(Sample(m, "ember_trainer_unique_keys_total" + w), 9);
  EXPECT_DOUBLE_EQ(Sample(m, "ember_trainer_unique_key_ratio" + w), 0.6);
  EXPECT_EQ(Sample(m, "ember_trainer_staleness_steps" + w), 2);
  EXPECT_EQ(Sample(m, "ember_trainer_staleness_bound_steps" + w), 2);
  // Per step: fetch 3 keys (24 B) and 3 rows (48 B), push 3 keys and 3
  // gradients (72 B).
  EXPECT_EQ(Sample(m, "ember_trainer_bytes_total{worker=\"5\",direction=\"sent\"}"), 3 * (24 + 72));
  EXPECT_EQ(Sample(m, "ember_trainer_bytes_total{worker=\"5\",direction=\"received\"}"), 3 * 48);
  EXPECT_EQ(Sample(m, "ember_trainer_bytes_total{worker=\"5\",direction=\"node_shuffle\"}"), 0);
  EXPECT_EQ(Sample(m, "ember_trainer_step_bytes" + w), 24 + 48 + 72);
  EXPECT_EQ(Sample(m, "ember_trainer_exposed_wait_seconds_count" + w), 3);
  EXPECT_EQ(Sample(m, "ember_trainer_fetch_seconds_count" + w), 3);
  const double overlap = Sample(m, "ember_trainer_prefetch_overlap_ratio" + w);
  EXPECT_GE(overlap, 0.0);
  EXPECT_LE(overlap, 1.0);
  EXPECT_EQ(Sample(m, "ember_trainer_pipeline_failed" + w), 0);
  // RPC attempts per shard: Connect's GetShardInfo and RegisterWorker on
  // each; Exchange: 3 pushes to every shard, 3 fetches to the shards owning
  // keys 5, 6 or 7.
  std::set<uint32_t> owners;
  for (uint64_t k : {5, 6, 7}) owners.insert(DefaultShardOf(k, 2));
  double exchanges = 0;
  for (int sh = 0; sh < 2; ++sh) {
    const std::string shard = absl::StrCat("shard=\"", sh, "\"");
    EXPECT_EQ(Sample(m, "ember_trainer_rpc_attempts_total{" + shard +
                            ",rpc=\"GetShardInfo\",code=\"OK\"}"), 1) << m;
    EXPECT_EQ(Sample(m, "ember_trainer_rpc_duration_seconds_count{" + shard +
                            ",rpc=\"RegisterWorker\"}"), 1);
    exchanges += Sample(m, "ember_trainer_rpc_attempts_total{" + shard +
                               ",rpc=\"Exchange\",code=\"OK\"}");
  }
  EXPECT_EQ(exchanges, 3 * 2 + 3 * static_cast<double>(owners.size()));
  EXPECT_GT(Sample(m, "process_resident_memory_bytes"), 1e6);
  ExpectPromtoolAccepts({"check", "metrics"}, m);
  ASSERT_OK(t.pipe->Close());
}

// Shards in the trainer's process: their series (rows, calls, SSP) and the
// trainer's come from the trainer's one endpoint, each shard's labelled
// shard="i", and the whole passes promtool.
TEST(InProcessMetricsTest, TrainerWithInProcessShardsServesBothOnOnePortAndPassesPromtool) {
  Trainer t;
  ClientOptions c;
  c.shards = {"inproc:2"};
  c.metrics = &t.metrics;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(c);
  ASSERT_OK(client);
  t.client = std::move(*client);
  v1::TableConfig clicks;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(name: "clicks"
           dim: 4
           initializer {
             zeros {}
             seed: 1
           }
           optimizer { sgd { learning_rate: 0.1 } })pb",
      &clicks));
  ASSERT_OK(t.client->CreateTable(clicks));
  PipelineOptions o;
  o.worker_id = 3;
  o.features = {{"user", "clicks", Combiner::kSum}, {"item", "clicks", Combiner::kSum}};
  o.metrics = &t.metrics;
  absl::StatusOr<std::unique_ptr<StepPipeline>> pipe = StepPipeline::Create(t.client.get(), o);
  ASSERT_OK(pipe);
  ASSERT_OK(TrainClicks(**pipe, 4));
  auto http = t.metrics.Serve("127.0.0.1", 0);
  ASSERT_OK(http);
  auto text = HttpGet((*http)->port(), "/metrics");
  ASSERT_OK(text);
  const std::string& m = *text;
  EXPECT_EQ(Sample(m, "ember_trainer_steps_total{worker=\"3\"}"), 4) << m;
  double rows = 0, exchanges = 0;
  for (int sh = 0; sh < 2; ++sh) {
    const std::string shard = absl::StrCat("shard=\"", sh, "\"");
    rows += Sample(m, "ember_table_rows{" + shard + ",table=\"clicks\",device=\"cpu\"}");
    exchanges += Sample(m, "ember_rpc_requests_total{" + shard + ",rpc=\"Exchange\",code=\"OK\"}");
    EXPECT_EQ(Sample(m, "ember_ssp_registered_workers{" + shard + "}"), 1) << m;
    EXPECT_EQ(Sample(m, "ember_routing_epoch{" + shard + "}"), 1) << m;
  }
  EXPECT_EQ(rows, 3) << "keys 5, 6 and 7";
  EXPECT_GT(exchanges, 0);
  ExpectPromtoolAccepts({"check", "metrics"}, m);
  ASSERT_OK((*pipe)->Close());
}

TEST_F(MetricsIntegrationTest, TrainerMarksAFailedPipelineAndCountsTheShardsErrors) {
  Trainer t;
  const absl::Status started = StartTrainer(shards_, 2, -1, &t, absl::Milliseconds(300));
  ASSERT_OK(started);
  const absl::Status trained = TrainClicks(*t.pipe, 1);
  ASSERT_OK(trained);
  for (auto& sh : shards_) ASSERT_OK(sh->Stop(SIGKILL, absl::Seconds(10)));
  ASSERT_OK(t.pipe->Prefetch(1, ClicksBatch()));
  EXPECT_EQ(t.pipe->Wait(1).status().code(), absl::StatusCode::kUnavailable);
  const std::string m = t.metrics.Expose();
  EXPECT_EQ(Sample(m, "ember_trainer_pipeline_failed{worker=\"2\"}"), 1) << m;
  EXPECT_EQ(Sample(m, "ember_trainer_steps_total{worker=\"2\"}"), 1);
  double unavailable = 0;
  for (int sh = 0; sh < 2; ++sh) {
    const double n = Sample(m, absl::StrCat("ember_trainer_rpc_attempts_total{shard=\"", sh,
                                            "\",rpc=\"Exchange\",code=\"UNAVAILABLE\"}"));
    if (n > 0) unavailable += n;
  }
  EXPECT_GE(unavailable, 2) << "retries are attempts too\n" << m;
  shards_.clear();  // already stopped
}

// Starts Debian's Prometheus scraping, every second, the shards (job
// "ember") and trainers (job "ember-trainer") at the given metrics ports.
class PrometheusProcess {
 public:
  static absl::StatusOr<std::unique_ptr<PrometheusProcess>> Start(
      const std::vector<int>& shard_ports, const std::vector<int>& trainer_ports) {
    auto p = std::unique_ptr<PrometheusProcess>(new PrometheusProcess());
    const std::string dir = ::testing::TempDir() + "/prometheus_" + std::to_string(getpid());
    auto targets = [](const std::vector<int>& ports) {
      std::string t;
      for (int port : ports) absl::StrAppend(&t, t.empty() ? "" : ", ", "'127.0.0.1:", port, "'");
      return t;
    };
    std::ofstream(dir + ".yml") << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                                << "scrape_configs:\n  - job_name: ember\n    static_configs:\n"
                                << "      - targets: [" << targets(shard_ports) << "]\n"
                                << "  - job_name: ember-trainer\n    static_configs:\n"
                                << "      - targets: [" << targets(trainer_ports) << "]\n";
    // A free port for Prometheus's own web API: bind 0, read, release.
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    p->port_ = ntohs(addr.sin_port);
    close(fd);
    std::vector<std::string> args = {"prometheus",
                                     "--config.file=" + dir + ".yml",
                                     "--storage.tsdb.path=" + dir,
                                     absl::StrCat("--web.listen-address=127.0.0.1:", p->port_),
                                     "--log.level=warn"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawnp(&p->pid_, "prometheus", nullptr, nullptr, argv.data(), environ) != 0) {
      return absl::NotFoundError("prometheus not found: deploy/install-deps.sh installs it");
    }
    return p;
  }
  ~PrometheusProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      for (int i = 0; i < 100 && waitpid(pid_, &status, WNOHANG) == 0; ++i) usleep(100000);
      if (waitpid(pid_, &status, WNOHANG) == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
      }
    }
  }
  int port() const { return port_; }

 private:
  PrometheusProcess() = default;
  pid_t pid_ = -1;
  int port_ = 0;
};

TEST_F(MetricsIntegrationTest, RealPrometheusScrapesBothShardsAndATrainer) {
  Trainer t;
  const absl::Status started = StartTrainer(shards_, 7, 0, &t);
  ASSERT_OK(started);
  const absl::Status trained = TrainClicks(*t.pipe, 2);
  ASSERT_OK(trained);
  auto trainer = t.metrics.Serve("127.0.0.1", 0);
  ASSERT_OK(trainer);
  auto prom = PrometheusProcess::Start({shards_[0]->metrics_port(), shards_[1]->metrics_port()},
                                       {(*trainer)->port()});
  ASSERT_OK(prom);
  // Every target up and their series in the TSDB, polled for up to 60 s.
  // The queries: count(up{job="ember"}==1), count(ember_build_info),
  // count(up{job="ember-trainer"}==1), ember_trainer_steps_total.
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"count(up%7Bjob%3D%22ember%22%7D%3D%3D1)", "\"2\"]"},
      {"count(ember_build_info)", "\"2\"]"},
      {"count(up%7Bjob%3D%22ember-trainer%22%7D%3D%3D1)", "\"1\"]"},
      {"ember_trainer_steps_total", "\"2\"]"}};
  std::string last;
  bool up = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline && !up) {
    absl::SleepFor(absl::Milliseconds(500));
    up = true;
    for (const auto& [query, value] : expected) {
      auto r = HttpGet((*prom)->port(), "/api/v1/query?query=" + query);
      last = r.ok() ? *r : r.status().ToString();
      if (!r.ok() || r->find(value) == std::string::npos) {
        up = false;
        break;
      }
    }
  }
  EXPECT_TRUE(up) << "Prometheus did not report both shards and the trainer within 60 s; last "
                     "answer: " << last;
  auto rows = HttpGet((*prom)->port(), "/api/v1/query?query=ember_table_capacity_rows");
  ASSERT_OK(rows);
  EXPECT_NE(rows->find("\"table\":\"clicks\""), std::string::npos) << *rows;
  auto wait = HttpGet((*prom)->port(), "/api/v1/query?query=ember_trainer_exposed_wait_seconds_count");
  ASSERT_OK(wait);
  EXPECT_NE(wait->find("\"worker\":\"7\""), std::string::npos) << *wait;
  ASSERT_OK(t.pipe->Close());
}

// The metric names an expression file uses: ember_* and process_* words,
// with a histogram's _bucket/_sum/_count suffix taken off.
std::set<std::string> MetricNames(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  std::set<std::string> names;
  const std::regex word("\\b(ember|process)_[a-z_]+\\b");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), word); it != std::sregex_iterator();
       ++it) {
    std::string name = it->str();
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sfx(suffix);
      if (name.size() > sfx.size() && name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0) {
        name.resize(name.size() - sfx.size());
      }
    }
    names.insert(name);
  }
  return names;
}

TEST_F(MetricsIntegrationTest, EveryMetricInTheDashboardAndAlertRulesExistsInALiveShardOrTrainer) {
  auto shard = HttpGet(shards_[0]->metrics_port(), "/metrics");
  ASSERT_OK(shard);
  Trainer t;
  const absl::Status started = StartTrainer(shards_, 1, 0, &t);
  ASSERT_OK(started);
  const absl::Status trained = TrainClicks(*t.pipe, 1);
  ASSERT_OK(trained);
  ASSERT_OK(t.pipe->Close());
  // Shard metrics must come from the shard, trainer metrics from the trainer.
  const std::string trainer = t.metrics.Expose();
  const std::string rules = std::string(EMBER_SOURCE_DIR) + "/deploy/prometheus/ember-alerts.yml";
  const std::string dashboard =
      std::string(EMBER_SOURCE_DIR) + "/deploy/grafana/ember-dashboard.json";
  for (const std::string& file : {rules, dashboard}) {
    const std::set<std::string> names = MetricNames(file);
    EXPECT_GE(names.size(), 5u) << file;
    for (const std::string& name : names) {
      const bool of_trainer = name.rfind("ember_trainer_", 0) == 0;
      EXPECT_NE((of_trainer ? trainer : *shard).find("# TYPE " + name + " "), std::string::npos)
          << file << " uses " << name << ", which a live " << (of_trainer ? "trainer" : "shard")
          << " does not export";
    }
  }
  ExpectPromtoolAccepts({"check", "rules", rules});
}

// deploy/prometheus/ember-alerts.test.yml: every alert fires on series that
// break its rule (after its `for`) and stays quiet on healthy ones.
TEST(AlertRulesTest, EveryAlertFiresOnBrokenSeriesAndStaysQuietOnHealthyOnes) {
  const std::string out = ExpectPromtoolAccepts(
      {"test", "rules", std::string(EMBER_SOURCE_DIR) + "/deploy/prometheus/ember-alerts.test.yml"});
  EXPECT_NE(out.find("SUCCESS"), std::string::npos) << out;
}

}  // namespace
}  // namespace ember::testing
