// The least CPU that any implementation of Ember's data path spends on the
// bytes of the rows, per pipeline-step of the reference workload, at each
// dim side by side: the floor under issue 15's ratio bar.
//
// Per merged step of 4 pipelines (WORKLOAD.md), with each pass written as
// the plainest vectorised loop and every buffer as warm as it can be:
//   wire       the step's unique rows sent over TCP on 127.0.0.1 and
//              received, and their gradients sent back: the kernel's
//              copies that gRPC on loopback cannot avoid (both ends' CPU);
//   pool fwd   each id's row added into its example's pooled row (mean for
//              the multi-hot features), read from the received bytes;
//   pool bwd   each example's pooled gradient added into its ids' rows,
//              written where the push sends them (no zeroing: a real
//              implementation also zeroes or first-writes them);
//   Adagrad    the store's own row update (opt::UpdateRow) on a dense
//              array of the run's distinct rows (no hashing, no records).
// The gather of the rows out of the store into the answer is timed too but
// left out of the floor: a send that pointed the kernel at the records could
// skip it. Everything that does not grow with the dim (hashing, dedup,
// RPC framing, scheduling) is left out as well, so the floor's growth from
// the first dim to dim D is the least by which Ember's CPU per
// pipeline-step must grow. Given Ember's measured figure at the first dim
// (--ember_first_dim_ms, from `bench/ab_compare.sh dims`), it prints the
// least ratio to the first dim that Ember can reach at each dim.
//
//   build/bench/row_floor_bench [--dims=8,32,128,256 --steps=64 --rounds=5
//                                --ember_first_dim_ms=0.359]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_util.h"
#include "bench/reference_workload.h"
#include "client/dedup.h"
#include "common/vector_dispatch.h"
#include "kernels/optimizer_rows.h"

ABSL_FLAG(std::string, dims, "8,32,128,256", "Row widths, side by side; the first is the base.");
ABSL_FLAG(int, batch, 128, "Examples per step per pipeline.");
ABSL_FLAG(int, pipelines, 4, "Pipelines per merged step.");
ABSL_FLAG(int, steps, 64, "Merged steps per round (batches drawn up front).");
ABSL_FLAG(int, rounds, 5, "Rounds; each pass's median is printed.");
ABSL_FLAG(uint64_t, seed, 42, "Seed of the batches.");
ABSL_FLAG(double, ember_first_dim_ms, 0,
          "Ember's measured CPU ms per pipeline-step at the first dim (0: no ratio line).");

