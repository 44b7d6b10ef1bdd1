// Checkpoints with real ember-server processes: a cluster trained, then
// checkpointed, SIGKILLed and restored trains on exactly like one that never
// stopped; and a shard killed while it writes a checkpoint always restores a
// complete one.
#include <sys/wait.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/file_system.h"
#include "common/key_hash.h"
#include "common/key_router.h"
#include "common/status_macros.h"
#include "ember/client.h"
#include "ember/step_pipeline.h"
#include "ember/v1/admin_service.grpc.pb.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/serving_table.h"
#include "tests/server/cluster_training.h"
#include "tests/server/requests.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

TEST(CheckpointIntegrationTest, KilledAndRestoredClusterTrainsOnBitForBitLikeAnUninterruptedOne) {
  constexpr int64_t kHalf = 200;
  const std::string config = "--table_config_file=" + TableConfigFile();
  const std::vector<std::string> dirs = {FreshDir("roundtrip_shard0"), FreshDir("roundtrip_shard1")};

  // The uninterrupted reference: 2 x kHalf steps.
  absl::StatusOr<Cluster> reference = StartWithCheckpointDirs(2, {}, {config});
  ASSERT_OK(reference);
  auto ref_client = Connect(*reference);
  ASSERT_OK(ref_client);
  std::vector<std::unique_ptr<StepPipeline>> ref_pipes;
  ASSERT_OK(TrainBoth(ref_client->get(), 0, 2 * kHalf, &ref_pipes));
  for (auto& p : ref_pipes) ASSERT_OK(p->Close());
  const std::map<std::string, std::vector<float>> expected = AllRows(ref_client->get());

  // kHalf steps, a cluster checkpoint while both workers are registered,
  // SIGKILL, restore, kHalf more steps.
  absl::StatusOr<Cluster> cluster = StartWithCheckpointDirs(2, dirs, {config});
  ASSERT_OK(cluster);
  std::map<std::string, std::vector<float>> at_checkpoint;
  std::vector<std::string> checkpoint_paths;
  {
    auto client = Connect(*cluster, absl::Milliseconds(500));
    ASSERT_OK(client);
    std::vector<std::unique_ptr<StepPipeline>> pipes;
    ASSERT_OK(TrainBoth(client->get(), 0, kHalf, &pipes));
    absl::StatusOr<ClusterCheckpoint> taken = (*client)->Checkpoint();
    ASSERT_OK(taken);
    at_checkpoint = AllRows(client->get());
    for (const auto& r : taken->shards) checkpoint_paths.push_back(r.path());
    EXPECT_EQ(taken->step, kHalf - 1);
    for (const v1::CheckpointResponse& r : taken->shards) {
      EXPECT_EQ(r.manifest().step(), kHalf - 1);
      EXPECT_EQ(r.manifest().workers_size(), 2);
      EXPECT_EQ(r.manifest().tables_size(), static_cast<int>(kTables.size()));
    }
    for (auto& shard : *cluster) ASSERT_OK(shard->Stop(SIGKILL, absl::Seconds(10)));
    pipes.clear();  // their shards are gone: closing fails after the short retry budget
  }
  absl::StatusOr<Cluster> restored =
      StartWithCheckpointDirs(2, dirs, {config, "--restore_from=latest"});
  ASSERT_OK(restored);
  auto client = Connect(*restored);
  ASSERT_OK(client);
  auto infos = (*client)->ShardInfos();
  ASSERT_OK(infos);
  for (const auto& info : *infos) {
    EXPECT_NE(info.restored_from(), "") << "shard " << info.shard_index();
    ASSERT_EQ(info.workers_size(), 2) << "the clock was not restored";
    EXPECT_EQ(info.workers(0).applied_step(), kHalf - 1);
    EXPECT_EQ(info.workers(1).applied_step(), kHalf - 1);
  }
  std::vector<std::unique_ptr<StepPipeline>> pipes;
  ASSERT_OK(TrainBoth(client->get(), kHalf, 2 * kHalf, &pipes));
  for (auto& p : pipes) ASSERT_OK(p->Close());
  const std::map<std::string, std::vector<float>> actual = AllRows(client->get());
  for (const auto& t : kTables) {
    EXPECT_EQ(actual.at(t.name()), expected.at(t.name())) << "table " << t.name();
  }

  // The same cluster checkpoint exported for serving, in fp32 and fp16:
  // every row as the cluster answered at the checkpoint (fp16 rounded).
  for (const std::string dtype : {"fp32", "fp16"}) {
    const std::string out = FreshDir("export_" + dtype);
    std::string log;
    const int rc = RunCommand({EMBER_EXPORT_BIN, "--checkpoints=" + checkpoint_paths[0] + "," +
                                   checkpoint_paths[1], "--out=" + out, "--dtype=" + dtype},
                              "", &log);
    ASSERT_EQ(rc, 0) << log;
    EXPECT_NE(log.find(absl::StrCat("exported ", kTables.size(), " tables of step ", kHalf - 1,
                                    " from 2 shards")),
              std::string::npos)
        << log;
    for (size_t f = 0; f < kTables.size(); ++f) {
      const std::string& name = kTables[f].name();
      auto table = ServingTable::Load(JoinPath(out, name + ".emb"));
      ASSERT_OK(table);
      std::vector<uint64_t> keys;
      for (uint32_t w : {0u, 1u}) {
        for (uint64_t id = 0; id < kIdsPerFeature; ++id) keys.push_back(KeyOf(w, f, id));
      }
      std::vector<float> rows(keys.size() * kDim);
      ASSERT_OK((*table)->Lookup(keys, absl::MakeSpan(rows)));
      std::vector<float> want = at_checkpoint.at(name);
      if (dtype == "fp16") {
        for (float& v : want) v = RoundTo(DType::kFp16, v);
      }
      EXPECT_EQ(rows, want) << name << " exported as " << dtype;
    }
  }
}

