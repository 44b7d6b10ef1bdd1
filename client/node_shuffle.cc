#include "ember/node_shuffle.h"

#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/key_hash.h"
#include "common/status_macros.h"

namespace ember {
namespace {

// Blocks are, per table, a uint64 count followed by that many items.
class BlockWriter {
 public:
  explicit BlockWriter(std::vector<uint8_t>* out) : out_(out) { out_->clear(); }
  template <typename T>
  void Section(const T* items, size_t count) {
    const uint64_t n = count;
    Append(&n, sizeof(n));
    Append(items, count * sizeof(T));
  }
  template <typename T>
  void SectionGathered(const T* base, size_t width, absl::Span<const uint32_t> rows) {
    const uint64_t n = rows.size();
    Append(&n, sizeof(n));
    for (uint32_t r : rows) Append(base + size_t{r} * width, width * sizeof(T));
  }

 private:
  void Append(const void* p, size_t bytes) {
    const size_t at = out_->size();
    out_->resize(at + bytes);
    if (bytes != 0) std::memcpy(out_->data() + at, p, bytes);
  }
  std::vector<uint8_t>* out_;
};

class BlockReader {
 public:
  BlockReader(const std::vector<uint8_t>& block, uint32_t from) : block_(block), from_(from) {}
  // The next section: `width` items of T per entry; returns the entry count.
  template <typename T>
  absl::StatusOr<absl::Span<const T>> Section(size_t width) {
    uint64_t n = 0;
    if (at_ + sizeof(n) > block_.size()) return Truncated();
    std::memcpy(&n, block_.data() + at_, sizeof(n));
    at_ += sizeof(n);
    const size_t bytes = n * width * sizeof(T);
    if (n > block_.size() || at_ + bytes > block_.size()) return Truncated();
    absl::Span<const T> items(reinterpret_cast<const T*>(block_.data() + at_), n * width);
    at_ += bytes;
    return items;
  }