namespace ember {
namespace {

// One pipeline's feature in one merged step: each id's row among the step's
// unique rows (all features' rows back to back).
struct FeatureIds {
  const std::vector<int64_t>* offsets;
  std::vector<uint32_t> row;
  bool mean;
};

struct Step {
  std::vector<uint32_t> slot;                  // each unique row's place in the store
  std::vector<std::vector<FeatureIds>> ids;    // [pipeline][feature]
};

EMBER_VECTOR_CLONES void PoolForward(const FeatureIds& f, const float* rows, uint32_t dim,
                                     float* out) {
  const std::vector<int64_t>& off = *f.offsets;
  for (size_t e = 0; e + 1 < off.size(); ++e, out += dim) {
    std::fill(out, out + dim, 0.0f);
    for (int64_t i = off[e]; i < off[e + 1]; ++i) {
      const float* r = rows + size_t{f.row[i]} * dim;
      for (uint32_t j = 0; j < dim; ++j) out[j] += r[j];
    }
    if (f.mean && off[e + 1] > off[e]) {
      const float s = 1.0f / static_cast<float>(off[e + 1] - off[e]);
      for (uint32_t j = 0; j < dim; ++j) out[j] *= s;
    }
  }
}

EMBER_VECTOR_CLONES void PoolBackward(const FeatureIds& f, const float* d_out, uint32_t dim,
                                      float* d_rows) {
  const std::vector<int64_t>& off = *f.offsets;
  for (size_t e = 0; e + 1 < off.size(); ++e, d_out += dim) {
    const float s = f.mean && off[e + 1] > off[e] ? 1.0f / static_cast<float>(off[e + 1] - off[e])
                                                  : 1.0f;
    for (int64_t i = off[e]; i < off[e + 1]; ++i) {
      float* d = d_rows + size_t{f.row[i]} * dim;
      for (uint32_t j = 0; j < dim; ++j) d[j] += s * d_out[j];
    }
  }
}

double ProcessCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

void Die(const char* what) {
  std::perror(what);
  std::exit(1);
}

// A connected TCP pair on 127.0.0.1: [0] sends, [1] receives.
std::pair<int, int> LoopbackPair() {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
      listen(listener, 1) != 0 || getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    Die("listen on 127.0.0.1");
  }
  const int out = socket(AF_INET, SOCK_STREAM, 0);
  if (out < 0 || connect(out, reinterpret_cast<sockaddr*>(&a), len) != 0) Die("connect");
  const int in = accept(listener, nullptr, nullptr);
  if (in < 0) Die("accept");
  close(listener);
  const int one = 1;
  setsockopt(out, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return {out, in};
}

// Sends `sizes[i]` bytes of `from` per step and receives them into `to` on a
// second thread; returns the process's CPU seconds for both ends.
double SendOverLoopback(std::pair<int, int> fds, const std::vector<size_t>& sizes, const char* from,
                        char* to) {
  const double t0 = ProcessCpuSeconds();
  std::thread reader([&] {
    for (size_t n : sizes) {
      for (size_t got = 0; got < n;) {
        const ssize_t r = recv(fds.second, to + got, n - got, 0);
        if (r <= 0) Die("recv");
        got += static_cast<size_t>(r);
      }
    }
  });
  for (size_t n : sizes) {
    for (size_t sent = 0; sent < n;) {
      const ssize_t r = send(fds.first, from + sent, n - sent, 0);
      if (r < 0 && errno != EINTR) Die("send");
      if (r > 0) sent += static_cast<size_t>(r);
    }
  }
  reader.join();
  return ProcessCpuSeconds() - t0;
}

struct Times {
  std::vector<double> gather, wire, forward, backward, adagrad;
};

int Main() {
  const auto features = bench::ReferenceFeatures();
  const int pipelines = absl::GetFlag(FLAGS_pipelines);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int batch = absl::GetFlag(FLAGS_batch);
  const std::vector<std::vector<Batch>> batches =
      bench::DrawPipelineBatches(features, batch, absl::GetFlag(FLAGS_seed), pipelines, steps);
  // Every distinct key of the run gets a store slot, in random order.
  absl::flat_hash_map<uint64_t, uint32_t> slot_of;
  std::vector<Step> ring(steps);
  size_t ids = 0, max_unique = 0;
  KeyDeduplicator merge;
  for (int s = 0; s < steps; ++s) {
    Step& step = ring[s];
    step.ids.assign(pipelines, std::vector<FeatureIds>(features.size()));
    for (size_t f = 0; f < features.size(); ++f) {
      merge.Clear();
      const uint32_t base = static_cast<uint32_t>(step.slot.size());
      for (int p = 0; p < pipelines; ++p) {
        const FeatureBatch& fb = batches[p][s].features[f];
        FeatureIds& x = step.ids[p][f];
        x.offsets = &fb.offsets;
        x.mean = features[f].max_ids > 1;
        merge.Add(fb.keys, &x.row);
        for (uint32_t& r : x.row) r += base;
        ids += fb.keys.size();
      }
      for (uint64_t k : merge.unique()) {
        step.slot.push_back(slot_of.try_emplace(k, static_cast<uint32_t>(slot_of.size())).first->second);
      }
    }
    max_unique = std::max(max_unique, step.slot.size());
  }
  std::mt19937_64 rng(7);
  std::vector<uint32_t> shuffled(slot_of.size());
  std::iota(shuffled.begin(), shuffled.end(), 0);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  size_t unique_rows = 0;
  for (Step& step : ring) {
    for (uint32_t& x : step.slot) x = shuffled[x];
    unique_rows += step.slot.size();
  }
  const double pipeline_steps = double(steps) * pipelines;
  std::printf("row_floor_bench: %d pipelines x %zu features x batch %d, %d merged steps: %.0f ids and "
              "%.0f unique rows (merged) per pipeline-step, %zu distinct rows in the store; %s "
              "clone, median of %d rounds\n",
              pipelines, features.size(), batch, steps, double(ids) / pipeline_steps,
              double(unique_rows) / pipeline_steps, slot_of.size(), VectorIsa(),
              absl::GetFlag(FLAGS_rounds));
  std::printf("CPU us per pipeline-step:\n| dim | gather (not in floor) | wire | pool fwd | pool bwd "
              "| Adagrad | floor | floor - first dim's |%s\n| --- | --- | --- | --- | --- | --- | --- | --- "
              "|%s\n",
              absl::GetFlag(FLAGS_ember_first_dim_ms) > 0 ? " Ember at least, vs first dim |" : "",
              absl::GetFlag(FLAGS_ember_first_dim_ms) > 0 ? " --- |" : "");

  OptimizerConfig adagrad;
  adagrad.kind = OptimizerKind::kAdagrad;
  const std::pair<int, int> fds = LoopbackPair();
  double first_floor = -1;
  for (double d : bench::ParseList(absl::GetFlag(FLAGS_dims))) {
    const uint32_t dim = static_cast<uint32_t>(d);
    const size_t row_bytes = size_t{dim} * sizeof(float);
    // The store: per slot a row then its accumulator, as the plain array of
    // store_bench holds them.
    std::vector<float> store(slot_of.size() * 2 * dim);
    std::uniform_real_distribution<float> value(-0.05f, 0.05f);
    for (size_t i = 0; i < slot_of.size(); ++i) {
      for (uint32_t j = 0; j < dim; ++j) {
        store[i * 2 * dim + j] = value(rng);
        store[i * 2 * dim + dim + j] = 0.1f;
      }
    }
    std::vector<float> answer(max_unique * dim), received(max_unique * dim),
        grads(max_unique * dim), pushed(max_unique * dim);
    std::vector<std::vector<float>> pooled(
        pipelines, std::vector<float>(features.size() * size_t(batch) * dim));
    std::vector<size_t> sizes;
    for (const Step& step : ring) sizes.push_back(step.slot.size() * row_bytes);

    Times t;
    double checksum = 0;
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      double t0 = ProcessCpuSeconds();
      for (const Step& step : ring) {
        for (size_t u = 0; u < step.slot.size(); ++u) {
          std::memcpy(&answer[u * dim], &store[size_t{step.slot[u]} * 2 * dim], row_bytes);
        }
        checksum += answer[0];
      }
      t.gather.push_back(ProcessCpuSeconds() - t0);
      // Both directions carry one row per unique key.
      t.wire.push_back(
          SendOverLoopback(fds, sizes, reinterpret_cast<const char*>(answer.data()),
                           reinterpret_cast<char*>(received.data())) +
          SendOverLoopback(fds, sizes, reinterpret_cast<const char*>(grads.data()),
                           reinterpret_cast<char*>(pushed.data())));
      t0 = ProcessCpuSeconds();
      for (const Step& step : ring) {
        for (int p = 0; p < pipelines; ++p) {
          for (size_t f = 0; f < features.size(); ++f) {
            PoolForward(step.ids[p][f], received.data(), dim,
                        pooled[p].data() + f * size_t(batch) * dim);
          }
        }
        checksum += pooled[0][0];
      }
      t.forward.push_back(ProcessCpuSeconds() - t0);
      t0 = ProcessCpuSeconds();
      for (const Step& step : ring) {
        for (int p = 0; p < pipelines; ++p) {
          for (size_t f = 0; f < features.size(); ++f) {
            PoolBackward(step.ids[p][f], pooled[p].data() + f * size_t(batch) * dim, dim,
                         grads.data());
          }
        }
        checksum += grads[0];
      }
      t.backward.push_back(ProcessCpuSeconds() - t0);
      // Small gradients, so that rows and accumulators stay ordinary floats
      // round after round.
      for (float& g : pushed) g = 1e-3f;
      t0 = ProcessCpuSeconds();
      for (const Step& step : ring) {
        for (size_t u = 0; u < step.slot.size(); ++u) {
          float* w = &store[size_t{step.slot[u]} * 2 * dim];
          opt::UpdateRow(adagrad, 0.0f, &pushed[u * dim], w, w + dim, dim);
        }
      }
      t.adagrad.push_back(ProcessCpuSeconds() - t0);
      std::fill(grads.begin(), grads.end(), 0.0f);
    }
    const double us = 1e6 / pipeline_steps;
    const double gather = bench::Median(t.gather) * us, wire = bench::Median(t.wire) * us,
                 forward = bench::Median(t.forward) * us, backward = bench::Median(t.backward) * us,
                 apply = bench::Median(t.adagrad) * us;
    const double floor = wire + forward + backward + apply;
    if (first_floor < 0) first_floor = floor;
    std::printf("| %u | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |", dim, gather, wire, forward,
                backward, apply, floor, floor - first_floor);
    if (const double ember = absl::GetFlag(FLAGS_ember_first_dim_ms); ember > 0) {
      std::printf(" %.3f ms, %.2fx |", ember + (floor - first_floor) / 1e3,
                  1 + (floor - first_floor) / 1e3 / ember);
    }
    std::printf("\n");
    if (checksum == 12345.678) std::printf("(checksum)\n");  // keeps the passes' results live
  }
  close(fds.first);
  close(fds.second);
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ember::Main();
}
