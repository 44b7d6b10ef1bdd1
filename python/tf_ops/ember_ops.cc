// TensorFlow ops over Ember's C ABI (ember/ember_c.h), loaded by ember.tf:
//
//   EmberPrefetch(step, offsets[N], keys[N], weights[W]) -> ticket
//       stages a batch (in a tf.data map, ahead of training) and returns
//       its ticket; its rows are fetched as soon as training's claims and
//       pushes reach it and the prefetch depth allows (ember_pipeline_stage:
//       an element drawn and never trained, e.g. by Keras before fit or by
//       an iterator dropped at an epoch's end, costs nothing). `step` is
//       ignored (kept for graphs that pass one);
//   EmberLookup(ticket, anchor, order) -> pooled[N]
//       claims the ticket (its step) and waits for the step's rows:
//       [batch, dim_f] float32 per feature;
//   EmberPush(ticket, grads[N], order) -> anchor_grad
//       pushes d(pooled); the gradient of EmberLookup (python/ember/tf.py);
//   EmberLookupPacked(step, anchor, order) -> pooled,
//   EmberPushPacked(step, grad, order)
//       the same with every feature side by side in one [batch, sum of dims]
//       tensor (TorchRec's KeyedTensor layout): one output and one gradient
//       instead of N, so a model that concatenates the features pays no
//       concat and no per-feature slices in its backward.
//
// `order` is a resource the kernels never read: the layer passes its anchor
// variable's handle (under tf.distribute, the replica's own copy). A
// tf.function chains every stateful op that has no resource input in
// program order, which under MirroredStrategy would make replica 1's lookup
// wait for replica 0's, while the merged pipelines need all replicas'
// lookups in flight at once; with a resource input, a lookup and push are
// ordered only after the ops on their own replica's anchor.
//
// The pipeline is an attribute (the address of an ember_pipeline made by the
// Python package in this process). Lookup may block on the network, so it is
// an asynchronous kernel that waits on a thread of its own: no TF inter-op
// thread waits. Prefetch blocks only the input pipeline's thread.
//
// This library is compiled against TensorFlow's headers (its Abseil and
// protobuf) and must not link Debian's: it reaches libember_c.so, which
// ember._ember has already loaded, through dlopen/dlsym, so libember_c.so
// keeps its own symbol scope. It is built with the package when TensorFlow
// is there, or by ember/_tf_ops.py for the TensorFlow of the process.
#include <dlfcn.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ember/ember_c.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace ember_tf {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// The C ABI, resolved once from the libember_c.so beside this library.
struct EmberApi {
  decltype(&ember_last_error) last_error = nullptr;
  decltype(&ember_pipeline_prefetch_blocking) prefetch_blocking = nullptr;
  decltype(&ember_pipeline_stage) stage = nullptr;
  decltype(&ember_pipeline_claim) claim = nullptr;
  decltype(&ember_pipeline_ticket_step) ticket_step = nullptr;
  decltype(&ember_pipeline_wait) wait = nullptr;
  decltype(&ember_pipeline_push) push = nullptr;
  decltype(&ember_pipeline_wait_packed) wait_packed = nullptr;
  decltype(&ember_pipeline_push_packed) push_packed = nullptr;
  std::string error;

  static const EmberApi& Get() {
    static const EmberApi api = Load();
    return api;
  }

