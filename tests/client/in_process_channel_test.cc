// Shards in the trainer's process (ClientOptions::in_process, "inproc:N"):
// the same statuses as shard servers for the same bad requests, checkpoints
// that shard servers restore and the other way round (one format), and
// options refused with clear errors. The training suites run over both
// channels in pipeline_integration_test.cc and early_fetch_integration_test.cc.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ember/client.h"
#include "ember/trainer_metrics.h"
#include "gtest/gtest.h"
#include "tests/client/shard_way.h"
#include "tests/server/requests.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

constexpr uint32_t kDim = 4;

ClientOptions ServerOptionsFor(const Cluster& cluster) {
  ClientOptions o;
  for (const auto& s : cluster) o.shards.push_back(s->address());
  return o;
}

// The message after "shard i (...) <method>: ", the part the shard wrote.
std::string ShardsOwnWords(const absl::Status& s) {
  const std::string message(s.message());
  const size_t method = message.find(") ");
  const size_t colon = method == std::string::npos ? method : message.find(": ", method);
  return colon == std::string::npos ? message : message.substr(colon + 2);
}

// Pushes one gradient of `value` per key to its owner shard.
absl::Status PushTo(Client& client, const std::string& table, const std::vector<uint64_t>& keys,
                    float value) {
  std::vector<std::vector<uint64_t>> owned(client.shard_count());
  for (uint64_t key : keys) owned[client.ShardOf(key)].push_back(key);
  std::vector<v1::PushRequest> requests(client.shard_count());
  for (uint32_t s = 0; s < client.shard_count(); ++s) {
    AddGradients(&requests[s], table, owned[s], std::vector<float>(owned[s].size() * kDim, value));
  }
  std::vector<v1::PushResponse> responses;
  return client.Push(requests, &responses);
}

std::vector<uint64_t> SomeKeys() {
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 64; ++k) keys.push_back(k * 0x9E3779B97F4A7C15ull);
  return keys;
}

TEST(InProcessChannelTest, BadRequestsGetTheShardServersStatusesNamingTheInProcessShard) {
  absl::StatusOr<Cluster> cluster = StartCluster(3);
  ASSERT_OK(cluster);
  absl::StatusOr<std::unique_ptr<Client>> remote = Client::Connect(ServerOptionsFor(*cluster));
  ASSERT_OK(remote);
  absl::StatusOr<std::unique_ptr<Client>> local = Client::Connect(InProcessOptionsFor(3));
  ASSERT_OK(local);
  EXPECT_TRUE((*local)->in_process());
  EXPECT_FALSE((*remote)->in_process());
  for (Client* c : {remote->get(), local->get()})
    ASSERT_OK(c->CreateTable(AdagradTable("a", kDim)));

  // A key sent to a shard that does not own it; a table that does not exist;
  // gradients of the wrong width; a table defined differently.
  const uint64_t key = OwnedKeys(0, 3, 1)[0];
  std::vector<v1::LookupRequest> misrouted(3);
  AddLookup(&misrouted[2], "a", {key});
  std::vector<v1::LookupRequest> unknown(3);
  AddLookup(&unknown[0], "nope", {key});
  std::vector<v1::PushRequest> narrow(3);
  AddGradients(&narrow[0], "a", {key}, std::vector<float>(kDim - 1, 1.0f));
  v1::TableConfig redefined = AdagradTable("a", kDim + 1);

  struct Answers {
    absl::Status misrouted, unknown, narrow, redefined;
  };
  auto ask = [&](Client& c) {
    std::vector<v1::LookupResponse> lookups;
    std::vector<v1::PushResponse> pushes;
    Answers a;
    a.misrouted = c.Lookup(misrouted, &lookups);
    a.unknown = c.Lookup(unknown, &lookups);
    a.narrow = c.Push(narrow, &pushes);
    a.redefined = c.CreateTable(redefined);
    return a;
  };
  const Answers over_grpc = ask(**remote);
  const Answers in_process = ask(**local);
  const std::vector<std::pair<absl::Status, absl::Status>> pairs = {
      {over_grpc.misrouted, in_process.misrouted},
      {over_grpc.unknown, in_process.unknown},
      {over_grpc.narrow, in_process.narrow},
      {over_grpc.redefined, in_process.redefined}};
  for (const auto& [g, p] : pairs) {
    EXPECT_FALSE(p.ok());
    EXPECT_EQ(g.code(), p.code()) << g << " vs " << p;
    EXPECT_EQ(ShardsOwnWords(g), ShardsOwnWords(p)) << g << " vs " << p;
  }
  EXPECT_NE(in_process.misrouted.message().find("shard 2 (in-process) Lookup: table 'a'"),
            std::string::npos)
      << in_process.misrouted;
  EXPECT_NE(in_process.unknown.message().find("shard 0 (in-process) Lookup: "), std::string::npos)
      << in_process.unknown;
  // Nothing was changed by the refused push: the key's row is still its
  // initial value, on both.
  absl::StatusOr<std::vector<float>> g = (*remote)->LookupRows("a", {key});
  absl::StatusOr<std::vector<float>> p = (*local)->LookupRows("a", {key});
  ASSERT_OK(g);
  ASSERT_OK(p);
  EXPECT_EQ(*g, *p);
}

