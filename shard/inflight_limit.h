// InflightLimit: bounds the bytes of requests a shard holds at once, per
// connection and in total, so that no client (or set of clients) can make a
// shard run out of memory by sending faster than it answers. A call takes a
// ticket for its request's bytes before it runs and gives it back when it
// finishes (a lookup waiting for the consistency clock holds its ticket);
// a call that would go over either limit is refused with RESOURCE_EXHAUSTED
// naming the limit and its flag, and changes nothing.
//
// Counted: the request message's serialized bytes. Not counted: the
// answer, which Shard bounds per call by --max_message_bytes, and gRPC's
// own buffers (bounded per call by the same limit).
//
// Thread safety: every method may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shard/shard_metrics.h"

namespace ember {

class InflightLimit {
 public:
  struct Options {
    uint64_t total = 0;           // over all connections; 0: no limit
    uint64_t per_connection = 0;  // per peer (a connection's address and port); 0: no limit
  };
  // `metrics` (null: none) must outlive the limit.
  InflightLimit(Options options, ShardMetrics* metrics);

  // Held while a call runs; gives its bytes back when destroyed.
  class Ticket {
   public:
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

   private:
    friend class InflightLimit;
    Ticket(InflightLimit* limit, std::string peer, uint64_t bytes)
        : limit_(limit), peer_(std::move(peer)), bytes_(bytes) {}
    InflightLimit* limit_;
    std::string peer_;
    uint64_t bytes_;
  };

  // A ticket for `bytes` of request from `peer` (the transport's name of
  // the connection, e.g. gRPC's ServerContext::peer),
  // or RESOURCE_EXHAUSTED naming `rpc`, the limit and its flag. Shared, so
  // that callbacks may carry it.
  absl::StatusOr<std::shared_ptr<const Ticket>> Acquire(absl::string_view peer, uint64_t bytes,
                                                        absl::string_view rpc);

  // Request bytes held now, over all connections.
  uint64_t total() const;

 private:
  void Release(const std::string& peer, uint64_t bytes);

  const Options options_;
  ShardMetrics* const metrics_;
  mutable std::mutex mu_;
  uint64_t total_ = 0;
  absl::flat_hash_map<std::string, uint64_t> per_peer_;
};

}  // namespace ember
