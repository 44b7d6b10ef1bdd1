#include "client/exchange_stream.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/internal/exchange_answer_fill.h"
#include "common/wire.h"
#include "ember/v1/embedding_service.grpc.pb.h"

namespace ember {

ExchangeStream::ExchangeStream(grpc::GenericStub* stub, CallDriver* driver,
                               absl::Duration exchange_timeout, const CallMetadata& metadata)
    : stub_(stub), driver_(driver) {
  metadata.AddTo(&context_);
  if (exchange_timeout < absl::InfiniteDuration()) {
    context_.AddMetadata(kExchangeTimeoutMetadata,
                         std::to_string(absl::ToInt64Milliseconds(exchange_timeout)));
  }
}

ExchangeStream::~ExchangeStream() {
  if (call_ == nullptr || finished_) return;
  if (!finishing_) {
    // Idle and healthy: close our side; the shard ends the stream with OK.
    call_->WritesDone(driver_->Expect([](bool) {}));
    Finish();
  }
  constexpr absl::Duration kGrace = absl::Seconds(1);
  if (!driver_->Drive(absl::Now() + kGrace, [this] { return finished_; })) {
    context_.TryCancel();
  }
  // Every operation of this stream has to complete before it is freed.
  driver_->Drive(absl::InfiniteFuture(), [this] { return driver_->outstanding() == 0; });
}

void ExchangeStream::Send(grpc::ByteBuffer request, ExchangeAnswer* response,
                          std::function<void(grpc::Status)> done) {
  done_ = std::move(done);
  request_ = std::move(request);
  response_ = response;
  pending_ = 2;
  if (call_ == nullptr) {
    static const std::string* const kMethod = new std::string(
        absl::StrCat("/", v1::EmbeddingService::service_full_name(), "/ExchangeStream"));
    // Corked: the stream's metadata goes out with the first request, and
    // StartCall performs no operation of its own (it would use the one
    // write slot the first Write needs: two writes in flight abort gRPC).
    context_.set_initial_metadata_corked(true);
    call_ = stub_->PrepareCall(&context_, *kMethod, driver_->cq());
    call_->StartCall(nullptr);
  }
  call_->Write(request_, driver_->Expect([this](bool ok) {
    request_.Clear();  // gRPC holds what it still needs of it
    broken_ |= !ok;
    OperationDone();
  }));
  call_->Read(&answer_, driver_->Expect([this](bool ok) {
    if (ok) {
      malformed_ = !internal::ExchangeAnswerFill::Parse(*response_, &answer_);
      answered_ = true;
    }
    broken_ |= !ok;
    OperationDone();
  }));
}

void ExchangeStream::CancelForDeadline() {
  if (done_ == nullptr) return;
  deadline_cancel_ = true;
  context_.TryCancel();
}

void ExchangeStream::OperationDone() {
  if (--pending_ > 0) return;
  if (malformed_) context_.TryCancel();  // the shard would wait for our next request
  if (broken_ || malformed_) {
    Finish();  // `done` runs with the stream's status
    return;
  }
  std::function<void(grpc::Status)> done = std::move(done_);
  done_ = nullptr;
  done(grpc::Status::OK);
}

void ExchangeStream::Finish() {
  finishing_ = true;
  call_->Finish(&status_, driver_->Expect([this](bool) {
    finished_ = true;
    std::function<void(grpc::Status)> done = std::move(done_);
    done_ = nullptr;
    if (done == nullptr) return;  // closing an idle stream
    if (malformed_) {
      done(grpc::Status(grpc::StatusCode::INTERNAL,
                        "the shard's answer on the exchange stream is not an ExchangeResponse"));
    } else if (deadline_cancel_) {
      done(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "Deadline Exceeded (no answer on the exchange stream in time)"));
    } else if (status_.ok()) {
      // The shard ended the stream without answering (it is shutting down).
      done(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the shard closed the exchange stream"));
    } else {
      done(status_);
    }
  }));
}

ExchangeStream* ExchangeSession::Stream(uint32_t shard) {
  std::unique_ptr<ExchangeStream>& stream = streams_[shard];
  if (stream == nullptr || stream->finished()) {
    stream.reset();  // a finished stream has no operation left
    stream = std::make_unique<ExchangeStream>((*stubs_)[shard].get(), &driver_, exchange_timeout_,
                                              *metadata_);
  }
  return stream.get();
}

ExchangeSessionPool::ExchangeSessionPool(
    const std::vector<std::shared_ptr<grpc::Channel>>& channels, absl::Duration exchange_timeout,
    const CallMetadata* metadata)
    : exchange_timeout_(exchange_timeout), metadata_(metadata) {
  for (const auto& channel : channels) stubs_.push_back(std::make_unique<grpc::GenericStub>(channel));
}

std::unique_ptr<ExchangeSession> ExchangeSessionPool::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      std::unique_ptr<ExchangeSession> session = std::move(idle_.back());
      idle_.pop_back();
      return session;
    }
  }
  return std::make_unique<ExchangeSession>(&stubs_, exchange_timeout_, metadata_);
}

void ExchangeSessionPool::Release(std::unique_ptr<ExchangeSession> session) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(session));
}

}  // namespace ember
