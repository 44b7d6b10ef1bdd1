#include "server/embedding_service.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/support/method_handler.h>

#include <atomic>
#include <memory>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/aliased_serialize.h"
#include "common/status_macros.h"
#include "common/wire.h"
#include "server/grpc_status.h"
#include "server/received_exchange.h"

// A refused call answers with the refusal (see server/token_auth.h).
#define EMBER_AUTHORIZE_SYNC(context, rpc)                                           \
  if (absl::Status denied = Authorize(auth_, context, Role::kTrainer, rpc);         \
      !denied.ok()) {                                                                \
    return ToGrpcStatus(denied);                                                     \
  }
#define EMBER_AUTHORIZE_REACTOR(context, rpc, reactor)                               \
  if (absl::Status denied = Authorize(auth_, context, Role::kTrainer, rpc);         \
      !denied.ok()) {                                                                \
    (reactor)->Finish(ToGrpcStatus(denied));                                         \
    return reactor;                                                                  \
  }
// A call over its connection's or the shard's in-flight bytes is refused
// before it runs (see server/inflight_limit.h); `ticket` holds its bytes
// (`bytes`: the request's size on the wire).
#define EMBER_ADMIT_SYNC(ticket, context, bytes, rpc)                         \
  absl::StatusOr<Ticket> ticket = Admit(inflight_, context, bytes, rpc);     \
  if (!ticket.ok()) return ToGrpcStatus(ticket.status());

namespace ember {
namespace {

using Ticket = std::shared_ptr<const InflightLimit::Ticket>;

// The call's in-flight ticket for a request of `bytes` on the wire; null
// without a limit.
absl::StatusOr<Ticket> Admit(InflightLimit* limit, const grpc::ServerContextBase& context,
                             size_t bytes, absl::string_view rpc) {
  if (limit == nullptr) return Ticket();
  return limit->Acquire(context.peer(), bytes, rpc);
}

// A lookup that writes nothing (every table read_only) is a reader's call;
// one that inserts rows is a trainer's.
absl::Status AuthorizeLookup(const TokenAuth* auth, const grpc::ServerContextBase& context,
                             const v1::LookupRequest& request) {
  if (auth == nullptr) return absl::OkStatus();  // no tokens: nothing to look at
  for (const v1::TableLookup& t : request.tables()) {
    if (!t.read_only()) {
      return Authorize(
          auth, context, Role::kTrainer, "Lookup",
          absl::StrCat("table '", t.table(), "' has read_only = false: it inserts rows"));
    }
  }
  return Authorize(auth, context, Role::kReader, "Lookup");
}

// A call whose deadline passed while it queued is not worth starting.
bool Expired(const grpc::ServerContextBase* context) {
  return context->deadline() < std::chrono::system_clock::now();
}
const grpc::Status kExpired(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed in queue");

// The call's deadline, which also bounds a lookup's consistency wait.
absl::Time Deadline(const grpc::ServerContextBase* context) {
  return context->deadline() == std::chrono::system_clock::time_point::max()
             ? absl::InfiniteFuture()
             : absl::FromChrono(context->deadline());
}

// How long one exchange of a stream may wait for the consistency clock: the
// stream's ember-exchange-timeout-ms metadata; without it (or unreadable),
// no bound here (the shard's --max_ssp_wait still is one).
absl::Duration StreamExchangeTimeout(const grpc::ServerContextBase* context) {
  const auto& metadata = context->client_metadata();
  const auto it = metadata.find(kExchangeTimeoutMetadata);
  int64_t ms = 0;
  if (it == metadata.end() ||
      !absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &ms) || ms <= 0) {
    return absl::InfiniteDuration();
  }
  return absl::Milliseconds(ms);
}

// The call's routing epoch (ember-routing-epoch): 0 when it sends none,
// which the shard does not check.
absl::StatusOr<uint64_t> CallRoutingEpoch(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find(kRoutingEpochMetadata);
  if (it == metadata.end()) return 0;
  const absl::string_view value(it->second.data(), it->second.size());
  uint64_t epoch = 0;
  if (!absl::SimpleAtoi(value, &epoch)) {
    return absl::InvalidArgumentError(absl::StrCat("metadata '", kRoutingEpochMetadata,
                                                   "': expected a decimal number, received '",
                                                   value, "'"));
  }
  return epoch;
}

// Refuses a call routed by another routing epoch than the shard's.
absl::Status CheckCallRoutingEpoch(const Shard& shard, const grpc::ServerContextBase& context,
                                   absl::string_view rpc) {
  absl::StatusOr<uint64_t> epoch = CallRoutingEpoch(context);
  if (!epoch.ok()) return epoch.status();
  return shard.CheckRoutingEpoch(*epoch, rpc);
}

// A response of `pool` that nothing else holds (gRPC has sent its bytes),
// cleared (its buffers keep their capacity), or a new one, added to the
// pool while it has fewer than 4.
std::shared_ptr<v1::ExchangeResponse> FreeResponse(
    std::vector<std::shared_ptr<v1::ExchangeResponse>>* pool) {
  for (std::shared_ptr<v1::ExchangeResponse>& r : *pool) {
    // Only this pool can add owners, so 1 stays 1. The fence orders the
    // last owner's release (gRPC done with the bytes) before the Clear.
    if (r.use_count() == 1) {
      std::atomic_thread_fence(std::memory_order_acquire);
      r->Clear();
      return r;
    }
  }
  auto r = std::make_shared<v1::ExchangeResponse>();
  if (pool->size() < 4) pool->push_back(r);
  return r;
}

constexpr char kNotAnExchangeRequest[] =
    "ExchangeStream: a message on the stream is not an ExchangeRequest";

// Counts a stream in the metrics for its life.
class OpenStream {
 public:
  explicit OpenStream(ShardMetrics* metrics) : metrics_(metrics) {
    if (metrics_ == nullptr) return;
    metrics_->exchange_streams_opened.Add();
    metrics_->exchange_streams_open.Add(1);
  }
  ~OpenStream() {
    if (metrics_ != nullptr) metrics_->exchange_streams_open.Add(-1);
  }
  OpenStream(const OpenStream&) = delete;
  OpenStream& operator=(const OpenStream&) = delete;

