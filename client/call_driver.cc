#include "client/call_driver.h"

namespace ember {

namespace {

struct Operation {
  std::function<void(bool)> on_done;
};

}  // namespace

CallDriver::~CallDriver() {
  // An operation still outstanding would complete into a freed queue, and
  // run its completion on objects its owner may have freed: let it end.
  Drive(absl::InfiniteFuture(), [this] { return outstanding_ == 0; });
  cq_.Shutdown();
  void* tag;
  bool ok;
  while (cq_.Next(&tag, &ok)) {
  }
}

void* CallDriver::Expect(std::function<void(bool ok)> on_done) {
  ++outstanding_;
  return new Operation{std::move(on_done)};
}

bool CallDriver::Drive(absl::Time deadline, const std::function<bool()>& until) {
  while (!until()) {
    void* tag = nullptr;
    bool ok = false;
    if (deadline == absl::InfiniteFuture()) {
      if (!cq_.Next(&tag, &ok)) return until();  // shut down: cannot happen while in use
    } else if (cq_.AsyncNext(&tag, &ok, absl::ToChronoTime(deadline)) !=
               grpc::CompletionQueue::NextStatus::GOT_EVENT) {
      return until();
    }
    std::unique_ptr<Operation> op(static_cast<Operation*>(tag));
    --outstanding_;
    op->on_done(ok);
  }
  return true;
}

}  // namespace ember