TEST(InProcessChannelTest, CheckpointsMoveBetweenInProcessShardsAndShardServersBitForBit) {
  const std::string root = TempPath("in_process_checkpoints");
  std::filesystem::remove_all(root);
  const std::vector<uint64_t> keys = SomeKeys();
  std::vector<float> trained_in_process;
  {
    ClientOptions o = InProcessOptionsFor(2);
    o.in_process.checkpoint_dir = root;
    absl::StatusOr<std::unique_ptr<Client>> local = Client::Connect(o);
    ASSERT_OK(local);
    ASSERT_OK((*local)->CreateTable(AdagradTable("t", kDim)));
    ASSERT_OK(PushTo(**local, "t", keys, 0.5f));
    absl::StatusOr<ClusterCheckpoint> ckpt = (*local)->Checkpoint({.id = "from-trainer"});
    ASSERT_OK(ckpt);
    ASSERT_EQ(ckpt->shards.size(), 2u);
    absl::StatusOr<std::vector<float>> rows = (*local)->LookupRows("t", keys);
    ASSERT_OK(rows);
    trained_in_process = *rows;
  }
  for (uint32_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::filesystem::exists(InProcessCheckpointDir(root, i) + "/from-trainer/MANIFEST"))
        << InProcessCheckpointDir(root, i);
  }
  // Shard servers restore it, train on, and checkpoint.
  std::vector<float> trained_on_servers;
  {
    absl::StatusOr<Cluster> cluster = StartCluster(2, {"--restore_from=latest"}, [&](int i) {
      return std::vector<std::string>{"--checkpoint_dir=" + InProcessCheckpointDir(root, i)};
    });
    ASSERT_OK(cluster);
    absl::StatusOr<std::unique_ptr<Client>> remote = Client::Connect(ServerOptionsFor(*cluster));
    ASSERT_OK(remote);
    absl::StatusOr<std::vector<float>> restored = (*remote)->LookupRows("t", keys);
    ASSERT_OK(restored);
    EXPECT_EQ(*restored, trained_in_process) << "the servers restored the trainer's checkpoint";
    ASSERT_OK(PushTo(**remote, "t", keys, -0.25f));
    ASSERT_OK((*remote)->Checkpoint({.id = "from-servers"}));
    absl::StatusOr<std::vector<float>> rows = (*remote)->LookupRows("t", keys);
    ASSERT_OK(rows);
    trained_on_servers = *rows;
    EXPECT_NE(trained_on_servers, trained_in_process);
  }
  // And in-process shards restore the servers' checkpoint, by id and as the latest.
  for (const std::string restore : {"from-servers", "latest"}) {
    ClientOptions o = InProcessOptionsFor(2);
    o.in_process.checkpoint_dir = root;
    o.in_process.restore_from = restore;
    absl::StatusOr<std::unique_ptr<Client>> local = Client::Connect(o);
    ASSERT_OK(local);
    absl::StatusOr<std::vector<float>> rows = (*local)->LookupRows("t", keys);
    ASSERT_OK(rows);
    EXPECT_EQ(*rows, trained_on_servers) << "restore_from=" << restore;
  }
}