 private:
  ShardMetrics* metrics_;
};

// Runs `call`, then counts it per method and status code with its latency.
template <typename Call>
grpc::Status MeasuredCall(ShardMetrics* metrics, ShardMetrics::Rpc rpc, Call call) {
  if (metrics == nullptr) return ToGrpcStatus(call());
  const absl::Time start = absl::Now();
  const absl::Status status = call();
  metrics->RecordCall(rpc, status.code(), absl::ToDoubleSeconds(absl::Now() - start));
  return ToGrpcStatus(status);
}

}  // namespace

template <typename Call>
grpc::Status EmbeddingServiceImpl::Measured(ShardMetrics::Rpc rpc, Call call) {
  return MeasuredCall(metrics_, rpc, std::move(call));
}

grpc::Status EmbeddingServiceImpl::Lookup(grpc::ServerContext* context,
                                          const v1::LookupRequest* request,
                                          v1::LookupResponse* response) {
  if (Expired(context)) return kExpired;
  if (absl::Status denied = AuthorizeLookup(auth_, *context, *request); !denied.ok()) {
    return ToGrpcStatus(denied);
  }
  EMBER_ADMIT_SYNC(ticket, *context, request->ByteSizeLong(), "Lookup");
  return Measured(ShardMetrics::Rpc::kLookup, [&] {
    EMBER_RETURN_IF_ERROR(CheckCallRoutingEpoch(*shard_, *context, "Lookup"));
    return shard_->Lookup(*request, response, Deadline(context));
  });
}

grpc::Status EmbeddingServiceImpl::Push(grpc::ServerContext* context,
                                        const v1::PushRequest* request,
                                        v1::PushResponse* response) {
  if (Expired(context)) return kExpired;
  EMBER_AUTHORIZE_SYNC(*context, "Push");
  EMBER_ADMIT_SYNC(ticket, *context, request->ByteSizeLong(), "Push");
  return Measured(ShardMetrics::Rpc::kPush, [&] {
    EMBER_RETURN_IF_ERROR(CheckCallRoutingEpoch(*shard_, *context, "Push"));
    return shard_->Push(*request, response);
  });
}

grpc::Status EmbeddingServiceImpl::Exchange(grpc::ServerContext* context,
                                            const v1::ExchangeRequest* request,
                                            v1::ExchangeResponse* response) {
  if (Expired(context)) return kExpired;
  EMBER_AUTHORIZE_SYNC(*context, "Exchange");
  EMBER_ADMIT_SYNC(ticket, *context, request->ByteSizeLong(), "Exchange");
  return Measured(ShardMetrics::Rpc::kExchange, [&] {
    EMBER_RETURN_IF_ERROR(CheckCallRoutingEpoch(*shard_, *context, "Exchange"));
    return shard_->Exchange(*request, response, Deadline(context));
  });
}

EmbeddingServiceImpl::EmbeddingServiceImpl(Shard* shard, ShardMetrics* metrics,
                                           const TokenAuth* auth, InflightLimit* inflight)
    : shard_(shard), metrics_(metrics), auth_(auth), inflight_(inflight) {
  // The generated sync handler would parse and serialise with protobuf
  // (copying every row); this one takes the stream's bytes. The method keeps
  // its name, type and wire format, so clients see no difference.
  static const int kExchangeStreamIndex =
      google::protobuf::DescriptorPool::generated_pool()
          ->FindServiceByName(v1::EmbeddingService::service_full_name())
          ->FindMethodByName("ExchangeStream")
          ->index();
  MarkMethodStreamed(
      kExchangeStreamIndex,
      new grpc::internal::BidiStreamingHandler<EmbeddingServiceImpl, grpc::ByteBuffer,
                                               grpc::ByteBuffer>(
          [](EmbeddingServiceImpl* service, grpc::ServerContext* context,
             grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
            return service->ExchangeStreamRaw(context, stream);
          },
          this));
}

grpc::Status EmbeddingServiceImpl::ExchangeStreamRaw(
    grpc::ServerContext* context, grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  ServedExchanges served(*this, context, "ExchangeStream");
  if (grpc::Status s = served.Open(); !s.ok()) return s;
  grpc::ByteBuffer in, out;
  while (stream->Read(&in)) {
    if (grpc::Status s = served.Receive(&in); !s.ok()) return s;
    if (grpc::Status s = served.Push(); !s.ok()) return s;
    if (grpc::Status s = served.Answer(&out); !s.ok()) return s;
    if (!stream->Write(out)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading");
    }
  }
  return grpc::Status::OK;
}

// The request is reused from message to message (its buffers keep their
// capacity), and so are the responses: an answer's slices point into its
// response until gRPC has sent them, which can be after Write returns, so a
// few take turns (a new one is made only when all are still held).
struct ServedExchanges::State {
  State(const EmbeddingServiceImpl& service, const grpc::ServerContextBase* context,
        const char* rpc)
      : shard(service.shard_),
        metrics(service.metrics_),
        auth(service.auth_),
        inflight(service.inflight_),
        context(context),
        rpc(rpc),
        timeout(StreamExchangeTimeout(context)),
        epoch(CallRoutingEpoch(*context)) {}
  Shard* shard;
  ShardMetrics* metrics;
  const TokenAuth* auth;
  InflightLimit* inflight;
  const grpc::ServerContextBase* context;
  const char* rpc;
  const absl::Duration timeout;
  const absl::StatusOr<uint64_t> epoch;  // the call's routing epoch
  std::optional<OpenStream> open;  // streams only
  ReceivedExchange received;
  std::vector<std::shared_ptr<v1::ExchangeResponse>> responses;
  std::shared_ptr<v1::ExchangeResponse> response;  // of the message in progress
  Ticket ticket;  // the message's in-flight bytes, until the next one
  absl::Time start;  // of the message's Push