TEST(CheckpointIntegrationTest,
     ClusterCheckpointOfTwoShardsReshardedToThreeServesAndTrainsOnAsTwo) {
  constexpr int64_t kSteps = 60;
  const std::string config = "--table_config_file=" + TableConfigFile();
  const std::vector<std::string> dirs = {FreshDir("reshard_shard0"), FreshDir("reshard_shard1")};
  const std::string out = FreshDir("reshard_out");
  absl::StatusOr<Cluster> two = StartWithCheckpointDirs(2, dirs, {config});
  ASSERT_OK(two);
  auto client = Connect(*two);
  ASSERT_OK(client);
  std::vector<std::unique_ptr<StepPipeline>> pipes;
  ASSERT_OK(TrainBoth(client->get(), 0, kSteps, &pipes));
  absl::StatusOr<ClusterCheckpoint> taken = (*client)->Checkpoint();
  ASSERT_OK(taken);
  const std::map<std::string, std::vector<float>> at_checkpoint = AllRows(client->get());
  // The two shards train on: the reference for the resharded cluster.
  for (auto& p : pipes) ASSERT_OK(p->Close());
  ASSERT_OK(TrainBoth(client->get(), kSteps, 2 * kSteps, &pipes));
  for (auto& p : pipes) ASSERT_OK(p->Close());
  const std::map<std::string, std::vector<float>> expected = AllRows(client->get());
  std::vector<std::string> parts;
  for (const auto& r : taken->shards) parts.push_back(r.path());

  std::string log;
  ASSERT_EQ(
      RunCommand({EMBER_CHECKPOINT_BIN, "reshard", "--to=3", "--out=" + out, parts[1], parts[0]},
                 "", &log),
      0)
      << log;
  EXPECT_NE(log.find("resharded 2 parts"), std::string::npos) << log;
  // Refusals exit 1 saying why, and write nothing.
  EXPECT_EQ(WEXITSTATUS(RunCommand(
                {EMBER_CHECKPOINT_BIN, "reshard", "--to=3", "--out=" + out + "-one", parts[0]}, "",
                &log)),
            1);
  EXPECT_NE(log.find("no part of shard 1 among the 1 given"), std::string::npos) << log;
  EXPECT_FALSE(FileSystem::Posix()->IsDirectory(out + "-one"));
  EXPECT_EQ(WEXITSTATUS(RunCommand(
                {EMBER_CHECKPOINT_BIN, "reshard", "--to=3", "--out=" + out, parts[0], parts[1]}, "",
                &log)),
            1);
  EXPECT_NE(log.find("exists; choose another id or out_dir"), std::string::npos) << log;
  // Three shards on the tool's parts, as a new cluster starts them.
  absl::StatusOr<Cluster> three =
      testing::StartCluster(3, {config, "--restore_from=latest"}, [&](int i) {
        return std::vector<std::string>{"--checkpoint_dir=" +
                                        JoinPath(out, absl::StrCat("shard-", i))};
      });
  ASSERT_OK(three);
  auto client3 = Connect(*three);
  ASSERT_OK(client3);
  auto infos = (*client3)->ShardInfos();
  ASSERT_OK(infos);
  for (const auto& info : *infos) {
    EXPECT_EQ(info.routing(), kDefaultRouting);
    ASSERT_EQ(info.workers_size(), 2) << "the clock was not restored";
    EXPECT_EQ(info.workers(0).applied_step(), kSteps - 1);
  }
  EXPECT_EQ(AllRows(client3->get()), at_checkpoint);
  std::vector<std::unique_ptr<StepPipeline>> pipes3;
  ASSERT_OK(TrainBoth(client3->get(), kSteps, 2 * kSteps, &pipes3));
  for (auto& p : pipes3) ASSERT_OK(p->Close());
  EXPECT_EQ(AllRows(client3->get()), expected);

  // Three shards restoring the two parts themselves (no tool).
  absl::StatusOr<Cluster> direct =
      testing::StartCluster(3, {config, "--restore_from=" + parts[0] + "," + parts[1]});
  ASSERT_OK(direct);
  auto client_direct = Connect(*direct);
  ASSERT_OK(client_direct);
  EXPECT_EQ(AllRows(client_direct->get()), at_checkpoint);
}