 private:
  absl::Status Truncated() const {
    return absl::DataLossError(
        absl::StrCat("node shuffle: block from rank ", from_, " is truncated at byte ", at_,
                     " of ", block_.size()));
  }
  const std::vector<uint8_t>& block_;
  uint32_t from_;
  size_t at_ = 0;
};

}  // namespace

uint32_t OwnerRank(uint64_t key, uint32_t ranks) {
  return static_cast<uint32_t>(((Mix64(key ^ 0xbb67ae8584caa73bULL) >> 32) * ranks) >> 32);
}

NodeShuffle::NodeShuffle(ShuffleTransport* transport, std::vector<uint32_t> dims, Owner owner)
    : transport_(transport), dims_(std::move(dims)), owner_(std::move(owner)) {
  if (!owner_) owner_ = [n = transport_->size()](uint64_t key) { return OwnerRank(key, n); };
}

uint32_t NodeShuffle::rank() const { return transport_->rank(); }
uint32_t NodeShuffle::ranks() const { return transport_->size(); }

absl::Status NodeShuffle::Exchange(const std::vector<std::vector<uint8_t>>& send,
                                    std::vector<std::vector<uint8_t>>* recv) {
  for (const auto& b : send) bytes_sent_ += b.size();
  EMBER_RETURN_IF_ERROR(transport_->AllToAll(send, recv));
  if (recv->size() != ranks()) {
    return absl::InternalError(absl::StrCat("node shuffle: transport returned ", recv->size(),
                                            " blocks for ", ranks(), " ranks"));
  }
  for (const auto& b : *recv) bytes_received_ += b.size();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<uint64_t>>> NodeShuffle::RouteKeys(
    const std::vector<std::vector<uint64_t>>& unique_keys) {
  const uint32_t n = ranks();
  if (unique_keys.size() != dims_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("node shuffle: field 'unique_keys': expected ",
                                                   dims_.size(), " tables, received ",
                                                   unique_keys.size()));
  }
  // Checked before any communication: a repeated key would be fetched once
  // but its rows and gradients routed twice.
  for (size_t t = 0; t < unique_keys.size(); ++t) {
    absl::flat_hash_set<uint64_t> seen(unique_keys[t].size());
    for (uint64_t k : unique_keys[t]) {
      if (!seen.insert(k).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "node shuffle: table ", t, " field 'unique_keys': key ", k, " appears twice"));
      }
    }
  }
  // Partition each table's keys by owner, remembering where each came from.
  std::vector<std::vector<uint64_t>> by_owner(n);
  std::vector<std::vector<uint8_t>> send(n);
  std::vector<BlockWriter> writers;
  for (uint32_t r = 0; r < n; ++r) writers.emplace_back(&send[r]);
  Route routes(dims_.size());
  for (size_t t = 0; t < dims_.size(); ++t) {
    TableRoute& route = routes[t];
    route.sent_pos.assign(n, {});
    route.mine = unique_keys[t].size();
    for (auto& v : by_owner) v.clear();
    for (size_t i = 0; i < unique_keys[t].size(); ++i) {
      const uint32_t owner = owner_(unique_keys[t][i]);
      by_owner[owner].push_back(unique_keys[t][i]);
      route.sent_pos[owner].push_back(static_cast<uint32_t>(i));
    }
    for (uint32_t r = 0; r < n; ++r) writers[r].Section(by_owner[r].data(), by_owner[r].size());
  }
  std::vector<std::vector<uint8_t>> recv;
  EMBER_RETURN_IF_ERROR(Exchange(send, &recv));

  std::vector<BlockReader> readers;
  for (uint32_t s = 0; s < n; ++s) readers.emplace_back(recv[s], s);
  std::vector<std::vector<uint64_t>> owned(dims_.size());
  for (size_t t = 0; t < dims_.size(); ++t) {
    TableRoute& route = routes[t];
    route.owned_idx.assign(n, {});
    absl::flat_hash_map<uint64_t, uint32_t> index;
    for (uint32_t s = 0; s < n; ++s) {
      EMBER_ASSIGN_OR_RETURN(absl::Span<const uint64_t> keys, readers[s].Section<uint64_t>(1));
      route.owned_idx[s].reserve(keys.size());
      for (uint64_t k : keys) {
        auto [it, fresh] = index.try_emplace(k, static_cast<uint32_t>(owned[t].size()));
        if (fresh) owned[t].push_back(k);
        route.owned_idx[s].push_back(it->second);
      }
    }
    route.owned = owned[t].size();
  }
  routes_.push_back(std::move(routes));
  return owned;
}

absl::Status NodeShuffle::CheckRows(const Route* route,
                                     const std::vector<absl::Span<const float>>& rows, bool owned,
                                     absl::string_view what) const {
  if (route == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("node shuffle: ", what, " before RouteKeys"));
  }
  if (rows.size() != dims_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("node shuffle: field '", what,
                                                   "': expected ", dims_.size(),
                                                   " tables, received ", rows.size()));
  }
  for (size_t t = 0; t < dims_.size(); ++t) {
    const size_t expected = (owned ? (*route)[t].owned : (*route)[t].mine) * dims_[t];
    if (rows[t].size() != expected) {
      return absl::InvalidArgumentError(absl::StrCat("node shuffle: table ", t, " field '", what,
                                                     "': expected ", expected,
                                                     " floats, received ", rows[t].size()));
    }
  }
  return absl::OkStatus();
}

