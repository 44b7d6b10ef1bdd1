#include "client/exchange_stream.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/wire.h"

namespace ember {

// A hold keeps gRPC from finishing the stream (OnDone) while it is idle, so
// that Send never races with its end: a stream whose shard went away fails
// the next exchange's read, and only then is the hold removed and the
// stream's status delivered.
ExchangeStream::ExchangeStream(grpc::GenericStub* stub, absl::Duration exchange_timeout,
                               const std::string& auth_token) {
  if (!auth_token.empty()) context_.AddMetadata("authorization", "Bearer " + auth_token);
  if (exchange_timeout < absl::InfiniteDuration()) {
    context_.AddMetadata(kExchangeTimeoutMetadata,
                         std::to_string(absl::ToInt64Milliseconds(exchange_timeout)));
  }
  static const std::string* const kMethod =
      new std::string(absl::StrCat("/", v1::EmbeddingService::service_full_name(), "/ExchangeStream"));
  stub->PrepareBidiStreamingCall(&context_, *kMethod, grpc::StubOptions(), this);
  AddHold();
  StartCall();
}

ExchangeStream::~ExchangeStream() {
  constexpr absl::Duration kGrace = absl::Seconds(1);
  std::unique_lock<std::mutex> lock(mu_);
  if (!hold_removed_) {  // still held: close our side, then let it finish
    lock.unlock();
    StartWritesDone();
    RemoveHold();
    lock.lock();
  }
  if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(kGrace), [this] { return finished_; })) {
    context_.TryCancel();
    cv_.wait(lock, [this] { return finished_; });
  }
}

void ExchangeStream::Send(grpc::ByteBuffer request, ExchangeAnswer* response,
                          std::function<void(grpc::Status)> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = std::move(done);
    pending_ = 2;
  }
  request_ = std::move(request);
  response_ = response;
  // The write goes first. A read started first on a broken stream can fail at
  // once; OnReadDone then removes the hold, gRPC ends the call and frees its
  // state, and a StartWrite issued after that touches freed memory (found
  // under ASan by the kill-and-restart pipeline test). An outstanding write
  // keeps the call alive until the read is started.
  StartWrite(&request_);
  StartRead(&answer_);
}

void ExchangeStream::CancelForDeadline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ == nullptr) return;
    deadline_cancel_ = true;
  }
  context_.TryCancel();
}

bool ExchangeStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_ || hold_removed_;
}

bool ExchangeStream::answered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return answered_;
}

void ExchangeStream::OnWriteDone(bool ok) {
  request_.Clear();  // gRPC holds what it still needs of it
  if (!ok) {
    std::lock_guard<std::mutex> lock(mu_);
    write_failed_ = true;  // the read fails too, or has its answer already
  }
  OperationDone();
}

void ExchangeStream::OnReadDone(bool ok) {
  if (ok) {
    const bool parsed = response_->Parse(&answer_);
    std::lock_guard<std::mutex> lock(mu_);
    answered_ = true;
    malformed_ = !parsed;
  } else {
    {
      std::lock_guard<std::mutex> lock(mu_);
      hold_removed_ = true;
    }
    RemoveHold();  // the stream's status comes with OnDone, which runs `done`
    return;
  }
  OperationDone();
}

void ExchangeStream::OperationDone() {
  std::function<void(grpc::Status)> done;
  bool broken = false;
  bool malformed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ > 0 || hold_removed_) return;  // failed: OnDone runs `done`
    done = std::move(done_);
    done_ = nullptr;
    malformed = malformed_;
    broken = write_failed_ || malformed;
    if (broken) hold_removed_ = true;  // finished for the pool; OnDone follows
  }
  if (malformed) context_.TryCancel();  // the shard would wait for our next request
  if (broken) RemoveHold();
  done(malformed ? grpc::Status(grpc::StatusCode::INTERNAL,
                                "the shard's answer on the exchange stream is not an "
                                "ExchangeResponse")
                 : grpc::Status::OK);
}

void ExchangeStream::OnDone(const grpc::Status& status) {
  std::function<void(grpc::Status)> done;
  grpc::Status result = status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
    done = std::move(done_);
    done_ = nullptr;
    if (deadline_cancel_) {
      result = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            "Deadline Exceeded (no answer on the exchange stream in time)");
    } else if (status.ok() && done != nullptr) {
      // The shard ended the stream without answering (it is shutting down).
      result = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the shard closed the exchange stream");
    }
    // Under the lock: once it is released the destructor may free *this.
    cv_.notify_all();
  }
  if (done != nullptr) done(std::move(result));
}

std::unique_ptr<ExchangeStream> ExchangeStreamPool::Acquire() {
  std::vector<std::unique_ptr<ExchangeStream>> finished;
  std::unique_ptr<ExchangeStream> stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!idle_.empty() && stream == nullptr) {
      std::unique_ptr<ExchangeStream> s = std::move(idle_.back());
      idle_.pop_back();
      if (s->finished()) {
        finished.push_back(std::move(s));
      } else {
        stream = std::move(s);
      }
    }
  }
  finished.clear();  // closes them outside the lock
  if (stream == nullptr) {
    stream = std::make_unique<ExchangeStream>(&stub_, exchange_timeout_, auth_token_);
  }
  return stream;
}

void ExchangeStreamPool::Release(std::unique_ptr<ExchangeStream> stream) {
  if (stream->finished()) return;  // closed here, by its destructor
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(stream));
}

}  // namespace ember
