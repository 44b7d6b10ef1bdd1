// Online moves to another shard count (ember/cluster_move.h) with real
// ember-server processes while trainers run: 2 -> 3 -> 2 shards under two
// workers that follow the cluster (refused with ABORTED, they connect
// again and resume at the step after the one every shard applied). At
// s = 0 the run ends bit for bit like one that never moved (every
// optimizer and storage dtype); at s = 1, on counting tables, every push is
// applied exactly once. What could lose a push is refused.
#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ember/cluster_move.h"
#include "ember/v1/admin_service.grpc.pb.h"
#include "ember/v1/embedding_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/server/cluster_training.h"

namespace ember::testing {
namespace {

// Steps [0, end) of `worker` on `tables`, following the cluster through
// moves; `refusals` counts the steps refused because the cluster moved.
absl::Status TrainFollowingMoves(ClientOptions options, uint32_t worker, int64_t end, int staleness,
                                 const std::vector<v1::TableConfig>& tables,
                                 std::optional<float> constant, std::atomic<int>* refusals) {
  int64_t next = 0;
  for (int attempt = 0; attempt < 8; ++attempt) {
    EMBER_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::ConnectToCluster(options));
    if (attempt > 0) {
      EMBER_ASSIGN_OR_RETURN(const int64_t applied, client->AppliedStep(worker));
      next = applied + 1;
    }
    EMBER_ASSIGN_OR_RETURN(std::unique_ptr<StepPipeline> pipe,
                           NewPipeline(client.get(), worker, next, staleness, tables));
    absl::Status trained = TrainOn(*pipe, worker, next, end, constant);
    if (trained.ok()) return pipe->Close();
    if (!absl::IsAborted(trained)) return trained;
    refusals->fetch_add(1);
    // Its unregistering is refused too: the new cluster's clock keeps the
    // worker at the cut.
    (void)pipe->Close();
    options.shards = client->options().shards;
  }
  return absl::DeadlineExceededError("refused more often than the test moves the cluster");
}

class MoveIntegrationTest : public ::testing::Test {
 protected:
  // Shards 0 and 1 of a cluster with `tables`, and a third waiting to join.
  void StartShards(const std::vector<v1::TableConfig>& tables, const std::string& name) {
    const std::string config =
        "--table_config_file=" + TableConfigFile(tables, name + "_tables.textproto");
    auto two = StartWithCheckpointDirs(2, {FreshDir(name + "_0"), FreshDir(name + "_1")}, {config});
    ASSERT_OK(two);
    cluster_ = *std::move(two);
    auto joining = ServerProcess::Start(
        {"--join", "--worker_threads=2", "--checkpoint_dir=" + FreshDir(name + "_2")});
    ASSERT_OK(joining);
    cluster_.push_back(*std::move(joining));
  }
  std::vector<std::string> Addresses(std::initializer_list<int> shards) const {
    std::vector<std::string> out;
    for (int i : shards) out.push_back(cluster_[i]->address());
    return out;
  }
  v1::GetShardInfoResponse Info(int shard) const {
    auto stub = v1::AdminService::NewStub(
        grpc::CreateChannel(cluster_[shard]->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::GetShardInfoResponse info;
    EXPECT_TRUE(stub->GetShardInfo(&context, {}, &info).ok());
    return info;
  }
  // Waits (at most 60 s) until shard 0 has applied `step` of `worker`.
  void AwaitStep(uint32_t worker, int64_t step) const {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      const v1::GetShardInfoResponse info = Info(0);
      for (const auto& w : info.workers()) {
        if (w.worker_id() == worker && w.applied_step() >= step) return;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    ADD_FAILURE() << "worker " << worker << " did not reach step " << step;
  }
  absl::StatusOr<MoveResult> Move(std::initializer_list<int> from, std::initializer_list<int> to) {
    MoveOptions o;
    o.from = Addresses(from);
    o.to = Addresses(to);
    o.timeout = absl::Seconds(60);
    absl::StatusOr<MoveResult> moved = MoveCluster(o);
    if (moved.ok()) {
      std::fprintf(stderr,
                   "moved %zu -> %zu at step %lld: %llu rows, %llu moved, pushes held %.3f s\n",
                   o.from.size(), o.to.size(), static_cast<long long>(moved->step),
                   static_cast<unsigned long long>(moved->rows),
                   static_cast<unsigned long long>(moved->moved_rows), moved->held_seconds);
    }
    return moved;
  }
  // Two workers training [0, steps) on `tables` while the cluster moves
  // 2 -> 3 at a third of worker 0's steps and 3 -> 2 at two thirds.
  void TrainWhileMoving(const std::vector<v1::TableConfig>& tables, int staleness,
                        std::optional<float> constant, int64_t steps) {
    ClientOptions options = OptionsFor(cluster_);
    options.shards = Addresses({0, 1});
    std::atomic<int> refusals[2] = {0, 0};
    absl::Status trained[2];
    std::thread w1([&] {
      trained[1] =
          TrainFollowingMoves(options, 1, steps, staleness, tables, constant, &refusals[1]);
    });
    std::thread w0([&] {
      trained[0] =
          TrainFollowingMoves(options, 0, steps, staleness, tables, constant, &refusals[0]);
    });
    AwaitStep(0, steps / 3);
    absl::StatusOr<MoveResult> out = Move({0, 1}, {0, 1, 2});
    AwaitStep(0, 2 * steps / 3);
    absl::StatusOr<MoveResult> in = Move({0, 1, 2}, {0, 1});
    w0.join();
    w1.join();
    ASSERT_OK(out);
    ASSERT_OK(in);
    ASSERT_OK(trained[0]);
    ASSERT_OK(trained[1]);
    // Both moves happened while both workers trained: each was refused by
    // each (its step after the cut), and connected again.
    EXPECT_EQ(refusals[0].load(), 2);
    EXPECT_EQ(refusals[1].load(), 2);
    EXPECT_EQ(out->routing_epoch, 2u);
    EXPECT_EQ(in->routing_epoch, 3u);
    // Jump routing: adding a shard moves about a third of the rows, all to
    // the new shard; removing it moves back just those.
    ASSERT_EQ(out->shards.size(), 3u);
    EXPECT_EQ(out->shards[0].moved_rows() + out->shards[1].moved_rows(), 0u);
    EXPECT_EQ(out->shards[2].moved_rows(), out->shards[2].rows());
    const double share = static_cast<double>(out->moved_rows) / static_cast<double>(out->rows);
    EXPECT_GT(share, 0.27);
    EXPECT_LT(share, 0.40);
    const double back = static_cast<double>(in->moved_rows) / static_cast<double>(in->rows);
    EXPECT_GT(back, 0.27);
    EXPECT_LT(back, 0.40);
  }

  Cluster cluster_;
};

TEST_F(MoveIntegrationTest,
       TwoWorkersTrainedThroughTwoToThreeToTwoEndBitForBitLikeARunThatNeverMoved) {
  constexpr int64_t kSteps = 450;
  // The uninterrupted reference.
  absl::StatusOr<Cluster> reference = StartWithCheckpointDirs(
      2, {}, {"--table_config_file=" + TableConfigFile(kTables, "move_ref.textproto")});
  ASSERT_OK(reference);
  auto ref_client = Connect(*reference);
  ASSERT_OK(ref_client);
  std::vector<std::unique_ptr<StepPipeline>> ref_pipes;
  ASSERT_OK(TrainBoth(ref_client->get(), 0, kSteps, &ref_pipes));
  for (auto& p : ref_pipes) ASSERT_OK(p->Close());
  const std::map<std::string, std::vector<float>> expected = AllRows(ref_client->get());

  StartShards(kTables, "move_s0");
  TrainWhileMoving(kTables, /*staleness=*/0, std::nullopt, kSteps);
  auto client = Client::ConnectToCluster(OptionsFor(cluster_));  // follows shard 2's retirement
  ASSERT_OK(client);
  EXPECT_EQ((*client)->shard_count(), 2u);
  EXPECT_EQ((*client)->routing_epoch(), 3u);
  EXPECT_EQ(AllRows(client->get()), expected);

  // The shard that left says where the cluster went, and serves nothing.
  const v1::GetShardInfoResponse left = Info(2);
  EXPECT_TRUE(left.retired());
  EXPECT_EQ(absl::StrJoin(left.cluster_addresses(), ","), absl::StrJoin(Addresses({0, 1}), ","));
  auto stub = v1::EmbeddingService::NewStub(
      grpc::CreateChannel(cluster_[2]->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::LookupRequest lookup;
  AddLookup(&lookup, kTables[0].name(), {KeyOf(0, 0, 1)});
  v1::LookupResponse rows;
  const grpc::Status refused = stub->Lookup(&context, lookup, &rows);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_NE(refused.error_message().find("left its cluster in a move to 2 shards"),
            std::string::npos)
      << refused.error_message();
}

TEST_F(MoveIntegrationTest, EveryPushAtStalenessOneIsAppliedExactlyOnceThroughTwoToThreeToTwo) {
  constexpr int64_t kSteps = 450;
  const std::vector<v1::TableConfig> tables = {CountingTable("count_a", kDim),
                                               CountingTable("count_b", kDim)};
  StartShards(tables, "move_s1");
  // Every pooled gradient element is -1/8: a row gains 1/8 per id of it in
  // an applied step (sum features) or 1/(8n) of an example's n ids (mean),
  // all dyadic, so the sums are exact in any order.
  TrainWhileMoving(tables, /*staleness=*/1, -0.125f, kSteps);
  auto client = Client::ConnectToCluster(OptionsFor(cluster_));
  ASSERT_OK(client);
  std::map<std::string, std::vector<float>> expected;
  for (size_t f = 0; f < tables.size(); ++f) {
    std::vector<float>& rows = expected[tables[f].name()];
    rows.assign(2 * kIdsPerFeature * kDim, 0.0f);
    for (uint32_t w : {0u, 1u}) {
      for (int64_t t = 0; t < kSteps; ++t) {
        const Batch batch = MakeBatch(w, t, tables.size());
        const FeatureBatch& fb = batch.features[f];
        for (size_t i = 0; i + 1 < fb.offsets.size(); ++i) {
          const int64_t n = fb.offsets[i + 1] - fb.offsets[i];
          for (int64_t j = fb.offsets[i]; j < fb.offsets[i + 1]; ++j) {
            // The id's index in AllRows's order: worker, then id.
            uint64_t id = 0;
            while (KeyOf(w, f, id) != fb.keys[j]) ++id;
            const float gain = f % 2 == 0 ? 0.125f / static_cast<float>(n) : 0.125f;
            for (uint32_t d = 0; d < kDim; ++d) rows[(w * kIdsPerFeature + id) * kDim + d] += gain;
          }
        }
      }
    }
  }
  EXPECT_EQ(AllRows(client->get(), tables), expected);
}

TEST_F(MoveIntegrationTest, AMoveRefusesWhatCouldLoseAPushAndAnAbortedCutLetsTheHeldPushesGo) {
  const std::vector<v1::TableConfig> tables = {CountingTable("count", kDim)};
  StartShards(tables, "move_refuse");
  auto admin = [&](int shard) {
    return v1::AdminService::NewStub(
        grpc::CreateChannel(cluster_[shard]->address(), grpc::InsecureChannelCredentials()));
  };
  // A joining shard serves nothing, and a client refuses it.
  {
    auto stub = v1::EmbeddingService::NewStub(
        grpc::CreateChannel(cluster_[2]->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::LookupRequest lookup;
    AddLookup(&lookup, "count", {1});
    v1::LookupResponse rows;
    EXPECT_EQ(stub->Lookup(&context, lookup, &rows).error_code(), grpc::StatusCode::UNAVAILABLE);
    ClientOptions o = OptionsFor(cluster_);
    o.connect_timeout = absl::Seconds(2);
    auto refused = Client::Connect(o);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find("waits to join a cluster"), std::string::npos)
        << refused.status();
  }
  // `from` must be the cluster, in shard-index order.
  {
    MoveOptions o;
    o.from = Addresses({1, 0});
    o.to = Addresses({0, 1, 2});
    absl::StatusOr<MoveResult> moved = MoveCluster(o);
    EXPECT_EQ(moved.status().code(), absl::StatusCode::kFailedPrecondition) << moved.status();
    EXPECT_NE(moved.status().message().find("expected shard 0 of 2"), std::string::npos)
        << moved.status();
  }
  // A commit without a cut holding the pushes would lose the ones after it.
  std::vector<std::string> parts;
  {
    grpc::ClientContext context;
    v1::CheckpointRequest cut;
    v1::CheckpointResponse written;
    ASSERT_TRUE(admin(0)->Checkpoint(&context, cut, &written).ok());
    grpc::ClientContext context1;
    v1::CheckpointResponse written1;
    ASSERT_TRUE(admin(1)->Checkpoint(&context1, cut, &written1).ok());
    parts = {written.path(), written1.path()};
    grpc::ClientContext commit_context;
    v1::CommitMoveRequest commit;
    for (const auto& p : parts) commit.add_parts(p);
    commit.set_shard_index(0);
    commit.set_shard_count(3);
    for (const auto& a : Addresses({0, 1, 2})) commit.add_addresses(a);
    v1::CommitMoveResponse committed;
    const grpc::Status s = admin(0)->CommitMove(&commit_context, commit, &committed);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(s.error_message().find("no move's cut holds its pushes"), std::string::npos)
        << s.error_message();
  }
  // A cut that holds: a registered worker's later push is refused and
  // retried by its client, an unregistered one's refused; AbortMove lets
  // the retried push be applied under the routing the cluster had.
  ClientOptions o = OptionsFor(cluster_);
  o.shards = Addresses({0, 1});
  o.retry_budget = absl::Seconds(20);  // the push past the cut is retried until the abort
  auto trainer = Client::Connect(o);
  ASSERT_OK(trainer);
  auto pipe = NewPipeline(trainer->get(), 0, 0, /*staleness=*/0, tables);
  ASSERT_OK(pipe);
  ASSERT_OK(TrainOn(**pipe, 0, 0, 5, -0.125f));
  {
    grpc::ClientContext context;
    v1::CheckpointRequest cut;
    cut.set_step(4);
    cut.set_hold_for_move(true);
    v1::CheckpointResponse written;
    ASSERT_TRUE(admin(0)->Checkpoint(&context, cut, &written).ok());
    EXPECT_TRUE(Info(0).move_held());
  }
  std::atomic<bool> pushed{false};
  absl::Status held;
  std::thread step5([&] {
    held = TrainOn(**pipe, 0, 5, 6, -0.125f);
    pushed = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(pushed.load()) << "a push past the cut was not held";
  {
    // An unregistered worker's push is not held: refused, not lost.
    auto stub = v1::EmbeddingService::NewStub(
        grpc::CreateChannel(cluster_[0]->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::PushRequest push;
    push.set_worker_id(77);
    push.set_step(0);
    uint64_t key = 0;
    while (DefaultShardOf(key, 2) != 0) ++key;
    AddGradients(&push, "count", {key}, std::vector<float>(kDim, 1.0f));
    v1::PushResponse response;
    const grpc::Status s = stub->Push(&context, push, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
  {
    grpc::ClientContext context;
    v1::AbortMoveResponse aborted;
    const grpc::Status s = admin(0)->AbortMove(&context, {}, &aborted);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(aborted.was_holding());
  }
  step5.join();
  ASSERT_OK(held);
  EXPECT_FALSE(Info(0).move_held());
  EXPECT_EQ(Info(0).routing_epoch(), 1u);
  ASSERT_OK((*pipe)->Close());
}

}  // namespace
}  // namespace ember::testing