TEST(CheckpointIntegrationTest,
     ClientRoutingByTheEpochBeforeAReshardIsRefusedUntilItConnectsAgain) {
  const std::string config = "--table_config_file=" + TableConfigFile();
  const std::vector<std::string> dirs = {FreshDir("epoch_shard0"), FreshDir("epoch_shard1")};
  const std::string out = FreshDir("epoch_out");
  absl::StatusOr<Cluster> cluster = StartWithCheckpointDirs(2, dirs, {config});
  ASSERT_OK(cluster);
  auto client = Connect(*cluster, /*retry_budget=*/absl::Seconds(5));
  ASSERT_OK(client);
  EXPECT_EQ((*client)->routing_epoch(), 1u);
  auto pipe = NewPipeline(client->get(), 0, 0);
  ASSERT_OK(pipe);
  ASSERT_OK(TrainOn(**pipe, 0, 0, 20));
  absl::StatusOr<ClusterCheckpoint> taken = (*client)->Checkpoint();
  ASSERT_OK(taken);
  const std::map<std::string, std::vector<float>> at_checkpoint = AllRows(client->get());
  std::vector<std::string> parts;
  for (const auto& r : taken->shards) parts.push_back(r.path());
  // Resharded to the same count (and routing): the new parts are the next
  // epoch all the same.
  std::string log;
  ASSERT_EQ(
      RunCommand({EMBER_CHECKPOINT_BIN, "reshard", "--to=2", "--out=" + out, parts[0], parts[1]},
                 "", &log),
      0)
      << log;
  // The cluster restarted on the same addresses from the new parts, while
  // the old client and its pipeline still run.
  std::vector<int> ports;
  std::vector<std::unique_ptr<ServerProcess>> restarted;
  for (int i = 0; i < 2; ++i) {
    ports.push_back((*cluster)[i]->port());
    ASSERT_OK((*cluster)[i]->Stop(SIGKILL, absl::Seconds(10)));
  }
  for (int i = 0; i < 2; ++i) {
    auto shard = ServerProcess::Start(
        {absl::StrCat("--shard_index=", i), "--shard_count=2", "--worker_threads=2", config,
         absl::StrCat("--port=", ports[i]),
         "--checkpoint_dir=" + JoinPath(out, absl::StrCat("shard-", i)), "--restore_from=latest"});
    ASSERT_OK(shard);
    restarted.push_back(*std::move(shard));
  }
  // Every call of the old client is refused, saying why, and changes nothing.
  const std::string table = kTables[0].name();
  absl::StatusOr<std::vector<float>> rows = (*client)->LookupRows(table, {KeyOf(0, 0, 1)});
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kAborted) << rows.status();
  EXPECT_NE(rows.status().message().find("routed by routing epoch 1, but shard"), std::string::npos)
      << rows.status();
  EXPECT_NE(rows.status().message().find("is at routing epoch 2"), std::string::npos)
      << rows.status();
  absl::Status trained = TrainOn(**pipe, 0, 20, 25);
  EXPECT_EQ(trained.code(), absl::StatusCode::kAborted) << trained;
  std::fprintf(stderr, "the old trainer was told: %s\n", trained.ToString().c_str());
  pipe->reset();
  client->reset();
  // Connected again: the new epoch, the rows of the checkpoint.
  Cluster again;
  for (auto& s : restarted) again.push_back(std::move(s));
  auto fresh = Connect(again);
  ASSERT_OK(fresh);
  EXPECT_EQ((*fresh)->routing_epoch(), 2u);
  EXPECT_EQ(AllRows(fresh->get()), at_checkpoint);
  auto infos = (*fresh)->ShardInfos();
  ASSERT_OK(infos);
  for (const auto& info : *infos) EXPECT_EQ(info.routing_epoch(), 2u);

  // A shard started empty beside them is at epoch 1: a client refuses the
  // mixed cluster at Connect.
  ASSERT_OK(again[1]->Stop(SIGKILL, absl::Seconds(10)));
  auto empty = ServerProcess::Start({"--shard_index=1", "--shard_count=2", "--worker_threads=2",
                                     config, absl::StrCat("--port=", ports[1])});
  ASSERT_OK(empty);
  again[1] = *std::move(empty);
  auto mixed = Connect(again);
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kFailedPrecondition) << mixed.status();
  EXPECT_NE(mixed.status().message().find("expected routing epoch 2 (as shard 0), received 1"),
            std::string::npos)
      << mixed.status();
}

