// ember-smoke: a short workload against a running cluster, through the
// generated gRPC stubs. Creates the reference tables (WORKLOAD.md) on every
// shard, then loops for --seconds: per step one Lookup and one Push RPC per
// shard carrying all 17 features, keys deduplicated and routed by ShardOf.
// Prints steps/s, keys/s and per-step latency, and checks the cluster holds
// the rows it was sent. The reference trainer (client library, prefetch,
// SSP) replaces this in the client issue.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/reference_workload.h"
#include "common/key_hash.h"
#include "common/wire.h"
#include "ember/v1/admin_service.grpc.pb.h"
#include "ember/v1/embedding_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, shards, "127.0.0.1:50051", "Comma-separated shard addresses, in shard order.");
ABSL_FLAG(double, seconds, 10, "How long to run.");
ABSL_FLAG(int, batch, 128, "Examples per step.");
ABSL_FLAG(int, dim, 8, "Embedding dimension.");
ABSL_FLAG(uint64_t, scale_down, 100, "Divide every cardinality by this.");
ABSL_FLAG(uint64_t, seed, 42, "Seed of the id stream.");

namespace ember::bench {
namespace {

using Clock = std::chrono::steady_clock;

v1::TableConfig TableFor(const Feature& f, uint32_t dim) {
  v1::TableConfig c;
  c.set_name(f.table);
  c.set_dim(dim);
  c.mutable_initializer()->mutable_truncated_normal()->set_stddev(0.05f);
  c.mutable_initializer()->set_seed(1);
  c.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.01f);
  c.mutable_optimizer()->mutable_adagrad()->set_initial_accumulator(0.1f);
  return c;
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

int Run() {
  const std::vector<std::string> addrs = absl::StrSplit(absl::GetFlag(FLAGS_shards), ',');
  const uint32_t n_shards = static_cast<uint32_t>(addrs.size());
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  const int batch = absl::GetFlag(FLAGS_batch);
  const auto features = ReferenceFeatures(absl::GetFlag(FLAGS_scale_down));
  std::vector<std::unique_ptr<v1::EmbeddingService::Stub>> emb;
  std::vector<std::unique_ptr<v1::AdminService::Stub>> admin;
  for (uint32_t s = 0; s < n_shards; ++s) {
    auto ch = grpc::CreateChannel(addrs[s], grpc::InsecureChannelCredentials());
    emb.push_back(v1::EmbeddingService::NewStub(ch));
    admin.push_back(v1::AdminService::NewStub(ch));
    v1::GetShardInfoResponse info;
    grpc::Status st = admin[s]->GetShardInfo(Context().get(), {}, &info);
    if (!st.ok() || info.shard_index() != s || info.shard_count() != n_shards) {
      std::fprintf(stderr, "shard %u at %s: %s (index %u of %u)\n", s, addrs[s].c_str(),
                   st.error_message().c_str(), info.shard_index(), info.shard_count());
      return 1;
    }
    for (const Feature& f : features) {
      v1::CreateTableRequest req;
      *req.mutable_config() = TableFor(f, dim);
      v1::CreateTableResponse resp;
      st = admin[s]->CreateTable(Context().get(), req, &resp);
      if (!st.ok()) {
        std::fprintf(stderr, "CreateTable %s: %s\n", f.table.c_str(), st.error_message().c_str());
        return 1;
      }
    }
  }

  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  std::vector<ZipfSampler> zipf;
  for (const Feature& f : features) zipf.emplace_back(f.cardinality, 1.05);
  std::vector<std::vector<absl::flat_hash_set<uint64_t>>> sent(
      n_shards, std::vector<absl::flat_hash_set<uint64_t>>(features.size()));
  std::vector<double> step_ms;
  uint64_t keys_total = 0, unique_total = 0;
  const auto start = Clock::now();
  const double seconds = absl::GetFlag(FLAGS_seconds);
  int next_report = 1;
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    const auto t0 = Clock::now();
    // Build one request per shard: every feature, unique keys only.
    std::vector<v1::LookupRequest> lookups(n_shards);
    std::vector<v1::PushRequest> pushes(n_shards);
    for (size_t fi = 0; fi < features.size(); ++fi) {
      std::vector<std::vector<uint64_t>> per_shard(n_shards);
      absl::flat_hash_set<uint64_t> seen;
      std::uniform_int_distribution<int> hot(features[fi].min_ids, features[fi].max_ids);
      for (int e = 0; e < batch; ++e) {
        for (int k = hot(rng); k > 0; --k) {
          const uint64_t key = FeatureKey(static_cast<int>(fi), zipf[fi](rng));
          ++keys_total;
          if (seen.insert(key).second) per_shard[ShardOf(key, n_shards)].push_back(key);
        }
      }
      unique_total += seen.size();
      for (uint32_t s = 0; s < n_shards; ++s) {
        v1::TableLookup* t = lookups[s].add_tables();
        t->set_table(features[fi].table);
        t->set_keys(PackKeys(per_shard[s]));
        std::vector<float> grads(per_shard[s].size() * dim, 0.01f);
        v1::TableGradients* g = pushes[s].add_tables();
        g->set_table(features[fi].table);
        g->set_keys(t->keys());
        g->set_gradients(std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
        sent[s][fi].insert(per_shard[s].begin(), per_shard[s].end());
      }
    }
    // One Lookup per shard, all shards in parallel; then the pushes.
    std::vector<grpc::Status> status(n_shards);
    std::vector<std::thread> calls;
    for (uint32_t s = 0; s < n_shards; ++s) {
      calls.emplace_back([&, s] {
        v1::LookupResponse resp;
        status[s] = emb[s]->Lookup(Context().get(), lookups[s], &resp);
        if (status[s].ok()) {
          v1::PushResponse presp;
          pushes[s].set_step(static_cast<int64_t>(step_ms.size()));
          status[s] = emb[s]->Push(Context().get(), pushes[s], &presp);
        }
      });
    }
    for (auto& c : calls) c.join();
    for (uint32_t s = 0; s < n_shards; ++s) {
      if (!status[s].ok()) {
        std::fprintf(stderr, "shard %u: %s\n", s, status[s].error_message().c_str());
        return 1;
      }
    }
    step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (elapsed >= next_report) {
      std::printf("  %4.0fs  %6zu steps  %8.0f steps/s\n", elapsed, step_ms.size(),
                  step_ms.size() / elapsed);
      std::fflush(stdout);
      ++next_report;
    }
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();

  // Every row sent must be stored on its shard.
  uint64_t expected_rows = 0, stored_rows = 0;
  for (uint32_t s = 0; s < n_shards; ++s) {
    v1::ListTablesResponse list;
    grpc::Status st = admin[s]->ListTables(Context().get(), {}, &list);
    if (!st.ok()) return 1;
    for (size_t fi = 0; fi < features.size(); ++fi) expected_rows += sent[s][fi].size();
    for (const auto& t : list.tables()) stored_rows += t.rows();
  }
  std::sort(step_ms.begin(), step_ms.end());
  auto pct = [&](double p) { return step_ms[std::min(step_ms.size() - 1, size_t(p * step_ms.size()))]; };
  std::printf("\nember-smoke: %u shards, 17 features (cardinality / %lu), batch %d, dim %u, seed %lu\n",
              n_shards, static_cast<unsigned long>(absl::GetFlag(FLAGS_scale_down)), batch, dim,
              static_cast<unsigned long>(absl::GetFlag(FLAGS_seed)));
  std::printf("  steps            %zu in %.1f s = %.0f steps/s (lookup + push, no prefetch yet)\n",
              step_ms.size(), elapsed, step_ms.size() / elapsed);
  std::printf("  keys             %.0f keys/s, %.0f unique keys/s (%.0f%% unique)\n",
              keys_total / elapsed, unique_total / elapsed, 100.0 * unique_total / keys_total);
  std::printf("  step latency     p50 %.2f ms, p99 %.2f ms\n", pct(0.5), pct(0.99));
  std::printf("  rows on shards   %lu stored, %lu distinct keys sent: %s\n",
              static_cast<unsigned long>(stored_rows), static_cast<unsigned long>(expected_rows),
              stored_rows == expected_rows ? "match" : "MISMATCH");
  return stored_rows == expected_rows ? 0 : 1;
}

}  // namespace
}  // namespace ember::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ember::bench::Run();
}
