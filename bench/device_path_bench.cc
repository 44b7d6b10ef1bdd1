// The client's host-to-device path per step (WORKLOAD.md item 5), without
// the network: the reference workload's 17 features, one table each, rows
// already fetched. Two ways to get pooled rows onto the GPU and gradients
// back, side by side, alternating steps:
//   device path  what StepPipeline does with PipelineOptions::device: one
//                pinned upload per step on a side stream, pooling and its
//                backward as kernels, gradients copied back on the side stream;
//   host path    pooling on the CPU, then one copy per feature to the GPU
//                and one per feature back for the gradients (the motivating
//                trainer's pattern).
// Prints, per step: trainer-thread time (what the training loop waits for),
// total time until the gradients are on the host, copies and bytes moved.
// Needs a GPU; run by scripts/device_check.sh.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_util.h"
#include "bench/reference_workload.h"
#include "client/dedup.h"
#include "client/device_step.h"
#include "client/pooling.h"

ABSL_FLAG(int, batch, 128, "Examples per step.");
ABSL_FLAG(int, dim, 8, "Row width of every table.");
ABSL_FLAG(int, steps, 200, "Measured steps per path.");
ABSL_FLAG(uint64_t, seed, 42, "Seed of the batches.");

namespace ember {
namespace {

using Clock = std::chrono::steady_clock;
double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

void Die(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// One prepared step: the batch, its dedup and fetched rows.
struct PreparedStep {
  Batch batch;
  std::vector<size_t> unique;
  std::vector<std::vector<uint32_t>> inverse;
  std::vector<std::vector<float>> rows;  // per table
};

int Main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "device_path_bench: no CUDA device here\n");
    return 2;
  }
  const int batch = absl::GetFlag(FLAGS_batch);
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  const int steps = absl::GetFlag(FLAGS_steps);
  const auto features = bench::ReferenceFeatures();
  const size_t nf = features.size();
  bench::BatchGenerator gen(features, batch, absl::GetFlag(FLAGS_seed));
  std::mt19937 rng(7);
  std::vector<PreparedStep> prepared(8);
  for (PreparedStep& p : prepared) {
    p.batch = gen.Next();
    p.unique.resize(nf);
    p.inverse.resize(nf);
    p.rows.resize(nf);
    for (size_t f = 0; f < nf; ++f) {
      KeyDeduplicator d;
      d.Add(p.batch.features[f].keys, &p.inverse[f]);
      p.unique[f] = d.unique().size();
      p.rows[f].resize(p.unique[f] * dim);
      for (float& v : p.rows[f]) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    }
  }
  DeviceStepShape shape;
  for (size_t f = 0; f < nf; ++f) {
    shape.table_dim.push_back(dim);
    shape.feature_table.push_back(static_cast<int>(f));
    shape.combiner.push_back(f < 12 ? Combiner::kSum : Combiner::kMean);
  }
  auto ctx = NewDeviceContext(0, shape);
  Die(ctx.status(), "device context");
  auto dstep = (*ctx)->NewStep();
  Die(dstep.status(), "device step");
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  // The trainer's gradients: device buffers per feature (d_pooled = pooled
  // here; their values do not matter for the timing).
  std::vector<float*> d_feature(nf);
  for (auto& p : d_feature) cudaMalloc(&p, batch * dim * 4);
  std::vector<std::vector<float>> host_pooled(nf, std::vector<float>(batch * dim));
  std::vector<std::vector<float>> host_grads(nf);
  float* pinned_dpooled = nullptr;
  cudaMallocHost(&pinned_dpooled, nf * batch * dim * 4);

  std::vector<double> dev_trainer, dev_total, host_trainer, host_total;
  double dev_bytes = 0, host_bytes = 0;
  for (int s = 0; s < 2 * steps; ++s) {
    PreparedStep& p = prepared[(s / 2) % prepared.size()];
    if (s % 2 == 0) {
      // Device path. Network thread part: stage and upload.
      const auto t0 = Clock::now();
      Die((*dstep)->Prepare(p.batch, p.unique, p.inverse), "prepare");
      for (size_t f = 0; f < nf; ++f) {
        std::memcpy((*dstep)->StagedRows(f), p.rows[f].data(), p.rows[f].size() * 4);
      }
      dev_bytes += (*dstep)->upload_bytes() + (*dstep)->download_bytes();
      Die((*dstep)->Upload(), "upload");
      // Trainer thread part: WaitOnDevice's launches, PushFromDevice's.
      const auto t1 = Clock::now();
      auto pooled = (*dstep)->Forward(stream);
      Die(pooled.status(), "forward");
      std::vector<const float*> d_pooled(pooled->begin(), pooled->end());
      Die((*dstep)->Backward(d_pooled, stream), "backward");
      const auto t2 = Clock::now();
      auto grads = (*dstep)->Gradients();  // network thread: waits for the copy
      Die(grads.status(), "gradients");
      cudaStreamSynchronize(stream);
      const auto t3 = Clock::now();
      dev_trainer.push_back(Us(t1, t2));
      dev_total.push_back(Us(t0, t3));
    } else {
      // Host path: pool on the CPU, one copy per feature each way.
      const auto t0 = Clock::now();
      for (size_t f = 0; f < nf; ++f) {
        const FeatureBatch& fb = p.batch.features[f];
        PoolForward(fb.offsets, p.inverse[f], fb.weights, shape.combiner[f], p.rows[f].data(),
                    dim, host_pooled[f].data());
        cudaMemcpyAsync(d_feature[f], host_pooled[f].data(), batch * dim * 4,
                        cudaMemcpyHostToDevice, stream);
      }
      for (size_t f = 0; f < nf; ++f) {
        cudaMemcpyAsync(pinned_dpooled + f * batch * dim, d_feature[f], batch * dim * 4,
                        cudaMemcpyDeviceToHost, stream);
      }
      cudaStreamSynchronize(stream);  // the trainer needs d_pooled on the host to push
      for (size_t f = 0; f < nf; ++f) {
        const FeatureBatch& fb = p.batch.features[f];
        host_grads[f].assign(p.unique[f] * dim, 0.0f);
        PoolBackward(fb.offsets, p.inverse[f], fb.weights, shape.combiner[f],
                     pinned_dpooled + f * batch * dim, dim, host_grads[f].data());
      }
      const auto t1 = Clock::now();
      host_trainer.push_back(Us(t0, t1));
      host_total.push_back(Us(t0, t1));
      host_bytes += 2.0 * nf * batch * dim * 4;
    }
  }
  std::printf("device path vs host path, %zu features, batch %d, dim %u, %d steps each "
              "(alternating), seed %llu\n",
              nf, batch, dim, steps, static_cast<unsigned long long>(absl::GetFlag(FLAGS_seed)));
  std::printf("| path | trainer-thread us/step (median) | until gradients on host us/step | "
              "copies/step | MB moved/step |\n|---|---|---|---|---|\n");
  std::printf("| device (1 upload, kernels) | %.1f | %.1f | 2 | %.3f |\n",
              bench::Median(dev_trainer), bench::Median(dev_total), dev_bytes / steps / 1e6);
  std::printf("| host (CPU pooling, per-feature copies) | %.1f | %.1f | %zu | %.3f |\n",
              bench::Median(host_trainer), bench::Median(host_total), 2 * nf,
              host_bytes / steps / 1e6);
  std::printf("trainer-thread ratio host/device: %.2fx\n",
              bench::Median(host_trainer) / bench::Median(dev_trainer));
  cudaFreeHost(pinned_dpooled);
  for (auto p : d_feature) cudaFree(p);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ember::Main();
}
