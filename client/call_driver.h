// CallDriver: a completion queue that the calling thread polls itself, so
// that a call's answer is read, parsed and handled on the thread that waits
// for it.
//
// Why not gRPC's callback API: its completions run on gRPC's own threads
// (in gRPC 1.51 with the epoll1 poller, the "nexting" threads of its
// callback queue), so every answer costs a wake-up of one of them and then
// of the waiting thread, and while they live they take turns as the
// process's poller. Measured with one stream per shard, 2 shards, 2,500
// keys each (docs/client.md, "Calls driven by the waiting thread"): the
// client's CPU per exchange fell from about 210 us to 125 us and its
// voluntary context switches from about 9 to 1.5. The gain is there only
// while no call in the process uses the callback API, which is why every
// call of the client library goes through a CallDriver.
//
// Internal to the client library.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace ember {

// Thread safety: none. One thread at a time starts operations on it and
// drives it; completions run on that thread, inside Drive.
class CallDriver {
 public:
  CallDriver() = default;
  // Drives any operation still outstanding to its end first (the owner
  // should have: their completions may refer to what the owner holds).
  ~CallDriver();
  CallDriver(const CallDriver&) = delete;
  CallDriver& operator=(const CallDriver&) = delete;

  grpc::CompletionQueue* cq() { return &cq_; }

  // The tag of one operation started on cq(): `on_done(ok)` runs in Drive
  // when it completes, with gRPC's `ok` for it.
  void* Expect(std::function<void(bool ok)> on_done);

  // Runs completions until `until()` holds (checked before waiting and
  // after each completion) or `deadline` passes; returns until()'s last
  // value. With absl::InfiniteFuture() it returns only once until() holds,
  // which needs an operation outstanding to make it so.
  bool Drive(absl::Time deadline, const std::function<bool()>& until);

  size_t outstanding() const { return outstanding_; }

 private:
  grpc::CompletionQueue cq_;
  size_t outstanding_ = 0;
};

// Starts a unary call on `driver`: `reader` is the call, prepared (not
// started) on driver->cq(), e.g. stub->PrepareAsyncLookup(ctx, request,
// driver->cq()). `response` must stay valid until `done` has run; `done`
// runs once, in the driver's Drive, with the call's status.
template <typename Response>
void StartUnary(CallDriver* driver,
                std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> reader,
                Response* response, std::function<void(grpc::Status)> done) {
  struct Call {
    std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> reader;
    grpc::Status status;
  };
  auto call = std::make_shared<Call>();
  call->reader = std::move(reader);
  call->reader->StartCall();
  call->reader->Finish(response, &call->status,
                       driver->Expect([call, done = std::move(done)](bool) {
                         done(std::move(call->status));
                       }));
}

}  // namespace ember