  grpc::Status Record(const absl::Status& status) const {
    if (metrics != nullptr) {
      metrics->RecordCall(ShardMetrics::Rpc::kExchange, status.code(),
                          absl::ToDoubleSeconds(absl::Now() - start));
    }
    return ToGrpcStatus(status);
  }
};

ServedExchanges::ServedExchanges(const EmbeddingServiceImpl& service,
                                 const grpc::ServerContextBase* context, const char* rpc)
    : state_(std::make_unique<State>(service, context, rpc)) {}

ServedExchanges::~ServedExchanges() = default;

grpc::Status ServedExchanges::Open() {
  if (Expired(state_->context)) return kExpired;
  if (absl::Status s = Authorize(state_->auth, *state_->context, Role::kTrainer, state_->rpc);
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (absl::string_view(state_->rpc) == "ExchangeStream") state_->open.emplace(state_->metrics);
  return grpc::Status::OK;
}

grpc::Status ServedExchanges::Receive(grpc::ByteBuffer* in) {
  state_->ticket.reset();
  if (!state_->received.Parse(in)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        state_->open ? kNotAnExchangeRequest
                                     : "Exchange: the request is not an ExchangeRequest");
  }
  return grpc::Status::OK;
}

grpc::Status ServedExchanges::Push() {
  State& st = *state_;
  absl::StatusOr<Ticket> ticket = Admit(st.inflight, *st.context, st.received.wire_bytes(), st.rpc);
  if (!ticket.ok()) return ToGrpcStatus(ticket.status());
  st.ticket = *std::move(ticket);
  st.start = absl::Now();
  st.response = FreeResponse(&st.responses);
  // The stream's epoch is read once; the shard's is compared per message.
  absl::Status routed =
      st.epoch.ok() ? st.shard->CheckRoutingEpoch(*st.epoch, st.rpc) : st.epoch.status();
  if (!routed.ok()) return st.Record(routed);
  const absl::Status pushed = st.shard->ExchangePush(st.received.message(), st.response.get(),
                                                     st.received.gradient_pieces());
  return pushed.ok() ? grpc::Status::OK : st.Record(pushed);
}

bool ServedExchanges::MayWait() const {
  const v1::ExchangeRequest& request = state_->received.message();
  return (request.has_lookup() && state_->shard->MayWait(request.lookup())) ||
         (request.has_peek() && state_->shard->MayWait(request.peek()));
}

grpc::Status ServedExchanges::Answer(grpc::ByteBuffer* out) {
  State& st = *state_;
  const absl::Time deadline = std::min(Deadline(st.context), st.start + st.timeout);
  const grpc::Status status =
      st.Record(st.shard->ExchangeLookup(st.received.message(), st.response.get(), deadline));
  if (status.ok()) *out = SerializeAliased(std::move(st.response));
  st.response.reset();
  return status;
}

grpc::Status EmbeddingServiceImpl::RegisterWorker(grpc::ServerContext* context,
                                                  const v1::RegisterWorkerRequest* request,
                                                  v1::RegisterWorkerResponse* response) {
  EMBER_AUTHORIZE_SYNC(*context, "RegisterWorker");
  // A client of an older routing must not change the clock of the cluster
  // that replaced it (a pipeline closing after its cluster moved).
  if (absl::Status s = CheckCallRoutingEpoch(*shard_, *context, "RegisterWorker"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(shard_->RegisterWorker(*request, response));
}

grpc::Status EmbeddingServiceImpl::UnregisterWorker(grpc::ServerContext* context,
                                                    const v1::UnregisterWorkerRequest* request,
                                                    v1::UnregisterWorkerResponse* response) {
  EMBER_AUTHORIZE_SYNC(*context, "UnregisterWorker");
  if (absl::Status s = CheckCallRoutingEpoch(*shard_, *context, "UnregisterWorker"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  shard_->UnregisterWorker(*request, response);
  return grpc::Status::OK;
}

}  // namespace ember