TEST(CheckpointIntegrationTest, LostShardReplacedFromTheClusterCheckpointReportsTheLostSteps) {
  const std::string config = "--table_config_file=" + TableConfigFile();
  const std::vector<std::string> dirs = {FreshDir("lost_shard0"), FreshDir("lost_shard1")};
  const std::string backup = FreshDir("lost_backup");
  absl::StatusOr<Cluster> cluster = StartWithCheckpointDirs(2, dirs, {config});
  ASSERT_OK(cluster);
  auto client = Connect(*cluster);
  ASSERT_OK(client);
  // Synchronous (s = 0), so that training is deterministic.
  auto pipe = NewPipeline(client->get(), 0, 0);
  ASSERT_OK(pipe);
  ASSERT_OK(TrainOn(**pipe, 0, 0, 20));
  absl::StatusOr<ClusterCheckpoint> taken = (*client)->Checkpoint();
  ASSERT_OK(taken);
  ASSERT_EQ(taken->step, 19);
  // The cluster checkpoint kept off the shards' machines.
  std::vector<std::string> kept;
  ASSERT_OK(FileSystem::Posix()->CreateDirs(backup));
  for (const auto& r : taken->shards) {
    kept.push_back(JoinPath(backup, absl::StrCat("shard-", r.manifest().shard_index())));
    std::filesystem::copy(r.path(), kept.back(), std::filesystem::copy_options::recursive);
  }
  ASSERT_OK(TrainOn(**pipe, 0, 20, 40));
  const std::map<std::string, std::vector<float>> at_step_39 = AllRows(client->get());

  // Shard 1's machine is gone: the process and its directory. A new shard 1
  // on the same address restores shard 1's part of the cluster checkpoint.
  const int port1 = (*cluster)[1]->port();
  ASSERT_OK((*cluster)[1]->Stop(SIGKILL, absl::Seconds(10)));
  ASSERT_OK(FileSystem::Posix()->RemoveAll(dirs[1]));
  auto replacement = ServerProcess::Start(
      {"--shard_index=1", "--shard_count=2", "--worker_threads=2", config,
       absl::StrCat("--port=", port1), "--checkpoint_dir=" + FreshDir("lost_new_shard1"),
       "--restore_from=" + kept[1]});
  ASSERT_OK(replacement);
  // The trainer reconnects, and its next step reports what the shard lost.
  absl::Status lost = TrainOn(**pipe, 0, 40, 45);
  EXPECT_EQ(lost.code(), absl::StatusCode::kDataLoss) << lost;
  std::fprintf(stderr, "the trainer was told: %s\n", lost.ToString().c_str());
  for (const std::string& part :
       {std::string("shard 1 of 2 (restored from '") + kept[1] + "')",
        std::string("restored state holds them only up to step 19: its pushes of steps 20 to "),
        std::string("were lost with the shard's state")}) {
    EXPECT_NE(lost.message().find(part), std::string::npos) << lost << "\nlacks: " << part;
  }
  pipe->reset();

  // The documented recovery: every shard back to the cluster checkpoint
  // (shard 0 restarted on its address from its part), the trainer from
  // step 20; it trains to the same rows as before the loss.
  const int port0 = (*cluster)[0]->port();
  ASSERT_OK((*cluster)[0]->Stop(SIGKILL, absl::Seconds(10)));
  auto shard0 =
      ServerProcess::Start({"--shard_index=0", "--shard_count=2", "--worker_threads=2", config,
                            absl::StrCat("--port=", port0), "--restore_from=" + kept[0]});
  ASSERT_OK(shard0);
  auto resumed = NewPipeline(client->get(), 0, 20);
  ASSERT_OK(resumed);
  ASSERT_OK(TrainOn(**resumed, 0, 20, 40));
  EXPECT_EQ(AllRows(client->get()), at_step_39);
}

