#include "server/async_service.h"

#include <atomic>
#include <optional>
#include <string>

#include <grpcpp/alarm.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/async_stream.h>
#include <grpcpp/support/async_unary_call.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/shard_health.h"
#include "spdlog/spdlog.h"

namespace ember {
namespace {

using Tag = AsyncServices::Tag;

// Keeps the reflection plugin (a sync-API service, whose pollers would take
// turns with the completion threads) out of one server.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::erase_if(*plugins, [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
      return p->name().find("reflection") != std::string::npos;
    });
  }
};

// How one unary method is served: which generated Request method asks for
// its calls, the sync handler that answers them, and whether a call may
// block (and so runs on the pool).
template <typename Service, typename Request, typename Response>
struct UnaryMethod {
  using RequestFn = void (Service::*)(grpc::ServerContext*, Request*,
                                      grpc::ServerAsyncResponseWriter<Response>*,
                                      grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*);
  using Handler = std::function<grpc::Status(grpc::ServerContext*, const Request*, Response*)>;
  Service* service;
  RequestFn request;
  Handler handle;
  std::function<bool(const Request&)> may_block;  // null: never
  AsyncServices::Offload* offload;
};

// What the call types share: their state, and work done on the pool.
//
// Every gRPC operation of a call starts on its completion queue's thread;
// the pool only computes an answer, then hands the call back to that thread
// through an alarm. The state is stored (release) before each operation
// starts and loaded (acquire) when it comes back, so the thread that takes
// the next step sees everything written before, through our own atomics
// rather than gRPC's internal locks (which ThreadSanitizer cannot see).
template <typename State>
class Call : public Tag {
 public:
  ~Call() override {
    if (offloaded_ != nullptr) offloaded_->fetch_sub(1, std::memory_order_release);
  }

 protected:
  explicit Call(State first) : state_(first) {}
  State state() const { return state_.load(std::memory_order_acquire); }
  // Call right before starting the operation whose completion is `this`.
  void Next(State s) { state_.store(s, std::memory_order_release); }
  // Runs `work` on the pool; the call then proceeds in state `resume` on
  // `cq`'s thread. Counted in `offload` until it is deleted.
  void OnPoolThenResume(AsyncServices::Offload* offload, grpc::ServerCompletionQueue* cq,
                        State resume, std::function<void()> work) {
    offloaded_ = &offload->calls;
    offloaded_->fetch_add(1, std::memory_order_relaxed);
    offload->pool.Post([this, cq, resume, work = std::move(work)] {
      work();
      alarm_.emplace();
      Next(resume);
      alarm_->Set(cq, gpr_now(GPR_CLOCK_MONOTONIC), this);
    });
  }

 private:
  std::atomic<State> state_;
  std::optional<grpc::Alarm> alarm_;  // only for work on the pool
  std::atomic<int>* offloaded_ = nullptr;
};

enum class UnaryState { kAsked, kAnswered, kFinishing };

// One unary call, from asking for it to its answer being sent. Deletes
// itself when done.
template <typename Service, typename Request, typename Response>
class UnaryCall final : public Call<UnaryState> {
 public:
  using Method = UnaryMethod<Service, Request, Response>;

  // Asks gRPC for the method's next call on `cq`.
  UnaryCall(const Method* method, grpc::ServerCompletionQueue* cq)
      : Call(UnaryState::kAsked), method_(method), cq_(cq), responder_(&context_) {
    (method->service->*method->request)(&context_, &request_, &responder_, cq, cq, this);
  }

  void Proceed(bool ok) override {
    switch (state()) {
      case UnaryState::kAsked:
        if (!ok) {  // the server is shutting down
          delete this;
          return;
        }
        new UnaryCall(method_, cq_);  // the next call of this method
        if (method_->may_block && method_->may_block(request_)) {
          OnPoolThenResume(method_->offload, cq_, UnaryState::kAnswered, [this] { Answer(); });
        } else {
          Answer();
          Finish();
        }
        return;
      case UnaryState::kAnswered:
        return Finish();
      case UnaryState::kFinishing:
        delete this;
        return;
    }
  }

 private:
  void Answer() { status_ = method_->handle(&context_, &request_, &response_); }
  void Finish() {
    Next(UnaryState::kFinishing);
    responder_.Finish(response_, status_, this);
  }

  const Method* method_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext context_;
  Request request_;
  Response response_;
  grpc::Status status_;
  grpc::ServerAsyncResponseWriter<Response> responder_;
};

enum class StreamState { kAsked, kReading, kAnswered, kWriting, kFinishing };

