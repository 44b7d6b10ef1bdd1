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
#include "server/edge_call.h"
#include "server/grpc_status.h"
#include "server/received_exchange.h"

namespace ember {
namespace {

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

}  // namespace

grpc::Status EmbeddingServiceImpl::Lookup(grpc::ServerContext* context,
                                          const v1::LookupRequest* request,
                                          v1::LookupResponse* response) {
  return ToGrpcStatus(edge_->Lookup(ReadEdgeCall(*context, "Lookup"), *request, response));
}

grpc::Status EmbeddingServiceImpl::Push(grpc::ServerContext* context,
                                        const v1::PushRequest* request,
                                        v1::PushResponse* response) {
  return ToGrpcStatus(edge_->Push(ReadEdgeCall(*context, "Push"), *request, response));
}

grpc::Status EmbeddingServiceImpl::Exchange(grpc::ServerContext* context,
                                            const v1::ExchangeRequest* request,
                                            v1::ExchangeResponse* response) {
  ShardEdge::Exchange exchange(*edge_, ReadEdgeCall(*context, "Exchange"));
  absl::Status status = exchange.Open();
  if (status.ok()) status = exchange.Push(*request, response, request->ByteSizeLong());
  if (status.ok()) status = exchange.Answer(*request, response, absl::InfiniteFuture());
  return ToGrpcStatus(status);
}

EmbeddingServiceImpl::EmbeddingServiceImpl(const ShardEdge* edge) : edge_(edge) {
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
      : metrics(service.edge_->metrics()),
        exchange(*service.edge_, ReadEdgeCall(*context, rpc)),
        timeout(StreamExchangeTimeout(context)) {}
  ShardMetrics* metrics;
  ShardEdge::Exchange exchange;
  const absl::Duration timeout;
  std::optional<OpenStream> open;  // streams only
  ReceivedExchange received;
  std::vector<std::shared_ptr<v1::ExchangeResponse>> responses;
  std::shared_ptr<v1::ExchangeResponse> response;  // of the message in progress
  absl::Time start;  // of the message's Push
};

ServedExchanges::ServedExchanges(const EmbeddingServiceImpl& service,
                                 const grpc::ServerContextBase* context, const char* rpc)
    : state_(std::make_unique<State>(service, context, rpc)) {}

ServedExchanges::~ServedExchanges() = default;

grpc::Status ServedExchanges::Open() {
  if (absl::Status s = state_->exchange.Open(); !s.ok()) return ToGrpcStatus(s);
  if (state_->exchange.call().rpc == "ExchangeStream") state_->open.emplace(state_->metrics);
  return grpc::Status::OK;
}

grpc::Status ServedExchanges::Receive(grpc::ByteBuffer* in) {
  if (!state_->received.Parse(in)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        state_->open ? kNotAnExchangeRequest
                                     : "Exchange: the request is not an ExchangeRequest");
  }
  return grpc::Status::OK;
}

grpc::Status ServedExchanges::Push() {
  State& st = *state_;
  st.start = absl::Now();
  st.response = FreeResponse(&st.responses);
  return ToGrpcStatus(st.exchange.Push(st.received.message(), st.response.get(),
                                       st.received.wire_bytes(), st.received.gradient_pieces()));
}

bool ServedExchanges::MayWait() const {
  return state_->exchange.MayWait(state_->received.message());
}

grpc::Status ServedExchanges::Answer(grpc::ByteBuffer* out) {
  State& st = *state_;
  const grpc::Status status = ToGrpcStatus(
      st.exchange.Answer(st.received.message(), st.response.get(), st.start + st.timeout));
  if (status.ok()) *out = SerializeAliased(std::move(st.response));
  st.response.reset();
  return status;
}

grpc::Status EmbeddingServiceImpl::RegisterWorker(grpc::ServerContext* context,
                                                  const v1::RegisterWorkerRequest* request,
                                                  v1::RegisterWorkerResponse* response) {
  return ToGrpcStatus(
      edge_->RegisterWorker(ReadEdgeCall(*context, "RegisterWorker"), *request, response));
}

grpc::Status EmbeddingServiceImpl::UnregisterWorker(grpc::ServerContext* context,
                                                    const v1::UnregisterWorkerRequest* request,
                                                    v1::UnregisterWorkerResponse* response) {
  return ToGrpcStatus(
      edge_->UnregisterWorker(ReadEdgeCall(*context, "UnregisterWorker"), *request, response));
}

}  // namespace ember
