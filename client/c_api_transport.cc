// The C ABI's node transport: a ShuffleTransport whose all-to-all is the
// caller's callback (torch.distributed, from Python), or the in-process one.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "c_api_transport.h"

struct ember_transport {
  std::unique_ptr<ember::ShuffleTransport> transport;
};

struct ember_alltoall_recv {
  std::vector<std::vector<uint8_t>>* blocks;
  std::string error;
};

namespace ember::c_abi {
namespace {

class CallbackTransport final : public ShuffleTransport {
 public:
  CallbackTransport(uint32_t rank, uint32_t size, ember_alltoall_fn fn, void* user)
      : rank_(rank), size_(size), fn_(fn), user_(user) {}

  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }

  absl::Status AllToAll(const std::vector<std::vector<uint8_t>>& send,
                        std::vector<std::vector<uint8_t>>* recv) override {
    if (send.size() != size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node transport: field 'send': expected ", size_, " blocks, received ", send.size()));
    }
    std::vector<const uint8_t*> data(size_);
    std::vector<size_t> sizes(size_);
    for (uint32_t r = 0; r < size_; ++r) {
      data[r] = send[r].data();
      sizes[r] = send[r].size();
    }
    recv->assign(size_, {});
    ember_alltoall_recv out{recv, {}};
    const int code = fn_(user_, size_, data.data(), sizes.data(), &out);
    if (code == 0) return absl::OkStatus();
    return absl::Status(
        static_cast<absl::StatusCode>(code),
        absl::StrCat("node transport of rank ", rank_, " of ", size_, ": ",
                     out.error.empty() ? absl::StrCat("the all-to-all failed (code ", code, ")")
                                       : out.error));
  }

 private:
  const uint32_t rank_;
  const uint32_t size_;
  const ember_alltoall_fn fn_;
  void* const user_;
};

}  // namespace

ShuffleTransport* TransportOf(ember_transport* transport) { return transport->transport.get(); }

}  // namespace ember::c_abi

namespace {

int Refuse(const std::string& message) {
  return ember::c_abi::Fail(absl::InvalidArgumentError(message));
}

}  // namespace

int ember_alltoall_recv_set(ember_alltoall_recv* recv, uint32_t rank, const uint8_t* data,
                            size_t size) {
  if (recv == nullptr || rank >= recv->blocks->size()) {
    return Refuse(absl::StrCat("ember_alltoall_recv_set: rank ", rank, "; expected below ",
                               recv == nullptr ? 0 : recv->blocks->size()));
  }
  (*recv->blocks)[rank].assign(data, data + size);
  return 0;
}

void ember_alltoall_recv_fail(ember_alltoall_recv* recv, const char* message) {
  if (recv != nullptr && message != nullptr) recv->error = message;
}

int ember_transport_create(uint32_t rank, uint32_t size, ember_alltoall_fn fn, void* user,
                           ember_transport** out) {
  if (fn == nullptr || out == nullptr) return Refuse("ember_transport_create: fn and out are required");
  if (size == 0 || rank >= size) {
    return Refuse(absl::StrCat("ember_transport_create: rank ", rank, " of ", size,
                               "; expected size >= 1 and rank below it"));
  }
  *out = new ember_transport{std::make_unique<ember::c_abi::CallbackTransport>(rank, size, fn, user)};
  return 0;
}

int ember_transports_in_process(uint32_t size, ember_transport** out) {
  if (out == nullptr || size == 0) {
    return Refuse(absl::StrCat("ember_transports_in_process: size ", size,
                               "; expected >= 1 and out"));
  }
  auto transports = ember::NewInProcessTransports(size);
  for (uint32_t r = 0; r < size; ++r) out[r] = new ember_transport{std::move(transports[r])};
  return 0;
}

void ember_transport_free(ember_transport* transport) { delete transport; }