TEST(CheckpointIntegrationTest, ShardKilledWhileWritingACheckpointRestoresTheOldOrTheNewOne) {
  const std::string dir = FreshDir("kill_during_write");
  constexpr size_t kRows = 300000;
  constexpr int kRounds = 8;
  v1::TableConfig table = AdagradTable("big", 16);
  const std::string config_path = TempPath("kill_tables.textproto");
  {
    v1::TableConfigList list;
    *list.add_tables() = table;
    std::string text;
    google::protobuf::TextFormat::PrintToString(list, &text);
    std::ofstream(config_path) << text;
  }
  const std::vector<std::string> flags = {"--table_config_file=" + config_path,
                                          "--restore_from=latest", "--checkpoint_keep=0"};
  // A short retry budget: the checkpoint call of a killed shard fails at
  // once instead of retrying for the default 30 s.
  const absl::Duration budget = absl::Milliseconds(300);
  absl::StatusOr<Cluster> shard = StartWithCheckpointDirs(1, {dir}, flags);
  ASSERT_OK(shard);
  auto client = Connect(*shard, budget);
  ASSERT_OK(client);
  std::vector<uint64_t> keys(kRows);
  for (size_t i = 0; i < kRows; ++i) keys[i] = Mix64(i);
  {
    std::vector<v1::PushRequest> push(1);
    AddGradients(&push[0], "big", keys, std::vector<float>(kRows * 16, 0.5f));
    std::vector<v1::PushResponse> pushed;
    ASSERT_OK((*client)->Push(push, &pushed));
  }
  const std::vector<uint64_t> sample(keys.begin(), keys.begin() + 500);
  std::map<std::string, std::vector<float>> expected;  // checkpoint id -> sample rows
  auto checkpoint = [&](Client* c, const std::string& id) {
    CheckpointOptions o;
    o.id = id;
    return c->Checkpoint(o);
  };
  {
    auto rows = (*client)->LookupRows("big", sample);
    ASSERT_OK(rows);
    expected["round-0"] = *rows;
    ASSERT_OK(checkpoint(client->get(), "round-0"));
  }
  std::mt19937 rng(2026);
  std::string last_complete = "round-0";
  int old_restored = 0, new_restored = 0;
  for (int round = 1; round <= kRounds; ++round) {
    // Change the sample (and more) so that every checkpoint differs.
    std::vector<uint64_t> changed(keys.begin(), keys.begin() + 5000);
    std::vector<v1::PushRequest> push(1);
    AddGradients(&push[0], "big", changed,
                 std::vector<float>(changed.size() * 16, 0.01f * static_cast<float>(round)));
    std::vector<v1::PushResponse> pushed;
    ASSERT_OK((*client)->Push(push, &pushed));
    auto rows = (*client)->LookupRows("big", sample);
    ASSERT_OK(rows);
    const std::string id = absl::StrCat("round-", round);
    expected[id] = *rows;

    absl::StatusOr<ClusterCheckpoint> result;
    std::thread writer([&] { result = checkpoint(client->get(), id); });
    absl::SleepFor(absl::Milliseconds(rng() % 200));
    ASSERT_OK((*shard)[0]->Stop(SIGKILL, absl::Seconds(10)));
    writer.join();
    client->reset();
    shard = StartWithCheckpointDirs(1, {dir}, flags);
    ASSERT_OK(shard);
    client = Connect(*shard, budget);
    ASSERT_OK(client);
    auto infos = (*client)->ShardInfos();
    ASSERT_OK(infos);
    const std::string from = (*infos)[0].restored_from();
    const std::string restored_id = from.substr(from.rfind('/') + 1);
    const std::string previous = last_complete;
    std::printf("round %d: killed %s checkpoint '%s' finished; restored '%s'\n", round,
                result.ok() ? "after" : "before", id.c_str(), restored_id.c_str());
    ASSERT_TRUE(restored_id == id || restored_id == previous)
        << "restored '" << restored_id << "', expected '" << id << "' or '" << previous << "'";
    if (result.ok()) {
      EXPECT_EQ(restored_id, id) << "an acknowledged checkpoint was lost";
    }
    (restored_id == id ? new_restored : old_restored)++;
    auto now = (*client)->LookupRows("big", sample);
    ASSERT_OK(now);
    EXPECT_EQ(*now, expected.at(restored_id)) << "round " << round << ": rows are a mix";
    last_complete = restored_id;
  }
  std::printf("%d rounds restored the new checkpoint, %d the previous one\n", new_restored,
              old_restored);
}

