// ember::NodeShuffle: the GPUs of one trainer node share their embedding
// traffic, so that each unique key of a step is fetched and pushed once per
// node rather than once per GPU.
//
// Every key has an owner rank, OwnerRank(key, ranks). One step, on every rank
// (collectively, in the same order):
//
//   1. RouteKeys(my unique keys per table): the keys go to their owners; each
//      rank gets back the union of the keys it owns (deduplicated over the
//      node, in order of first arrival: rank 0's first).
//   2. The rank fetches the rows of its owned keys from the cluster (one
//      request per shard, as a single GPU would) ...
//   3. ShareRows(owned rows): ... and sends each rank the rows it asked for;
//      every rank gets the rows of its own unique keys, in its order.
//   4. After the backward pass, ReduceGradients(my gradients per unique key):
//      they go to the owners, which sum them per key in rank order; the
//      owner pushes the sums to the cluster once.
//
// Steps may overlap (with SSP staleness s >= 1 the fetch of step t goes out
// before the push of step t - 1): ShareRows uses the latest RouteKeys, and
// ReduceGradients the oldest one not yet reduced, which it then forgets. So
// every RouteKeys is followed by one ShareRows and, in step order, by one
// ReduceGradients.
//
// The sums are deterministic (rank order, whatever the thread timing).
// Against one GPU that summed every occurrence of the node's batch in
// order, they agree exactly whenever the additions are exact, and otherwise
// to rounding: each rank adds its own duplicates first.
//
// The algorithm runs over a small transport (an all-to-all of byte blocks):
// an in-process one (threads, for tests and single-process trainers) and an
// NCCL one for GPUs (ember/nccl_transport.h).
//
// Thread safety: one NodeShuffle per rank, each driven by one thread; the
// ranks of a group run concurrently. Memory: host memory throughout.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ember {

// The owner of `key` among `ranks` ranks. Salted apart from the shard
// routing so that one GPU does not own all the keys of one shard.
uint32_t OwnerRank(uint64_t key, uint32_t ranks);

// An all-to-all of byte blocks among the ranks of a group.
class ShuffleTransport {
 public:
  virtual ~ShuffleTransport() = default;
  virtual uint32_t rank() const = 0;
  virtual uint32_t size() const = 0;
  // Collective: every rank calls it, in the same order. send[r] (size()
  // blocks) goes to rank r; on return recv[r] holds what rank r sent here.
  // An error on any rank may leave the others blocked until their own
  // transport gives up; the group is then unusable.
  virtual absl::Status AllToAll(const std::vector<std::vector<uint8_t>>& send,
                                std::vector<std::vector<uint8_t>>* recv) = 0;
};

// `size` connected in-process transports (rank i at index i), for one
// thread per rank. They share state: destroy them only after every rank
// stopped calling.
std::vector<std::unique_ptr<ShuffleTransport>> NewInProcessTransports(uint32_t size);

class NodeShuffle {
 public:
  // Which rank owns `key` (below ranks()); the same function on every rank.
  using Owner = std::function<uint32_t(uint64_t key)>;

  // `dims[t]` is table t's row width. `transport` must outlive this.
  // `owner`: empty for OwnerRank(key, ranks()) (every rank owns a share of
  // every shard's keys); a pipeline whose node is one SSP worker passes the
  // key's shard modulo ranks, so each shard hears from one rank only.
  NodeShuffle(ShuffleTransport* transport, std::vector<uint32_t> dims, Owner owner = {});

  uint32_t rank() const;
  uint32_t ranks() const;

  // Step 1. `unique_keys[t]`: this rank's keys of table t, each once.
  // Returns, per table, the keys this rank owns and must fetch and push.
  // INVALID_ARGUMENT if the table count is wrong or a key repeats; that is
  // found before any communication, so the other ranks' transports then
  // time out (the in-process one after its timeout).
  absl::StatusOr<std::vector<std::vector<uint64_t>>> RouteKeys(
      const std::vector<std::vector<uint64_t>>& unique_keys);

  // Step 3. `owned_rows[t]`: (owned keys of t) x dims[t] floats, in the order
  // RouteKeys returned. Writes, per table, the rows of this rank's unique
  // keys in the order given to RouteKeys into `mine[t]` ((unique keys of t)
  // x dims[t] floats, the caller's memory).
  absl::Status ShareRows(const std::vector<absl::Span<const float>>& owned_rows,
                         const std::vector<float*>& mine);
  // The same, into new buffers (for tools and tests).
  absl::StatusOr<std::vector<std::vector<float>>> ShareRows(
      const std::vector<absl::Span<const float>>& owned_rows);

  // Step 4. `grads[t]`: (this rank's unique keys of t) x dims[t] floats, in
  // the order of the oldest RouteKeys not yet reduced. Writes, per table, the summed gradients of the owned
  // keys, in RouteKeys' returned order, into `owned[t]` ((owned keys of t) x
  // dims[t] floats, the caller's memory; overwritten).
  absl::Status ReduceGradients(const std::vector<absl::Span<const float>>& grads,
                               const std::vector<float*>& owned);
  // The same, into new buffers (for tools and tests).
  absl::StatusOr<std::vector<std::vector<float>>> ReduceGradients(
      const std::vector<absl::Span<const float>>& grads);

  // Floats of table t in the next ShareRows' output (this rank's unique keys
  // of the latest RouteKeys) and the next ReduceGradients' output (the owned
  // keys of the oldest RouteKeys not yet reduced); 0 before any RouteKeys.
  size_t unique_floats(size_t t) const {
    return routes_.empty() ? 0 : routes_.back()[t].mine * dims_[t];
  }
  size_t owned_floats(size_t t) const {
    return routes_.empty() ? 0 : routes_.front()[t].owned * dims_[t];
  }

  // Bytes this rank sent and received through the transport so far.
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }

 private:
  // Per table: which of my unique keys went to which owner, and where each
  // owner-side key came from.
  using IndexLists = std::vector<std::vector<uint32_t>>;  // [rank][i]
  struct TableRoute {
    IndexLists sent_pos;   // [owner][i]: index in my unique keys
    IndexLists owned_idx;  // [source][i]: index in my owned keys
    size_t mine = 0;                               // my unique keys
    size_t owned = 0;                              // my owned keys
  };

  absl::Status Exchange(const std::vector<std::vector<uint8_t>>& send,
                        std::vector<std::vector<uint8_t>>* recv);
  // Sends rank r, per table, rows[t] at (route.*send)[r]; passes each row
  // received from rank r to place(t, (route.*recv)[r][i], row), ranks in order.
  using Route = std::vector<TableRoute>;  // [table]
  template <typename Place>
  absl::Status TradeRows(const Route& route, const std::vector<absl::Span<const float>>& rows,
                         IndexLists TableRoute::*send, IndexLists TableRoute::*recv, Place place);
  // FAILED_PRECONDITION before any RouteKeys; INVALID_ARGUMENT unless rows
  // has route's shape (owned or mine keys per table).
  absl::Status CheckRows(const Route* route, const std::vector<absl::Span<const float>>& rows,
                         bool owned, absl::string_view what) const;

  ShuffleTransport* transport_;
  std::vector<uint32_t> dims_;
  Owner owner_;
  // Routed steps not yet reduced, oldest first.
  std::deque<Route> routes_;
  uint64_t bytes_sent_ = 0;
  uint64_t bytes_received_ = 0;
};

}  // namespace ember