template <typename Place>
absl::Status NodeShuffle::TradeRows(const Route& route,
                                     const std::vector<absl::Span<const float>>& rows,
                                     IndexLists TableRoute::*send, IndexLists TableRoute::*recv,
                                     Place place) {
  const uint32_t n = ranks();
  std::vector<std::vector<uint8_t>> out(n);
  for (uint32_t r = 0; r < n; ++r) {
    BlockWriter w(&out[r]);
    for (size_t t = 0; t < dims_.size(); ++t) {
      w.SectionGathered(rows[t].data(), dims_[t], (route[t].*send)[r]);
    }
  }
  std::vector<std::vector<uint8_t>> in;
  EMBER_RETURN_IF_ERROR(Exchange(out, &in));
  // Sources in rank order: a sum does not depend on who arrived first.
  for (uint32_t r = 0; r < n; ++r) {
    BlockReader reader(in[r], r);
    for (size_t t = 0; t < dims_.size(); ++t) {
      const uint32_t dim = dims_[t];
      EMBER_ASSIGN_OR_RETURN(absl::Span<const float> got, reader.Section<float>(dim));
      const std::vector<uint32_t>& at = (route[t].*recv)[r];
      if (got.size() != at.size() * dim) {
        return absl::DataLossError(absl::StrCat("node shuffle: rank ", r, " sent ",
                                                got.size() / dim, " rows of table ", t, " for ",
                                                at.size(), " keys"));
      }
      for (size_t i = 0; i < at.size(); ++i) place(t, at[i], got.data() + i * dim);
    }
  }
  return absl::OkStatus();
}

absl::Status NodeShuffle::ShareRows(const std::vector<absl::Span<const float>>& owned_rows,
                                     const std::vector<float*>& mine) {
  const Route* route = routes_.empty() ? nullptr : &routes_.back();
  EMBER_RETURN_IF_ERROR(CheckRows(route, owned_rows, /*owned=*/true, "owned_rows"));
  // Each source gets the rows of the keys it sent here, in its order.
  return TradeRows(*route, owned_rows, &TableRoute::owned_idx, &TableRoute::sent_pos,
                   [&](size_t t, uint32_t pos, const float* row) {
                     std::memcpy(mine[t] + size_t{pos} * dims_[t], row, dims_[t] * sizeof(float));
                   });
}

absl::StatusOr<std::vector<std::vector<float>>> NodeShuffle::ShareRows(
    const std::vector<absl::Span<const float>>& owned_rows) {
  std::vector<std::vector<float>> mine(dims_.size());
  std::vector<float*> out(dims_.size());
  for (size_t t = 0; t < dims_.size(); ++t) {
    mine[t].resize(unique_floats(t));
    out[t] = mine[t].data();
  }
  EMBER_RETURN_IF_ERROR(ShareRows(owned_rows, out));
  return mine;
}

absl::Status NodeShuffle::ReduceGradients(const std::vector<absl::Span<const float>>& grads,
                                           const std::vector<float*>& owned) {
  const Route* route = routes_.empty() ? nullptr : &routes_.front();
  EMBER_RETURN_IF_ERROR(CheckRows(route, grads, /*owned=*/false, "grads"));
  for (size_t t = 0; t < dims_.size(); ++t) std::fill_n(owned[t], owned_floats(t), 0.0f);
  absl::Status s = TradeRows(*route, grads, &TableRoute::sent_pos, &TableRoute::owned_idx,
                             [&](size_t t, uint32_t idx, const float* g) {
                               float* dst = owned[t] + size_t{idx} * dims_[t];
                               for (uint32_t j = 0; j < dims_[t]; ++j) dst[j] += g[j];
                             });
  routes_.pop_front();  // reduced (or failed: the step's push is lost either way)
  return s;
}

absl::StatusOr<std::vector<std::vector<float>>> NodeShuffle::ReduceGradients(
    const std::vector<absl::Span<const float>>& grads) {
  std::vector<std::vector<float>> owned(dims_.size());
  std::vector<float*> out(dims_.size());
  for (size_t t = 0; t < dims_.size(); ++t) {
    owned[t].resize(owned_floats(t));
    out[t] = owned[t].data();
  }
  EMBER_RETURN_IF_ERROR(ReduceGradients(grads, out));
  return owned;
}

}  // namespace ember
