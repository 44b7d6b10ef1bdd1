#include "shard/inflight_limit.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ember {

InflightLimit::InflightLimit(Options options, ShardMetrics* metrics)
    : options_(options), metrics_(metrics) {}

InflightLimit::Ticket::~Ticket() { limit_->Release(peer_, bytes_); }

absl::StatusOr<std::shared_ptr<const InflightLimit::Ticket>> InflightLimit::Acquire(
    absl::string_view peer, uint64_t bytes, absl::string_view rpc) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t& held = per_peer_[peer];
    // Which limit the call would break, if any: its connection's, then the shard's.
    const bool over_connection =
        options_.per_connection != 0 && held + bytes > options_.per_connection;
    const bool over_total = options_.total != 0 && total_ + bytes > options_.total;
    if (over_connection || over_total) {
      const uint64_t in_flight = over_connection ? held : total_;
      if (held == 0) per_peer_.erase(std::string(peer));
      if (metrics_ != nullptr) metrics_->RecordInflightRefusal(over_connection ? "connection" : "total");
      return absl::ResourceExhaustedError(absl::StrCat(
          rpc, " of ", bytes, " request bytes refused: ", in_flight, " bytes already in flight ",
          over_connection ? absl::StrCat("on connection ", peer) : std::string("on this shard"),
          ", limit ",
          over_connection ? absl::StrCat(options_.per_connection, " (--max_inflight_bytes_per_connection)")
                          : absl::StrCat(options_.total, " (--max_inflight_bytes)"),
          "; retry later"));
    }
    held += bytes;
    total_ += bytes;
    if (metrics_ != nullptr) metrics_->inflight_request_bytes.Set(static_cast<double>(total_));
  }
  return std::shared_ptr<const Ticket>(new Ticket(this, std::string(peer), bytes));
}

void InflightLimit::Release(const std::string& peer, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = per_peer_.find(peer);
  if (it != per_peer_.end()) {
    it->second -= bytes;
    if (it->second == 0) per_peer_.erase(it);
  }
  total_ -= bytes;
  if (metrics_ != nullptr) metrics_->inflight_request_bytes.Set(static_cast<double>(total_));
}

uint64_t InflightLimit::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

}  // namespace ember