TEST(InProcessChannelTest, TheShardsSeriesAreOnTheTrainersEndpointLabelledByShard) {
  TrainerMetrics metrics;
  {
    ClientOptions o = InProcessOptionsFor(2);
    o.metrics = &metrics;
    absl::StatusOr<std::unique_ptr<Client>> local = Client::Connect(o);
    ASSERT_OK(local);
    ASSERT_OK((*local)->CreateTable(AdagradTable("m", kDim)));
    const std::vector<uint64_t> keys = SomeKeys();
    ASSERT_OK(PushTo(**local, "m", keys, 0.5f));
    const std::string text = metrics.Expose();
    // Shard rows of each shard, summing to the keys pushed; one header.
    double rows = 0;
    for (int shard = 0; shard < 2; ++shard) {
      const std::string series =
          absl::StrCat("ember_table_rows{shard=\"", shard, "\",table=\"m\",device=\"cpu\"} ");
      const size_t at = text.find(series);
      ASSERT_NE(at, std::string::npos) << series << " in\n" << text;
      rows += std::stod(text.substr(at + series.size()));
      EXPECT_NE(text.find(absl::StrCat("ember_rpc_requests_total{shard=\"", shard,
                                       "\",rpc=\"Push\",code=\"OK\"} 1")),
                std::string::npos)
          << text;
    }
    EXPECT_EQ(rows, static_cast<double>(keys.size()));
    EXPECT_EQ(text.find("# TYPE ember_table_rows gauge"),
              text.rfind("# TYPE ember_table_rows gauge"));
    // The trainer's own series are there too.
    EXPECT_NE(text.find("ember_trainer_rpc_attempts_total{shard=\"0\",rpc=\"Push\",code=\"OK\"}"),
              std::string::npos)
        << text;
  }
  EXPECT_EQ(metrics.Expose().find("ember_table_rows{"), std::string::npos)
      << "a closed client's shards leave the endpoint";
}

// One store per device: shard i on entry i % n of in_process.device.
TEST(InProcessChannelTest, ShardsGoToTheListedDevicesInTurnAndAMissingGpuIsRefused) {
  ClientOptions o = InProcessOptionsFor(3);
  o.in_process.device = "cpu,cpu";
  absl::StatusOr<std::unique_ptr<Client>> local = Client::Connect(o);
  ASSERT_OK(local);
  absl::StatusOr<std::vector<v1::GetShardInfoResponse>> infos = (*local)->ShardInfos();
  ASSERT_OK(infos);
  for (const auto& info : *infos) EXPECT_EQ(info.device(), "cpu");
  // A GPU that is not there (none on a CPU machine; index 99 on any).
  ClientOptions gpu = InProcessOptionsFor(2);
  gpu.in_process.device = "cpu,cuda:99";
  absl::StatusOr<std::unique_ptr<Client>> missing = Client::Connect(gpu);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition) << missing.status();
  EXPECT_NE(missing.status().message().find("in-process shard 1: "), std::string::npos)
      << missing.status();
  EXPECT_NE(missing.status().message().find("cuda:99"), std::string::npos) << missing.status();
}

TEST(InProcessChannelTest, BadInProcessOptionsAreRefusedNamingTheField) {
  struct Case {
    ClientOptions options;
    std::string expected;
  };
  std::vector<Case> cases;
  cases.push_back({InProcessOptionsFor(0), "shards: expected 'inproc:N' with N >= 1"});
  ClientOptions word;
  word.shards = {"inproc:two"};
  cases.push_back({word, "shards: expected 'inproc:N' with N >= 1, received 'inproc:two'"});
  ClientOptions both = InProcessOptionsFor(2);
  both.in_process.shards = 3;
  cases.push_back({both, "in_process.shards: expected 2"});
  ClientOptions mixed;
  mixed.shards = {"127.0.0.1:1"};
  mixed.in_process.shards = 2;
  cases.push_back({mixed, "shards: expected no address with in_process.shards = 2, received 1"});
  ClientOptions device = InProcessOptionsFor(1);
  device.in_process.device = "tpu";
  cases.push_back({device, "in_process.device: "});
  ClientOptions listed = InProcessOptionsFor(2);
  listed.in_process.device = "cpu,cuda";
  cases.push_back({listed, "in_process.device: "});
  ClientOptions restore = InProcessOptionsFor(1);
  restore.in_process.restore_from = "latest";
  cases.push_back({restore, "in_process.checkpoint_dir: expected a directory"});
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(c.options);
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_NE(client.status().message().find(c.expected), std::string::npos) << client.status();
  }
  // A checkpoint that is not there is refused when the shards start.
  ClientOptions missing = InProcessOptionsFor(1);
  missing.in_process.checkpoint_dir = TempPath("in_process_none");
  missing.in_process.restore_from = "no-such-checkpoint";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(missing);
  EXPECT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("in-process shard 0: "), std::string::npos)
      << client.status();
}

}  // namespace
}  // namespace ember::testing