// One exchange stream: read a message, apply its push, answer its lookup
// (on the pool if it may wait for the SSP clock), write the answer, read the
// next; one operation outstanding at a time. Deletes itself when done.
class StreamCall final : public Call<StreamState> {
 public:
  StreamCall(AsyncServices::Embedding* service, EmbeddingServiceImpl* impl,
             AsyncServices::Offload* offload, grpc::ServerCompletionQueue* cq)
      : Call(StreamState::kAsked), service_(service), impl_(impl), offload_(offload), cq_(cq),
        stream_(&context_) {
    service->RequestExchangeStream(&context_, &stream_, cq, cq, this);
  }

  void Proceed(bool ok) override {
    switch (state()) {
      case StreamState::kAsked:
        if (!ok) {  // the server is shutting down
          delete this;
          return;
        }
        new StreamCall(service_, impl_, offload_, cq_);
        served_.emplace(*impl_, &context_, "ExchangeStream");
        if (grpc::Status s = served_->Open(); !s.ok()) return Finish(s);
        return Read();
      case StreamState::kReading:
        if (!ok) return Finish(grpc::Status::OK);  // the client closed its side, or went away
        if (grpc::Status s = served_->Receive(&in_); !s.ok()) return Finish(s);
        if (grpc::Status s = served_->Push(); !s.ok()) return Finish(s);
        if (served_->MayWait()) {
          OnPoolThenResume(offload_, cq_, StreamState::kAnswered, [this] { Answer(); });
          return;
        }
        Answer();
        return Write();
      case StreamState::kAnswered:
        return Write();
      case StreamState::kWriting:
        if (!ok) {
          return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading"));
        }
        out_.Clear();
        return Read();
      case StreamState::kFinishing:
        delete this;
        return;
    }
  }

 private:
  void Read() {
    Next(StreamState::kReading);
    stream_.Read(&in_, this);
  }
  void Answer() { status_ = served_->Answer(&out_); }
  void Write() {
    if (!status_.ok()) return Finish(status_);
    Next(StreamState::kWriting);
    stream_.Write(out_, this);
  }
  void Finish(const grpc::Status& status) {
    Next(StreamState::kFinishing);
    stream_.Finish(status, this);
  }

  AsyncServices::Embedding* service_;
  EmbeddingServiceImpl* impl_;
  AsyncServices::Offload* offload_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext context_;
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> stream_;
  std::optional<ServedExchanges> served_;
  grpc::ByteBuffer in_, out_;
  grpc::Status status_;  // of the answer in `out_`
};

// One unary Exchange, taken raw: the same halves as a stream's message.
// Deletes itself when done.
class ExchangeCall final : public Call<UnaryState> {
 public:
  ExchangeCall(AsyncServices::Embedding* service, EmbeddingServiceImpl* impl,
               AsyncServices::Offload* offload, grpc::ServerCompletionQueue* cq)
      : Call(UnaryState::kAsked), service_(service), impl_(impl), offload_(offload), cq_(cq),
        responder_(&context_) {
    service->RequestExchange(&context_, &in_, &responder_, cq, cq, this);
  }

  void Proceed(bool ok) override {
    switch (state()) {
      case UnaryState::kAsked: {
        if (!ok) {  // the server is shutting down
          delete this;
          return;
        }
        new ExchangeCall(service_, impl_, offload_, cq_);
        served_.emplace(*impl_, &context_, "Exchange");
        status_ = served_->Open();
        if (status_.ok()) status_ = served_->Receive(&in_);
        if (status_.ok()) status_ = served_->Push();
        if (status_.ok() && served_->MayWait()) {
          OnPoolThenResume(offload_, cq_, UnaryState::kAnswered, [this] { Answer(); });
          return;
        }
        if (status_.ok()) Answer();
        return Finish();
      }
      case UnaryState::kAnswered:
        return Finish();
      case UnaryState::kFinishing:
        delete this;
        return;
    }
  }

 private:
  void Answer() { status_ = served_->Answer(&out_); }
  void Finish() {
    Next(UnaryState::kFinishing);
    if (status_.ok()) {
      responder_.Finish(out_, status_, this);
    } else {
      responder_.FinishWithError(status_, this);
    }
  }

  AsyncServices::Embedding* service_;
  EmbeddingServiceImpl* impl_;
  AsyncServices::Offload* offload_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext context_;
  grpc::ByteBuffer in_, out_;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> responder_;
  std::optional<ServedExchanges> served_;
  grpc::Status status_;
};

// A call to a method that no service above registered: the health check,
// answered from ShardHealth, or anything else, UNIMPLEMENTED as gRPC answers
// an unknown method. Deletes itself when done.
class GenericCall final : public Tag {
 public:
  GenericCall(grpc::AsyncGenericService* service, const ShardHealth* health,
              grpc::ServerCompletionQueue* cq)
      : service_(service), health_(health), cq_(cq), stream_(&context_) {
    service->RequestCall(&context_, &stream_, cq, cq, this);
  }

  void Proceed(bool ok) override {
    switch (state_) {
      case State::kAsked:
        if (!ok) {
          delete this;
          return;
        }
        new GenericCall(service_, health_, cq_);
        if (context_.method() != ShardHealth::kCheckMethod) {
          return Finish(grpc::Status(
              grpc::StatusCode::UNIMPLEMENTED,
              absl::StrCat(context_.method(), " is not served by this shard (--rpc_mode=async "
                                              "serves no reflection and, of the health service, "
                                              "Check only)")));
        }
        state_ = State::kReading;
        stream_.Read(&in_, this);
        return;
      case State::kReading: {
        if (!ok) {
          return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     "grpc.health.v1.Health/Check: no request message"));
        }
        const grpc::Status status = health_->Check(in_, &out_);
        if (!status.ok()) return Finish(status);
        state_ = State::kFinishing;
        stream_.WriteAndFinish(out_, grpc::WriteOptions(), grpc::Status::OK, this);
        return;
      }
      case State::kFinishing:
        delete this;
        return;
    }
  }

 private:
  enum class State { kAsked, kReading, kFinishing };

  void Finish(const grpc::Status& status) {
    state_ = State::kFinishing;
    stream_.Finish(status, this);
  }

  grpc::AsyncGenericService* service_;
  const ShardHealth* health_;
  grpc::ServerCompletionQueue* cq_;
  grpc::GenericServerContext context_;
  grpc::GenericServerAsyncReaderWriter stream_;
  State state_ = State::kAsked;
  grpc::ByteBuffer in_, out_;
};

// A method's calls on `cq`: the first is asked for now, and each call asks
// for the next when it arrives.
template <typename Service, typename Request, typename Response>
void Listen(const UnaryMethod<Service, Request, Response>& method,
            grpc::ServerCompletionQueue* cq) {
  new UnaryCall<Service, Request, Response>(&method, cq);
}

}  // namespace

// The methods, built once per AsyncServices (the calls keep pointers to
// them).
struct AsyncServices::Methods {
  template <typename Service, typename Request, typename Response>
  using M = UnaryMethod<Service, Request, Response>;
  M<Embedding, v1::LookupRequest, v1::LookupResponse> lookup;
  M<Embedding, v1::PushRequest, v1::PushResponse> push;
  M<Embedding, v1::RegisterWorkerRequest, v1::RegisterWorkerResponse> register_worker;
  M<Embedding, v1::UnregisterWorkerRequest, v1::UnregisterWorkerResponse> unregister_worker;
  M<Admin, v1::CreateTableRequest, v1::CreateTableResponse> create_table;
  M<Admin, v1::ListTablesRequest, v1::ListTablesResponse> list_tables;
  M<Admin, v1::DropTableRequest, v1::DropTableResponse> drop_table;
  M<Admin, v1::GetShardInfoRequest, v1::GetShardInfoResponse> shard_info;
  M<Admin, v1::CheckpointRequest, v1::CheckpointResponse> checkpoint;
  M<Admin, v1::ListCheckpointsRequest, v1::ListCheckpointsResponse> list_checkpoints;
  M<Admin, v1::CommitMoveRequest, v1::CommitMoveResponse> commit_move;
  M<Admin, v1::AbortMoveRequest, v1::AbortMoveResponse> abort_move;
};

namespace {

// The sync handler `fn` of `impl`, as a UnaryMethod's Handler.
template <typename Impl, typename Request, typename Response>
auto Handler(Impl* impl,
             grpc::Status (Impl::*fn)(grpc::ServerContext*, const Request*, Response*)) {
  return [impl, fn](grpc::ServerContext* c, const Request* q, Response* r) {
    return (impl->*fn)(c, q, r);
  };
}

}  // namespace

AsyncServices::AsyncServices(EmbeddingServiceImpl* embedding, AdminServiceImpl* admin,
                             Shard* shard, int pool_threads)
    : embedding_impl_(embedding), generic_(std::make_unique<grpc::AsyncGenericService>()),
      offload_(pool_threads) {
  auto always = [](const auto&) { return true; };
  methods_ = std::make_unique<Methods>(Methods{
      .lookup = {&embedding_, &Embedding::RequestLookup,
                 Handler(embedding, &EmbeddingServiceImpl::Lookup),
                 [shard](const v1::LookupRequest& r) { return shard->MayWait(r); }, &offload_},
      .push = {&embedding_, &Embedding::RequestPush,
               Handler(embedding, &EmbeddingServiceImpl::Push), nullptr, &offload_},
      .register_worker = {&embedding_, &Embedding::RequestRegisterWorker,
                          Handler(embedding, &EmbeddingServiceImpl::RegisterWorker), nullptr,
                          &offload_},
      .unregister_worker = {&embedding_, &Embedding::RequestUnregisterWorker,
                            Handler(embedding, &EmbeddingServiceImpl::UnregisterWorker), nullptr,
                            &offload_},
      // Admin calls are rare and some are long (a checkpoint, a large
      // table's allocation): all of them on the pool.
      .create_table = {&admin_, &Admin::RequestCreateTable,
                       Handler(admin, &AdminServiceImpl::CreateTable), always, &offload_},
      .list_tables = {&admin_, &Admin::RequestListTables,
                      Handler(admin, &AdminServiceImpl::ListTables), always, &offload_},
      .drop_table = {&admin_, &Admin::RequestDropTable,
                     Handler(admin, &AdminServiceImpl::DropTable), always, &offload_},
      .shard_info = {&admin_, &Admin::RequestGetShardInfo,
                     Handler(admin, &AdminServiceImpl::GetShardInfo), always, &offload_},
      .checkpoint = {&admin_, &Admin::RequestCheckpoint,
                     Handler(admin, &AdminServiceImpl::Checkpoint), always, &offload_},
      .list_checkpoints = {&admin_, &Admin::RequestListCheckpoints,
                           Handler(admin, &AdminServiceImpl::ListCheckpoints), always, &offload_},
      .commit_move = {&admin_, &Admin::RequestCommitMove,
                      Handler(admin, &AdminServiceImpl::CommitMove), always, &offload_},
      .abort_move = {&admin_, &Admin::RequestAbortMove,
                     Handler(admin, &AdminServiceImpl::AbortMove), always, &offload_},
  });
}

AsyncServices::~AsyncServices() { Stop(); }

void AsyncServices::Register(grpc::ServerBuilder* builder, int completion_threads) {
  builder->RegisterService(&embedding_);
  builder->RegisterService(&admin_);
  builder->RegisterAsyncGenericService(generic_.get());
  builder->SetOption(std::make_unique<WithoutReflection>());
  // The server owns the health statuses (its GetHealthCheckService); the
  // generic calls answer Check from them while it runs.
  auto health = std::make_unique<ShardHealth>();
  health_ = health.get();
  builder->SetOption(
      std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(std::move(health)));
  for (int i = 0; i < completion_threads; ++i) cqs_.push_back(builder->AddCompletionQueue());
}

void AsyncServices::ListenAll(grpc::ServerCompletionQueue* cq) {
  Methods& m = *methods_;
  Listen(m.lookup, cq);
  Listen(m.push, cq);
  Listen(m.register_worker, cq);
  Listen(m.unregister_worker, cq);
  Listen(m.create_table, cq);
  Listen(m.list_tables, cq);
  Listen(m.drop_table, cq);
  Listen(m.shard_info, cq);
  Listen(m.checkpoint, cq);
  Listen(m.list_checkpoints, cq);
  Listen(m.commit_move, cq);
  Listen(m.abort_move, cq);
  new StreamCall(&embedding_, embedding_impl_, &offload_, cq);
  new ExchangeCall(&embedding_, embedding_impl_, &offload_, cq);
  new GenericCall(generic_.get(), health_, cq);
}

void AsyncServices::Start() {
  for (const auto& cq : cqs_) {
    ListenAll(cq.get());
    threads_.emplace_back([cq = cq.get()] {
      void* tag;
      bool ok;
      while (cq->Next(&tag, &ok)) static_cast<Tag*>(tag)->Proceed(ok);
    });
  }
}

void AsyncServices::Stop() {
  if (stopped_) return;
  stopped_ = true;
  // The pool's last calls come back to their queues, whose threads still
  // run, and finish there; a queue must not be shut down before (starting
  // an operation on one that is ends the process).
  offload_.pool.Stop();
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (offload_.calls.load(std::memory_order_acquire) > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (const int left = offload_.calls.load(std::memory_order_acquire); left > 0) {
    spdlog::error("{} calls from the pool still unfinished after 30 s; stopping anyway", left);
  }
  for (const auto& cq : cqs_) cq->Shutdown();
  for (std::thread& t : threads_) t.join();
}

}  // namespace ember