 private:
  static EmberApi Load() {
    EmberApi api;
    // The libember_c.so that ember._ember loaded (by its soname); else the
    // one beside this library.
    std::string path = "libember_c.so";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) {
      Dl_info info;
      if (dladdr(reinterpret_cast<void*>(&EmberApi::Get), &info) == 0 ||
          info.dli_fname == nullptr) {
        api.error = "cannot locate the ember op library on disk";
        return api;
      }
      path = info.dli_fname;
      path = path.substr(0, path.rfind('/') + 1) + "libember_c.so";
      lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    }
    if (lib == nullptr) {
      api.error = std::string("cannot load ") + path + ": " + dlerror();
      return api;
    }
    api.last_error = reinterpret_cast<decltype(api.last_error)>(dlsym(lib, "ember_last_error"));
    api.prefetch_blocking =
        reinterpret_cast<decltype(api.prefetch_blocking)>(dlsym(lib, "ember_pipeline_prefetch_blocking"));
    api.stage = reinterpret_cast<decltype(api.stage)>(dlsym(lib, "ember_pipeline_stage"));
    api.claim = reinterpret_cast<decltype(api.claim)>(dlsym(lib, "ember_pipeline_claim"));
    api.ticket_step =
        reinterpret_cast<decltype(api.ticket_step)>(dlsym(lib, "ember_pipeline_ticket_step"));
    api.wait = reinterpret_cast<decltype(api.wait)>(dlsym(lib, "ember_pipeline_wait"));
    api.push = reinterpret_cast<decltype(api.push)>(dlsym(lib, "ember_pipeline_push"));
    api.wait_packed =
        reinterpret_cast<decltype(api.wait_packed)>(dlsym(lib, "ember_pipeline_wait_packed"));
    api.push_packed =
        reinterpret_cast<decltype(api.push_packed)>(dlsym(lib, "ember_pipeline_push_packed"));
    if (!api.last_error || !api.prefetch_blocking || !api.stage || !api.claim || !api.ticket_step || !api.wait || !api.push || !api.wait_packed ||
        !api.push_packed) {
      api.error = path + " lacks a function this op library needs (a different build?)";
    }
    return api;
  }
};

absl::Status FromEmber(int code, const char* what) {
  const EmberApi& api = EmberApi::Get();
  return absl::Status(static_cast<absl::StatusCode>(code), std::string(what) + ": " + api.last_error());
}

absl::Status PipelineAttr(OpKernelConstruction* ctx, ember_pipeline** pipeline) {
  int64_t handle = 0;
  TF_RETURN_IF_ERROR(ctx->GetAttr("pipeline", &handle));
  if (handle == 0) return absl::InvalidArgumentError("attr 'pipeline': expected a pipeline, received 0");
  const EmberApi& api = EmberApi::Get();
  if (!api.error.empty()) return absl::InternalError(api.error);
  *pipeline = reinterpret_cast<ember_pipeline*>(static_cast<uintptr_t>(handle));
  return absl::OkStatus();
}