TEST(CheckpointIntegrationTest, PeriodicAndExitCheckpointsAreWrittenListedAndRestored) {
  const std::string dir = FreshDir("periodic");
  const std::string config = TempPath("periodic_tables.textproto");
  {
    v1::TableConfigList list;
    *list.add_tables() = AdagradTable("t", 4);
    std::string text;
    google::protobuf::TextFormat::PrintToString(list, &text);
    std::ofstream(config) << text;
  }
  absl::StatusOr<Cluster> shard = StartWithCheckpointDirs(
      1, {dir},
      {"--table_config_file=" + config, "--checkpoint_interval=1s", "--checkpoint_incremental"});
  ASSERT_OK(shard);
  auto client = Connect(*shard);
  ASSERT_OK(client);
  auto push = [&](float g) {
    std::vector<uint64_t> keys;
    for (uint64_t k = 0; k < 100; ++k) keys.push_back(Mix64(k));
    std::vector<v1::PushRequest> req(1);
    AddGradients(&req[0], "t", keys, std::vector<float>(keys.size() * 4, g));
    std::vector<v1::PushResponse> resp;
    return (*client)->Push(req, &resp);
  };
  ASSERT_OK(push(0.5f));
  auto channel = grpc::CreateChannel((*shard)[0]->address(), grpc::InsecureChannelCredentials());
  auto admin = v1::AdminService::NewStub(channel);
  auto list = [&] {
    grpc::ClientContext ctx;
    v1::ListCheckpointsResponse resp;
    EXPECT_TRUE(admin->ListCheckpoints(&ctx, v1::ListCheckpointsRequest(), &resp).ok());
    return resp;
  };
  // Periodic: within a few intervals a checkpoint lists.
  for (int i = 0; i < 100 && list().checkpoints_size() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_GT(list().checkpoints_size(), 0) << "no periodic checkpoint after 10 s";
  ASSERT_OK(push(-0.25f));
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 100; ++k) keys.push_back(Mix64(k));
  auto before = (*client)->LookupRows("t", keys);
  ASSERT_OK(before);
  // SIGTERM: serving stops, then a last checkpoint holds the second push.
  absl::StatusOr<int> stopped = (*shard)[0]->Stop(SIGTERM, absl::Seconds(20));
  ASSERT_OK(stopped);
  EXPECT_TRUE(WIFEXITED(*stopped) && WEXITSTATUS(*stopped) == 0);
  client->reset();
  shard = StartWithCheckpointDirs(1, {dir}, {"--restore_from=latest"});
  ASSERT_OK(shard);
  client = Connect(*shard);
  ASSERT_OK(client);
  auto after = (*client)->LookupRows("t", keys);
  ASSERT_OK(after);
  EXPECT_EQ(*after, *before) << "the restore lost the last push";
  // This shard has no periodic checkpoints: only the one on exit can hold
  // the next push.
  ASSERT_OK(push(0.125f));
  before = (*client)->LookupRows("t", keys);
  ASSERT_OK(before);
  stopped = (*shard)[0]->Stop(SIGTERM, absl::Seconds(20));
  ASSERT_OK(stopped);
  client->reset();
  shard = StartWithCheckpointDirs(1, {dir}, {"--restore_from=latest"});
  ASSERT_OK(shard);
  client = Connect(*shard);
  ASSERT_OK(client);
  after = (*client)->LookupRows("t", keys);
  ASSERT_OK(after);
  EXPECT_EQ(*after, *before) << "the exit checkpoint did not hold the last push";

  // A damaged checkpoint asked for by path: the shard refuses to start,
  // naming the file and the fault.
  auto infos = (*client)->ShardInfos();
  ASSERT_OK(infos);
  const std::string path = (*infos)[0].restored_from();
  ASSERT_NE(path, "");
  {
    std::fstream f(JoinPath(path, "table-t.rows"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64);
    f.put('\x5a');
  }
  std::string output;
  const int rc = RunCommand({EMBER_SERVER_BIN, "--port=0", "--checkpoint_dir=" + dir,
                             "--restore_from=" + path},
                            "", &output);
  EXPECT_NE(rc, 0) << output;
  EXPECT_NE(output.find("table-t.rows"), std::string::npos) << output;
  EXPECT_NE(output.find("CRC32C mismatch"), std::string::npos) << output;

  // A shard without a checkpoint directory says so.
  absl::StatusOr<Cluster> plain = StartWithCheckpointDirs(1, {}, {});
  ASSERT_OK(plain);
  auto plain_admin = v1::AdminService::NewStub(
      grpc::CreateChannel((*plain)[0]->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::CheckpointResponse resp;
  grpc::Status st = plain_admin->Checkpoint(&ctx, v1::CheckpointRequest(), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("--checkpoint_dir"), std::string::npos) << st.error_message();
}

}  // namespace
}  // namespace ember::testing
