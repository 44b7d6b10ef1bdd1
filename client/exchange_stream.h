// The client's end of EmbeddingService.ExchangeStream: long-lived streams to
// one shard, each carrying one exchange at a time, so that a trainer's
// steady state pays no per-call setup per step.
//
// The stream carries serialised messages (a generic gRPC call on the same
// method, same wire bytes), so that the caller decides how a request is
// serialised: SerializeAliased (common/aliased_serialize.h) sends its
// gradients without copying them.
//
// Internal to the client library (Client::Exchange uses it).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "ember/exchange_answer.h"
#include "ember/v1/embedding_service.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace ember {

// One open stream. Send() starts an exchange; `done` runs once, on a gRPC
// thread, with OK when the answer is in `*response`, or with the status the
// stream ended with. After a failure (or Cancel) the stream is finished and
// must not be used again. Thread safety: one exchange at a time; Cancel may
// be called from any thread while one is in flight.
class ExchangeStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Opens the stream; `exchange_timeout` goes to the shard as the stream's
  // ember-exchange-timeout-ms (each exchange's bound on the consistency wait),
  // `auth_token` (if any) as its bearer token.
  ExchangeStream(grpc::GenericStub* stub, absl::Duration exchange_timeout,
                 const std::string& auth_token);
  // Closes the stream (the shard sees the end and answers OK) and waits for
  // gRPC to be done with it, cancelling it if that takes longer than `grace`.
  ~ExchangeStream() override;

  // Sends `request`, a serialised ExchangeRequest; `response` must stay
  // valid until `done` has run, and gets the answer with its rows left in
  // gRPC's receive buffers (ExchangeAnswer::Parse). An answer that does not
  // parse ends the exchange with INTERNAL and the stream with it.
  void Send(grpc::ByteBuffer request, ExchangeAnswer* response,
            std::function<void(grpc::Status)> done);
  // Ends the exchange in flight (if any) with DEADLINE_EXCEEDED and the
  // stream with it; `done` still runs, soon.
  void CancelForDeadline();
  // The stream ended (failure, cancel, or the shard closed it).
  bool finished() const;
  // The stream answered at least one exchange (so the shard implements it).
  bool answered() const;

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // One of the exchange's two operations ended; the exchange succeeds when
  // both have (the answer can arrive before gRPC reports the write done,
  // and the next exchange may not start its write before that).
  void OperationDone();

  grpc::ClientContext context_;
  grpc::ByteBuffer request_;   // the exchange's request, until its write is done
  grpc::ByteBuffer answer_;    // the exchange's answer, parsed into *response_
  ExchangeAnswer* response_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void(grpc::Status)> done_;  // set while an exchange is in flight
  int pending_ = 0;            // operations of the exchange in flight (write, read)
  bool write_failed_ = false;  // the stream broke after the request went out
  bool malformed_ = false;     // the answer did not parse
  bool hold_removed_ = false;  // the stream is ending: OnDone has (or will have) its status
  bool deadline_cancel_ = false;
  bool finished_ = false;      // OnDone ran
  bool answered_ = false;
};

// Idle streams to one shard. Concurrent callers each get their own stream
// (a new one when none is idle); a stream goes back after a successful
// exchange and is dropped after a failed one. Thread-safe.
class ExchangeStreamPool {
 public:
  ExchangeStreamPool(std::shared_ptr<grpc::Channel> channel, absl::Duration exchange_timeout,
                     std::string auth_token)
      : stub_(std::move(channel)), exchange_timeout_(exchange_timeout),
        auth_token_(std::move(auth_token)) {}

  std::unique_ptr<ExchangeStream> Acquire();
  // `stream` back for the next exchange; a finished one is closed instead.
  void Release(std::unique_ptr<ExchangeStream> stream);

 private:
  grpc::GenericStub stub_;
  const absl::Duration exchange_timeout_;
  const std::string auth_token_;
  std::mutex mu_;
  std::vector<std::unique_ptr<ExchangeStream>> idle_;
};

}  // namespace ember
