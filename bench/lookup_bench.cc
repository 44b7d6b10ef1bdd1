// ember-lookup-bench: WORKLOAD.md item 2 against a running cluster. The same
// step requests of the 17-feature workload (keys deduplicated per table,
// one request per shard per step, all shards in parallel) go to Ember over
// gRPC (Lookup, then Push) and, when --redis names one redis-server per
// shard holding the same rows, to Redis as one MGET per shard per step.
// Systems alternate round by round; medians are printed with their ratio.
#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_util.h"
#include "bench/reference_workload.h"
#include "bench/workload_flags.h"
#include "client/dedup.h"
#include "common/abseil_mode.h"
#include "common/key_router.h"
#include "common/process_cpu.h"
#include "common/wire.h"
#include "ember/client.h"

ABSL_FLAG(std::string, shards, "127.0.0.1:50051",
          "Comma-separated shard addresses, in shard order; inproc:N: N shards in this process.");
ABSL_FLAG(std::string, tls_shards, "",
          "A second cluster of as many shards serving TLS (ember-server --tls_cert/--tls_key): "
          "the same lookups are sent to it as well, round by round, to measure TLS's cost.");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA of the --tls_shards' certificates.");
ABSL_FLAG(std::string, redis, "", "Comma-separated redis-server host:port, one per shard; empty: no Redis.");
ABSL_FLAG(std::string, pipelines, "1,4", "Concurrent step pipelines to measure, comma-separated.");
ABSL_FLAG(int, steps, 200, "Step requests per pipeline per round.");
ABSL_FLAG(int, rounds, 5, "Rounds per system (alternating); medians are reported.");
ABSL_FLAG(int, dim, 8, "Embedding dimension.");
ABSL_FLAG(bool, merge_pipelines, false,
          "For pipeline counts above 1, send what a StepMerger sends: each step of the "
          "pipelines merged into one request per shard (and one MGET per shard for Redis), "
          "from one thread, instead of one request per pipeline.");

