// The client's end of EmbeddingService.ExchangeStream: long-lived streams to
// the shards, each carrying one exchange at a time, so that a trainer's
// steady state pays no per-call setup per step.
//
// The stream carries serialised messages (a generic gRPC call on the same
// method, same wire bytes), so that the caller decides how a request is
// serialised: SerializeAliased (common/aliased_serialize.h) sends its
// gradients without copying them.
//
// A stream's operations complete on a CallDriver (client/call_driver.h),
// polled by the thread that waits for the exchange, so that the answer is
// read and parsed there instead of on a gRPC thread.
//
// Internal to the client library (Client::Exchange uses it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "client/call_driver.h"
#include "client/call_metadata.h"
#include "ember/exchange_answer.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace ember {

// One stream, opened by its first Send. Send() starts an exchange; `done`
// runs once, inside driver->Drive, with OK when the answer is in
// `*response`, or with the status the stream ended with. After a failure
// (or a cancel) the stream is finished and must not be used again.
// Thread safety: none; everything happens on the thread driving `driver`.
class ExchangeStream {
 public:
  // `stub` and `driver` must outlive the stream. `exchange_timeout` goes to
  // the shard as the stream's ember-exchange-timeout-ms (each exchange's
  // bound on the consistency wait), with `metadata`'s token and routing
  // epoch as they are when the stream opens.
  ExchangeStream(grpc::GenericStub* stub, CallDriver* driver, absl::Duration exchange_timeout,
                 const CallMetadata& metadata);
  // Closes an open stream (the shard sees the end and answers OK), driving
  // `driver` until gRPC is done with it, and cancels it if that takes
  // longer than a second. No exchange may be in flight.
  ~ExchangeStream();
  ExchangeStream(const ExchangeStream&) = delete;
  ExchangeStream& operator=(const ExchangeStream&) = delete;

  // Sends `request`, a serialised ExchangeRequest; `response` must stay
  // valid until `done` has run, and gets the answer with its rows left in
  // gRPC's receive buffers (ExchangeAnswer::Parse). An answer that does not
  // parse ends the exchange with INTERNAL and the stream with it.
  void Send(grpc::ByteBuffer request, ExchangeAnswer* response,
            std::function<void(grpc::Status)> done);
  // Ends the exchange in flight (if any) with DEADLINE_EXCEEDED and the
  // stream with it; `done` still runs, in a later Drive.
  void CancelForDeadline();
  // The stream ended (failure, cancel, or the shard closed it).
  bool finished() const { return finished_ || finishing_; }
  // The stream answered at least one exchange (so the shard implements it).
  bool answered() const { return answered_; }

 private:
  // One of the exchange's two operations (write, read) ended; the exchange
  // ends when both have (the answer can arrive before gRPC reports the
  // write done, and the next exchange may not write before that).
  void OperationDone();
  // Asks gRPC for the stream's status; `done` gets it.
  void Finish();

  grpc::GenericStub* const stub_;
  CallDriver* const driver_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;  // set by the first Send
  grpc::ByteBuffer request_;  // the exchange's request, until its write is done
  grpc::ByteBuffer answer_;   // the exchange's answer, parsed into *response_
  ExchangeAnswer* response_ = nullptr;
  std::function<void(grpc::Status)> done_;  // set while an exchange is in flight
  grpc::Status status_;       // the stream's end, from Finish
  int pending_ = 0;           // operations of the exchange in flight
  bool broken_ = false;       // an operation failed: the stream is over
  bool malformed_ = false;    // the answer did not parse
  bool deadline_cancel_ = false;
  bool finishing_ = false;    // Finish issued
  bool finished_ = false;     // Finish completed
  bool answered_ = false;
};

// One stream per shard, all on one CallDriver: what one Exchange call uses,
// from start to end. Streams are opened on first use and replaced after
// they end. Thread safety: none (one caller at a time: see the pool).
class ExchangeSession {
 public:
  // `stubs[i]` reaches shard i; they must outlive the session.
  ExchangeSession(const std::vector<std::unique_ptr<grpc::GenericStub>>* stubs,
                  absl::Duration exchange_timeout, const CallMetadata* metadata)
      : stubs_(stubs),
        exchange_timeout_(exchange_timeout),
        metadata_(metadata),
        streams_(stubs->size()) {}

  CallDriver* driver() { return &driver_; }
  // Shard `shard`'s open stream, a new one if it has none or it ended.
  ExchangeStream* Stream(uint32_t shard);

 private:
  const std::vector<std::unique_ptr<grpc::GenericStub>>* const stubs_;
  const absl::Duration exchange_timeout_;
  const CallMetadata* const metadata_;
  CallDriver driver_;  // declared before the streams, which drive it as they close
  std::vector<std::unique_ptr<ExchangeStream>> streams_;
};

// Idle sessions. Concurrent callers each get their own session (a new one
// when none is idle). Thread-safe.
class ExchangeSessionPool {
 public:
  // One channel per shard; `metadata` must outlive the pool.
  ExchangeSessionPool(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                      absl::Duration exchange_timeout, const CallMetadata* metadata);

  std::unique_ptr<ExchangeSession> Acquire();
  void Release(std::unique_ptr<ExchangeSession> session);

 private:
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  const absl::Duration exchange_timeout_;
  const CallMetadata* const metadata_;
  std::mutex mu_;
  std::vector<std::unique_ptr<ExchangeSession>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember
