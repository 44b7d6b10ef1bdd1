// The shard's Prometheus endpoint against the real tools: a live shard's
// /metrics counts its traffic per table, RPC and status code and passes
// `promtool check metrics`; a real Prometheus (Debian's `prometheus`)
// scrapes two live shards and its HTTP API returns their series.
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
#include "ember/v1/admin_service.grpc.pb.h"
#include "ember/v1/embedding_service.grpc.pb.h"
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

// Runs `args` through the shell, stdin fed from `input`; returns the wait
// status and puts stdout and stderr in `output`.
int RunCommand(const std::vector<std::string>& args, const std::string& input, std::string* output) {
  const std::string in_path = ::testing::TempDir() + "/run_input.txt";
  const std::string out_path = ::testing::TempDir() + "/run_output.txt";
  std::ofstream(in_path) << input;
  std::string cmd;
  for (const auto& a : args) absl::StrAppend(&cmd, "'", a, "' ");
  absl::StrAppend(&cmd, "< '", in_path, "' > '", out_path, "' 2>&1");
  const int rc = std::system(cmd.c_str());
  std::ifstream out(out_path);
  output->assign(std::istreambuf_iterator<char>(out), {});
  return rc;
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
    const std::string config = ::testing::TempDir() + "/metrics_tables.textproto";
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

  std::string lint;
  const int rc = RunCommand({"promtool", "check", "metrics"}, m, &lint);
  ASSERT_NE(rc, 127 << 8) << "promtool not found: deploy/install-deps.sh installs prometheus";
  EXPECT_EQ(rc, 0) << lint;
}

// Starts Debian's Prometheus scraping both shards every second.
class PrometheusProcess {
 public:
  static absl::StatusOr<std::unique_ptr<PrometheusProcess>> Start(
      const std::vector<int>& metrics_ports) {
    auto p = std::unique_ptr<PrometheusProcess>(new PrometheusProcess());
    const std::string dir = ::testing::TempDir() + "/prometheus_" + std::to_string(getpid());
    std::string targets;
    for (int port : metrics_ports) absl::StrAppend(&targets, targets.empty() ? "" : ", ", "'127.0.0.1:", port, "'");
    std::ofstream(dir + ".yml") << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                                << "scrape_configs:\n  - job_name: ember\n    static_configs:\n"
                                << "      - targets: [" << targets << "]\n";
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

TEST_F(MetricsIntegrationTest, RealPrometheusScrapesBothShards) {
  auto prom = PrometheusProcess::Start({shards_[0]->metrics_port(), shards_[1]->metrics_port()});
  ASSERT_OK(prom);
  // Both targets up and their build info in the TSDB, polled for up to 60 s.
  std::string last;
  bool up = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline && !up) {
    absl::SleepFor(absl::Milliseconds(500));
    auto r = HttpGet((*prom)->port(), "/api/v1/query?query=count(up%7Bjob%3D%22ember%22%7D%3D%3D1)");
    auto b = HttpGet((*prom)->port(), "/api/v1/query?query=count(ember_build_info)");
    if (!r.ok() || !b.ok()) {
      last = r.ok() ? b.status().ToString() : r.status().ToString();
      continue;
    }
    last = *r + " / " + *b;
    up = r->find("\"2\"]") != std::string::npos && b->find("\"2\"]") != std::string::npos;
  }
  EXPECT_TRUE(up) << "Prometheus did not report both shards up within 60 s; last answer: " << last;
  auto rows = HttpGet((*prom)->port(), "/api/v1/query?query=ember_table_capacity_rows");
  ASSERT_OK(rows);
  EXPECT_NE(rows->find("\"table\":\"clicks\""), std::string::npos) << *rows;
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

TEST_F(MetricsIntegrationTest, EveryMetricInTheDashboardAndAlertRulesExistsInALiveShard) {
  auto text = HttpGet(shards_[0]->metrics_port(), "/metrics");
  ASSERT_OK(text);
  const std::string rules = std::string(EMBER_SOURCE_DIR) + "/deploy/prometheus/ember-alerts.yml";
  const std::string dashboard =
      std::string(EMBER_SOURCE_DIR) + "/deploy/grafana/ember-dashboard.json";
  for (const std::string& file : {rules, dashboard}) {
    const std::set<std::string> names = MetricNames(file);
    EXPECT_GE(names.size(), 5u) << file;
    for (const std::string& name : names) {
      EXPECT_NE(text->find("# TYPE " + name + " "), std::string::npos)
          << file << " uses " << name << ", which a live shard does not export";
    }
  }
  std::string lint;
  EXPECT_EQ(RunCommand({"promtool", "check", "rules", rules}, "", &lint), 0) << lint;
}

}  // namespace
}  // namespace ember::testing