namespace ember::bench {
namespace {

using Clock = std::chrono::steady_clock;

// One step of one pipeline, ready to send.
struct StepRequest {
  std::vector<v1::LookupRequest> lookup;  // per shard
  std::vector<v1::ExchangeRequest> exchange;  // per shard: the same lookup, for a stream
  std::vector<v1::PushRequest> push;      // per shard, same keys
  std::vector<std::vector<uint64_t>> redis_keys;  // per shard: every table's keys, concatenated
  uint64_t keys = 0;         // ids in the batch
  uint64_t unique = 0;       // rows fetched
  uint64_t payload = 0;      // key bytes sent + row bytes received by a lookup
};

// The batches of several pipelines' same step side by side: the node
// step a StepMerger sends as one request per shard.
Batch ConcatBatches(const std::vector<const Batch*>& parts) {
  Batch out;
  for (size_t f = 0; f < parts[0]->features.size(); ++f) {
    FeatureBatch fb;
    fb.offsets = {0};
    for (const Batch* p : parts) {
      const FeatureBatch& src = p->features[f];
      for (size_t i = 1; i < src.offsets.size(); ++i) {
        fb.offsets.push_back(fb.offsets.back() + src.offsets[i] - src.offsets[i - 1]);
      }
      fb.keys.insert(fb.keys.end(), src.keys.begin(), src.keys.end());
    }
    out.features.push_back(std::move(fb));
  }
  return out;
}

std::vector<StepRequest> BuildRequests(const std::vector<Feature>& features, uint32_t shards,
                                       uint32_t dim, const std::vector<Batch>& batches) {
  std::vector<StepRequest> out(batches.size());
  // The shards are started with the default routing.
  const KeyRouter router = *KeyRouter::Make(kDefaultRouting, shards);
  KeyDeduplicator dedup;
  std::vector<uint32_t> inverse;
  for (size_t step = 0; step < out.size(); ++step) {
    StepRequest& r = out[step];
    const Batch& b = batches[step];
    r.lookup.resize(shards);
    r.push.resize(shards);
    r.redis_keys.resize(shards);
    for (size_t f = 0; f < features.size(); ++f) {
      dedup.Clear();
      inverse.clear();
      dedup.Add(b.features[f].keys, &inverse);
      r.keys += b.features[f].keys.size();
      std::vector<std::vector<uint64_t>> per_shard(shards);
      for (uint64_t k : dedup.unique()) per_shard[router.ShardOf(k)].push_back(k);
      for (uint32_t s = 0; s < shards; ++s) {
        if (per_shard[s].empty()) continue;
        v1::TableLookup* t = r.lookup[s].add_tables();
        t->set_table(features[f].table);
        t->set_keys(PackKeys(per_shard[s]));
        v1::TableGradients* g = r.push[s].add_tables();
        g->set_table(features[f].table);
        g->set_keys(t->keys());
        std::vector<float> grads(per_shard[s].size() * dim, 0.001f);
        g->set_gradients(std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
        r.redis_keys[s].insert(r.redis_keys[s].end(), per_shard[s].begin(), per_shard[s].end());
        r.unique += per_shard[s].size();
        r.payload += per_shard[s].size() * (8 + dim * 4);
      }
    }
    r.exchange.resize(shards);
    for (uint32_t s = 0; s < shards; ++s) {
      if (r.lookup[s].tables_size() > 0) *r.exchange[s].mutable_lookup() = r.lookup[s];
    }
  }
  return out;
}

struct Sample {
  double seconds = 0;
  uint64_t keys = 0, unique = 0, payload = 0;
  int64_t steps = 0;
  double cpu_seconds = -1;  // this process and every shard; -1: not measured
  std::vector<double> latency_ms;
};

// CPU seconds of this process plus every shard (GetShardInfo); -1 if unknown.
// In-process shards' CPU is this process's.
double ClusterCpuSeconds(Client& client) {
  if (client.in_process()) return ProcessCpuSeconds();
  absl::StatusOr<std::vector<v1::GetShardInfoResponse>> infos = client.ShardInfos();
  if (!infos.ok()) return -1;
  double cpu = ProcessCpuSeconds();
  for (const v1::GetShardInfoResponse& info : *infos) {
    if (info.process_cpu_seconds() <= 0) return -1;
    cpu += info.process_cpu_seconds();
  }
  return cpu;
}

// Sets s.cpu_seconds from two ClusterCpuSeconds readings.
Sample WithCpu(Sample s, double before, double after) {
  if (before >= 0 && after >= 0) s.cpu_seconds = after - before;
  return s;
}

// Runs every pipeline's steps on its own thread; `step(p, i)` sends one.
template <typename StepFn>
Sample RunThreads(const std::vector<std::vector<StepRequest>>& streams, int pipelines, StepFn step) {
  Sample s;
  absl::Mutex mu;
  std::atomic<bool> failed{false};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int p = 0; p < pipelines; ++p) {
    threads.emplace_back([&, p] {
      std::vector<double> lat;
      uint64_t keys = 0, unique = 0, payload = 0;
      for (size_t i = 0; i < streams[p].size() && !failed; ++i) {
        const auto t0 = Clock::now();
        if (!step(p, i)) {
          failed = true;
          return;
        }
        lat.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        keys += streams[p][i].keys;
        unique += streams[p][i].unique;
        payload += streams[p][i].payload;
      }
      absl::MutexLock lock(&mu);
      s.steps += static_cast<int64_t>(lat.size());
      s.latency_ms.insert(s.latency_ms.end(), lat.begin(), lat.end());
      s.keys += keys;
      s.unique += unique;
      s.payload += payload;
    });
  }
  for (auto& t : threads) t.join();
  s.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (failed) s.seconds = -1;
  return s;
}

// One blocking hiredis connection per shard.
struct RedisConns {
  std::vector<redisContext*> c;
  ~RedisConns() {
    for (redisContext* x : c) redisFree(x);
  }
};

bool ConnectRedis(const std::vector<std::string>& addrs, RedisConns* out) {
  for (const std::string& a : addrs) {
    std::vector<std::string> hp = absl::StrSplit(a, ':');
    int port = 0;
    if (hp.size() != 2 || !absl::SimpleAtoi(hp[1], &port)) return false;
    redisContext* c = redisConnect(hp[0].c_str(), port);
    if (c == nullptr || c->err) {
      std::fprintf(stderr, "redis %s: %s\n", a.c_str(), c ? c->errstr : "cannot connect");
      if (c) redisFree(c);
      return false;
    }
    out->c.push_back(c);
  }
  return true;
}

// MGET of each shard's keys, all shards pipelined, then every reply read.
// With `rows`, the values are checked to be dim * 4 bytes and copied out.
bool RedisMget(RedisConns& conns, const StepRequest& r, size_t row_bytes,
               std::vector<std::string>* rows) {
  std::vector<const char*> argv;
  std::vector<size_t> argl;
  std::vector<bool> sent(conns.c.size(), false);
  for (size_t s = 0; s < conns.c.size(); ++s) {
    const std::vector<uint64_t>& keys = r.redis_keys[s];
    if (keys.empty()) continue;
    argv.assign({"MGET"});
    argl.assign({4});
    for (const uint64_t& k : keys) {
      argv.push_back(reinterpret_cast<const char*>(&k));
      argl.push_back(8);
    }
    if (redisAppendCommandArgv(conns.c[s], static_cast<int>(argv.size()), argv.data(),
                               argl.data()) != REDIS_OK) {
      return false;
    }
    sent[s] = true;
  }
  for (size_t s = 0; s < conns.c.size(); ++s) {
    if (!sent[s]) continue;
    void* reply = nullptr;
    if (redisGetReply(conns.c[s], &reply) != REDIS_OK || reply == nullptr) return false;
    redisReply* rr = static_cast<redisReply*>(reply);
    bool ok = rr->type == REDIS_REPLY_ARRAY && rr->elements == r.redis_keys[s].size();
    for (size_t i = 0; ok && i < rr->elements; ++i) {
      ok = rr->element[i]->type == REDIS_REPLY_STRING && rr->element[i]->len == row_bytes;
      if (ok && rows) rows->emplace_back(rr->element[i]->str, rr->element[i]->len);
    }
    freeReplyObject(reply);
    if (!ok) {
      std::fprintf(stderr, "redis shard %zu: MGET answered a missing or malformed row\n", s);
      return false;
    }
  }
  return true;
}

struct Summary {
  double keys_per_s, unique_per_s, mb_per_s, p50, p99, p999;
  double cpu_ms_per_step;  // -1: not measured
};

// Medians over rounds of the rates; latency quantiles over all samples.
Summary Summarize(const std::vector<Sample>& rounds) {
  std::vector<double> k, u, b, lat, cpu;
  for (const Sample& s : rounds) {
    if (s.cpu_seconds >= 0 && s.steps > 0) cpu.push_back(1000.0 * s.cpu_seconds / s.steps);
    k.push_back(s.keys / s.seconds);
    u.push_back(s.unique / s.seconds);
    b.push_back(s.payload / s.seconds / 1e6);
    lat.insert(lat.end(), s.latency_ms.begin(), s.latency_ms.end());
  }
  return {Quantile(k, 0.5),    Quantile(u, 0.5),    Quantile(b, 0.5),
          Quantile(lat, 0.5),  Quantile(lat, 0.99), Quantile(lat, 0.999),
          cpu.size() == rounds.size() ? Quantile(cpu, 0.5) : -1};
}

int Run() {
  ClientOptions options;
  options.shards = absl::StrSplit(absl::GetFlag(FLAGS_shards), ',');
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  const uint32_t shards = (*client)->shard_count();
  std::unique_ptr<Client> tls_client;
  if (!absl::GetFlag(FLAGS_tls_shards).empty()) {
    ClientOptions tls_options;
    tls_options.shards = absl::StrSplit(absl::GetFlag(FLAGS_tls_shards), ',');
    tls_options.tls.enabled = true;
    tls_options.tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(tls_options);
    if (!c.ok() || (*c)->shard_count() != shards) {
      std::fprintf(stderr, "--tls_shards: %s\n",
                   c.ok() ? "expected as many shards as --shards" : c.status().ToString().c_str());
      return 1;
    }
    tls_client = std::move(*c);
  }
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  const WorkloadFlags workload = ReadWorkloadFlags();
  const auto features = workload.Features();
  for (Client* c : {client->get(), tls_client.get()}) {
    if (c == nullptr) continue;
    if (absl::Status s = CreateReferenceTables(*c, features, dim); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::vector<int> pipeline_counts;
  for (double n : ParseList(absl::GetFlag(FLAGS_pipelines))) {
    if (n < 1) return 1;
    pipeline_counts.push_back(static_cast<int>(n));
  }
  if (pipeline_counts.empty()) return 1;
  const int max_p = *std::max_element(pipeline_counts.begin(), pipeline_counts.end());
  const int steps = absl::GetFlag(FLAGS_steps);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  // sets[r][p]: pipeline p's steps in round r. Cycled: one set, every round
  // repeats it; fresh ids: a set per round, each step's keys new to the round.
  // With --merge_pipelines, merged[n][r]: the steps of pipelines 0..n-1
  // merged into one request per shard (one stream).
  const bool merge = absl::GetFlag(FLAGS_merge_pipelines);
  std::vector<std::vector<std::vector<StepRequest>>> sets(workload.fresh_ids ? rounds : 1);
  std::map<int, std::vector<std::vector<std::vector<StepRequest>>>> merged;
  for (size_t r = 0; r < sets.size(); ++r) {
    std::vector<std::vector<Batch>> batches(max_p);
    for (int p = 0; p < max_p; ++p) {
      BatchGenerator gen = workload.Generator(p, static_cast<int>(r));
      for (int i = 0; i < steps; ++i) batches[p].push_back(gen.Next());
      sets[r].push_back(BuildRequests(features, shards, dim, batches[p]));
    }
    for (int n : pipeline_counts) {
      if (!merge || n < 2) continue;
      std::vector<Batch> node(steps);
      for (int i = 0; i < steps; ++i) {
        std::vector<const Batch*> parts;
        for (int p = 0; p < n; ++p) parts.push_back(&batches[p][i]);
        node[i] = ConcatBatches(parts);
      }
      merged[n].resize(sets.size());
      merged[n][r].push_back(BuildRequests(features, shards, dim, node));
    }
  }
  std::vector<std::string> redis_addrs;
  if (!absl::GetFlag(FLAGS_redis).empty()) redis_addrs = absl::StrSplit(absl::GetFlag(FLAGS_redis), ',');
  if (!redis_addrs.empty() && redis_addrs.size() != shards) {
    std::fprintf(stderr, "--redis: expected %u addresses (one per shard), received %zu\n", shards,
                 redis_addrs.size());
    return 1;
  }
  std::printf("ember-lookup-bench: %u shards, %s, dim %u, %d steps x %d rounds, %u cores%s\n",
              shards, workload.Describe().c_str(), dim, steps, rounds,
              std::thread::hardware_concurrency(), redis_addrs.empty() ? ", no Redis" : "");

  // Every key goes into Ember once (inserting its initial row); the rows
  // Ember answered are then written to Redis, so both hold the same rows.
  const size_t row_bytes = dim * 4;
  RedisConns loader;
  if (!redis_addrs.empty() && !ConnectRedis(redis_addrs, &loader)) return 1;
  // Every step of every round, flattened: each key goes in once.
  std::vector<const StepRequest*> all;
  for (const auto& set : sets) {
    for (const auto& stream : set) {
      for (const StepRequest& r : stream) all.push_back(&r);
    }
  }
  for (const StepRequest* rp : all) {
    const StepRequest& r = *rp;
    std::vector<v1::LookupResponse> resp;
    if (absl::Status st = (*client)->Lookup(r.lookup, &resp); !st.ok()) {
      std::fprintf(stderr, "lookup: %s\n", st.ToString().c_str());
      return 1;
    }
    if (tls_client != nullptr) {
      std::vector<v1::LookupResponse> tls_resp;
      if (absl::Status st = tls_client->Lookup(r.lookup, &tls_resp); !st.ok()) {
        std::fprintf(stderr, "lookup over TLS: %s\n", st.ToString().c_str());
        return 1;
      }
    }
    if (redis_addrs.empty()) continue;
    for (uint32_t s = 0; s < shards; ++s) {
      std::vector<const char*> argv = {"MSET"};
      std::vector<size_t> argl = {4};
      for (int t = 0; t < r.lookup[s].tables_size(); ++t) {
        const std::string& keys = r.lookup[s].tables(t).keys();
        const std::string& rows = resp[s].tables(t).rows();
        for (size_t i = 0; i < keys.size() / 8; ++i) {
          argv.push_back(keys.data() + i * 8);
          argl.push_back(8);
          argv.push_back(rows.data() + i * row_bytes);
          argl.push_back(row_bytes);
        }
      }
      if (argv.size() == 1) continue;
      redisReply* reply = static_cast<redisReply*>(
          redisCommandArgv(loader.c[s], static_cast<int>(argv.size()), argv.data(), argl.data()));
      if (reply == nullptr || reply->type == REDIS_REPLY_ERROR) {
        std::fprintf(stderr, "redis MSET failed\n");
        return 1;
      }
      freeReplyObject(reply);
    }
  }
  if (!redis_addrs.empty()) {
    // Same rows: Redis's answer to the first step equals Ember's.
    const StepRequest& r = sets[0][0][0];
    std::vector<std::string> redis_rows;
    if (!RedisMget(loader, r, row_bytes, &redis_rows)) return 1;
    std::vector<v1::LookupResponse> resp;
    if (!(*client)->Lookup(r.lookup, &resp).ok()) return 1;
    size_t i = 0;
    bool same = true;
    for (uint32_t s = 0; s < shards; ++s) {
      for (const v1::TableRows& t : resp[s].tables()) {
        for (size_t j = 0; j < t.rows().size() / row_bytes; ++j, ++i) {
          same = same && redis_rows[i] == t.rows().substr(j * row_bytes, row_bytes);
        }
      }
    }
    std::printf("rows: Redis and Ember return identical bytes for step 0 (%zu rows): %s\n", i,
                same ? "yes" : "NO");
    if (!same) return 1;
  }

  std::printf("\n| pipelines | system | keys/s | unique rows/s | payload MB/s | p50 ms | p99 ms | "
              "p999 ms | CPU ms/step (bench + shards) |\n| --- | --- | --- | --- | --- | --- | --- | "
              "--- | --- |\n");
  for (const int count : pipeline_counts) {
    // Merged: one thread sends each node step's single request per shard.
    const bool node = merge && count > 1;
    const int pipelines = node ? 1 : count;
    std::vector<Sample> ember_lookup, ember_stream, ember_push, redis, ember_tls;
    std::vector<std::unique_ptr<RedisConns>> conns(pipelines);
    for (int p = 0; p < pipelines && !redis_addrs.empty(); ++p) {
      conns[p] = std::make_unique<RedisConns>();
      if (!ConnectRedis(redis_addrs, conns[p].get())) return 1;
    }
    for (int round = 0; round < rounds; ++round) {
      const auto& streams =
          node ? merged[count][workload.fresh_ids ? round : 0] : sets[workload.fresh_ids ? round : 0];
      double cpu0 = ClusterCpuSeconds(**client);
      Sample lookup = RunThreads(streams, pipelines, [&](int p, size_t i) {
        std::vector<v1::LookupResponse> resp;
        return (*client)->Lookup(streams[p][i].lookup, &resp).ok();
      });
      ember_lookup.push_back(WithCpu(std::move(lookup), cpu0, ClusterCpuSeconds(**client)));
      cpu0 = ClusterCpuSeconds(**client);
      Sample streamed = RunThreads(streams, pipelines, [&](int p, size_t i) {
        std::vector<v1::ExchangeResponse> resp;
        return (*client)->Exchange(streams[p][i].exchange, &resp).ok();
      });
      ember_stream.push_back(WithCpu(std::move(streamed), cpu0, ClusterCpuSeconds(**client)));
      if (tls_client != nullptr) {
        cpu0 = ClusterCpuSeconds(*tls_client);
        Sample over_tls = RunThreads(streams, pipelines, [&](int p, size_t i) {
          std::vector<v1::LookupResponse> resp;
          return tls_client->Lookup(streams[p][i].lookup, &resp).ok();
        });
        ember_tls.push_back(WithCpu(std::move(over_tls), cpu0, ClusterCpuSeconds(*tls_client)));
      }
      if (!redis_addrs.empty()) {
        redis.push_back(RunThreads(streams, pipelines, [&](int p, size_t i) {
          return RedisMget(*conns[p], streams[p][i], row_bytes, nullptr);
        }));
      }
      cpu0 = ClusterCpuSeconds(**client);
      Sample push = RunThreads(streams, pipelines, [&](int p, size_t i) {
        std::vector<v1::PushResponse> resp;
        return (*client)->Push(streams[p][i].push, &resp).ok();
      });
      ember_push.push_back(WithCpu(std::move(push), cpu0, ClusterCpuSeconds(**client)));
      for (auto* v : {&ember_lookup, &ember_stream, &ember_push, &redis, &ember_tls}) {
        if (!v->empty() && v->back().seconds < 0) {
          std::fprintf(stderr, "a request failed\n");
          return 1;
        }
      }
    }
    auto print = [&](const char* name, const Summary& s) {
      const std::string cpu = s.cpu_ms_per_step >= 0 ? absl::StrFormat("%.3f", s.cpu_ms_per_step) : "-";
      std::printf("| %d%s | %s | %.0f | %.0f | %.1f | %.3f | %.3f | %.3f | %s |\n", count,
                  node ? " merged" : "", name,
                  s.keys_per_s, s.unique_per_s, s.mb_per_s, s.p50, s.p99, s.p999, cpu.c_str());
    };
    // In-process shards: the same calls, without a network.
    const bool local = (*client)->in_process();
    const Summary el = Summarize(ember_lookup);
    print(local ? "Ember Lookup (in-process shards)" : "Ember Lookup (gRPC)", el);
    const Summary es = Summarize(ember_stream);
    print(local ? "Ember lookup as an Exchange (in-process shards)"
                : "Ember lookup on ExchangeStream",
          es);
    if (!ember_tls.empty()) {
      const Summary ts = Summarize(ember_tls);
      print("Ember Lookup over TLS (second cluster)", ts);
      std::printf("| %d%s | Ember Lookup over TLS / plaintext | %.2fx | %.2fx | | | | | |\n", count,
                  node ? " merged" : "", ts.keys_per_s / el.keys_per_s,
                  ts.unique_per_s / el.unique_per_s);
    }
    print(local ? "Ember Push (in-process shards)" : "Ember Push (gRPC)", Summarize(ember_push));
    if (!redis.empty()) {
      const Summary rs = Summarize(redis);
      print("Redis MGET", rs);
      std::printf("| %d%s | Ember Lookup / Redis MGET | %.2fx | %.2fx | | | | | |\n", count,
                  node ? " merged" : "",
                  el.keys_per_s / rs.keys_per_s, el.unique_per_s / rs.unique_per_s);
      std::printf("| %d%s | Ember stream / Redis MGET | %.2fx | %.2fx | | | | | |\n", count,
                  node ? " merged" : "",
                  es.keys_per_s / rs.keys_per_s, es.unique_per_s / rs.unique_per_s);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace ember::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ember::DisableAbslDeadlockDetection();  // see common/abseil_mode.h
  return ember::bench::Run();
}