// One thread that runs a kernel's blocking calls in order.
class Worker {
 public:
  Worker() : thread_([this] { Run(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Schedule(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_all();
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

absl::Status ScalarStep(OpKernelContext* ctx, int64_t* step) {
  const Tensor& t = ctx->input(0);
  if (!tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
    return absl::InvalidArgumentError("input 'step': expected a scalar, received shape " +
                                      t.shape().DebugString());
  }
  *step = t.scalar<int64_t>()();
  return absl::OkStatus();
}

// Synchronous and quick: it copies the batch into the pipeline's staging
// and returns, in the tf.data map of the input pipeline.
class PrefetchOp : public OpKernel {
 public:
  explicit PrefetchOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, PipelineAttr(ctx, &pipeline_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("W", &w_));
    OP_REQUIRES(ctx, w_ == 0 || w_ == n_,
                absl::InvalidArgumentError("attr W: expected 0 or N weights tensors"));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<ember_feature_batch> features(n_);
    for (int f = 0; f < n_; ++f) {
      const Tensor& offsets = ctx->input(1 + f);
      const Tensor& keys = ctx->input(1 + n_ + f);
      features[f].offsets = offsets.flat<int64_t>().data();
      features[f].num_offsets = offsets.NumElements();
      // int64 ids, read as the same 8 bytes of uint64 (every uint64 is a key).
      features[f].keys = reinterpret_cast<const uint64_t*>(keys.flat<int64_t>().data());
      features[f].num_keys = keys.NumElements();
      if (w_ > 0) {
        const Tensor& weights = ctx->input(1 + 2 * n_ + f);
        features[f].weights = weights.flat<float>().data();
        features[f].num_weights = weights.NumElements();
      }
    }
    int64_t ticket = 0;
    const int code = EmberApi::Get().stage(pipeline_, features.data(), features.size(), &ticket);
    OP_REQUIRES(ctx, code == 0, FromEmber(code, "EmberPrefetch"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = ticket;
  }

 private:
  ember_pipeline* pipeline_ = nullptr;
  int n_ = 0;
  int w_ = 0;
};

// The step of a ticket (ScalarStep's input), claiming it if need be.
absl::Status Claim(OpKernelContext* ctx, ember_pipeline* pipeline, float timeout, int64_t* step,
                   const char* what) {
  int64_t ticket = 0;
  TF_RETURN_IF_ERROR(ScalarStep(ctx, &ticket));
  const int code = EmberApi::Get().claim(pipeline, ticket, timeout, step);
  return code == 0 ? absl::OkStatus() : FromEmber(code, what);
}

// EmberLookup and EmberLookupPacked.
class LookupOp : public AsyncOpKernel {
 public:
  explicit LookupOp(OpKernelConstruction* ctx)
      : AsyncOpKernel(ctx), packed_(ctx->def().op() == "EmberLookupPacked") {
    OP_REQUIRES_OK(ctx, PipelineAttr(ctx, &pipeline_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_seconds", &timeout_));
    if (packed_) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("total_dim", &total_dim_));
      return;
    }
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dims", &dims_));
    int n = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n));
    OP_REQUIRES(ctx, n == static_cast<int>(dims_.size()),
                absl::InvalidArgumentError("attr N: expected len(dims)"));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    worker_.Schedule([this, ctx, done = std::move(done)] {
      ctx->SetStatus(Lookup(ctx));
      done();
    });
  }

 private:
  absl::Status Lookup(OpKernelContext* ctx) {
    const EmberApi& api = EmberApi::Get();
    int64_t step = 0;
    TF_RETURN_IF_ERROR(Claim(ctx, pipeline_, timeout_, &step, packed_ ? "EmberLookupPacked" : "EmberLookup"));
    int64_t batch = 0;
    if (packed_) {
      int code = api.wait_packed(pipeline_, step, &batch, nullptr, 0);
      if (code != 0) return FromEmber(code, "EmberLookupPacked");
      Tensor* t = nullptr;
      auto s = ctx->allocate_output(0, TensorShape({batch, total_dim_}), &t);
      if (!s.ok()) return s;
      code = api.wait_packed(pipeline_, step, &batch, t->flat<float>().data(),
                             static_cast<size_t>(t->NumElements()));
      return code == 0 ? absl::OkStatus() : FromEmber(code, "EmberLookupPacked");
    }
    int code = api.wait(pipeline_, step, &batch, nullptr, nullptr, 0);
    if (code != 0) return FromEmber(code, "EmberLookup");
    std::vector<float*> out(dims_.size());
    std::vector<size_t> lens(dims_.size());
    for (size_t f = 0; f < dims_.size(); ++f) {
      Tensor* t = nullptr;
      auto s = ctx->allocate_output(static_cast<int>(f), TensorShape({batch, dims_[f]}), &t);
      if (!s.ok()) return s;
      out[f] = t->flat<float>().data();
      lens[f] = static_cast<size_t>(t->NumElements());
    }
    code = api.wait(pipeline_, step, &batch, out.data(), lens.data(), out.size());
    return code == 0 ? absl::OkStatus() : FromEmber(code, "EmberLookup");
  }

  const bool packed_;
  ember_pipeline* pipeline_ = nullptr;
  std::vector<int64_t> dims_;
  int64_t total_dim_ = 0;
  float timeout_ = 600;
  Worker worker_;
};

// Push copies the gradients and returns at once: an ordinary kernel.
// EmberPush and EmberPushPacked.
class PushOp : public OpKernel {
 public:
  explicit PushOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), packed_(ctx->def().op() == "EmberPushPacked") {
    OP_REQUIRES_OK(ctx, PipelineAttr(ctx, &pipeline_));
    if (!packed_) OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t step = 0;
    {
      // The lookup claimed the ticket: its step.
      int64_t ticket = 0;
      OP_REQUIRES_OK(ctx, ScalarStep(ctx, &ticket));
      const int code = EmberApi::Get().ticket_step(pipeline_, ticket, &step);
      OP_REQUIRES(ctx, code == 0, FromEmber(code, packed_ ? "EmberPushPacked" : "EmberPush"));
    }
    Tensor* out = nullptr;
    if (packed_) {
      const Tensor& g = ctx->input(1);
      const int code = EmberApi::Get().push_packed(pipeline_, step, g.flat<float>().data(),
                                                   static_cast<size_t>(g.NumElements()));
      OP_REQUIRES(ctx, code == 0, FromEmber(code, "EmberPushPacked"));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({0}), &out));
      return;
    }
    std::vector<const float*> grads(n_);
    std::vector<size_t> lens(n_);
    for (int f = 0; f < n_; ++f) {
      const Tensor& g = ctx->input(1 + f);
      grads[f] = g.flat<float>().data();
      lens[f] = static_cast<size_t>(g.NumElements());
    }
    const int code = EmberApi::Get().push(pipeline_, step, grads.data(), lens.data(), grads.size());
    OP_REQUIRES(ctx, code == 0, FromEmber(code, "EmberPush"));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({0}), &out));
  }

 private:
  const bool packed_;
  ember_pipeline* pipeline_ = nullptr;
  int n_ = 0;
};

}  // namespace ember_tf

REGISTER_OP("EmberPrefetch")
    .Input("step: int64")
    .Input("offsets: N * int64")
    .Input("keys: N * int64")
    .Input("weights: W * float")
    .Output("ticket: int64")
    .Attr("pipeline: int")
    .Attr("N: int >= 1")
    .Attr("W: int >= 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("EmberLookup")
    .Input("step: int64")
    .Input("anchor: float")
    .Input("order: resource")
    .Output("pooled: N * float")
    .Attr("pipeline: int")
    .Attr("timeout_seconds: float = 600")
    .Attr("dims: list(int)")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      std::vector<int64_t> dims;
      TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
      for (size_t f = 0; f < dims.size(); ++f) {
        c->set_output(static_cast<int>(f), c->Matrix(tensorflow::shape_inference::InferenceContext::kUnknownDim, dims[f]));
      }
      return absl::OkStatus();
    });

REGISTER_OP("EmberPush")
    .Input("step: int64")
    .Input("grads: N * float")
    .Input("order: resource")
    .Output("anchor_grad: float")
    .Attr("pipeline: int")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(0));
      return absl::OkStatus();
    });

REGISTER_OP("EmberLookupPacked")
    .Input("step: int64")
    .Input("anchor: float")
    .Input("order: resource")
    .Output("pooled: float")
    .Attr("pipeline: int")
    .Attr("timeout_seconds: float = 600")
    .Attr("total_dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int64_t total_dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("total_dim", &total_dim));
      c->set_output(
          0, c->Matrix(tensorflow::shape_inference::InferenceContext::kUnknownDim, total_dim));
      return absl::OkStatus();
    });

REGISTER_OP("EmberPushPacked")
    .Input("step: int64")
    .Input("grad: float")
    .Input("order: resource")
    .Output("anchor_grad: float")
    .Attr("pipeline: int")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(0));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("EmberPrefetch").Device(tensorflow::DEVICE_CPU), ember_tf::PrefetchOp);
REGISTER_KERNEL_BUILDER(Name("EmberLookup").Device(tensorflow::DEVICE_CPU), ember_tf::LookupOp);
REGISTER_KERNEL_BUILDER(Name("EmberPush").Device(tensorflow::DEVICE_CPU), ember_tf::PushOp);
REGISTER_KERNEL_BUILDER(Name("EmberLookupPacked").Device(tensorflow::DEVICE_CPU),
                        ember_tf::LookupOp);
REGISTER_KERNEL_BUILDER(Name("EmberPushPacked").Device(tensorflow::DEVICE_CPU), ember_tf::PushOp);
// On a GPU replica the ops sit on the replica's device (a resource input is
// placed with its resource) and work in host memory: TF copies the pooled
// rows to the GPU after the lookup (one host-to-device copy per output, on
// its copy stream) and the gradients back before the push. Compiled and
// registered here; not yet run on a GPU.
REGISTER_KERNEL_BUILDER(Name("EmberLookup")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("step")
                            .HostMemory("anchor")
                            .HostMemory("pooled"),
                        ember_tf::LookupOp);
REGISTER_KERNEL_BUILDER(Name("EmberPush")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("step")
                            .HostMemory("grads")
                            .HostMemory("anchor_grad"),
                        ember_tf::PushOp);
REGISTER_KERNEL_BUILDER(Name("EmberLookupPacked")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("step")
                            .HostMemory("anchor")
                            .HostMemory("pooled"),
                        ember_tf::LookupOp);
REGISTER_KERNEL_BUILDER(Name("EmberPushPacked")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("step")
                            .HostMemory("grad")
                            .HostMemory("anchor_grad"),
                        ember_tf::PushOp);
