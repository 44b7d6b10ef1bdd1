// RequestPlan: which shard serves each of a step's keys, kept as index
// arrays, and the wire messages built from and decoded into flat per-table
// buffers through them. The step pipeline, the node merger and
// Client::LookupRows all route this way, so there is one copy of the rule.
//
// Keys are given per table (unique within a table; the plan does not
// deduplicate). Rows and gradients are per table, `keys[tb].size() x
// dim[tb]` floats in key order, host memory. Not thread-safe; a plan is
// rebuilt (Route) for every step and reuses its memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ember/exchange_answer.h"
#include "ember/v1/embedding_service.pb.h"

namespace ember {

class Client;

// Moves each request into a shared one, for Client::Exchange to send without
// copying its keys and gradients; leaves `requests` empty messages.
std::vector<std::shared_ptr<const v1::ExchangeRequest>> HandOver(
    std::vector<v1::ExchangeRequest>* requests);

// The consistency fields a worker's lookups carry.
struct LookupClock {
  int staleness = -1;  // < 0: asynchronous, no fields
  uint32_t worker_id = 0;
  // Sets the lookup's step, staleness and worker (none when asynchronous).
  void Stamp(int64_t step, v1::LookupRequest* lookup) const;
};

class RequestPlan {
 public:
  // Routes every key of every table to its shard. `tables` and `dims` name
  // and size the tables (same length as `keys`); the plan keeps pointers to
  // all three, which must outlive it or the next Route.
  void Route(const Client& client, const std::vector<std::string>& tables,
             const std::vector<uint32_t>& dims, const std::vector<std::vector<uint64_t>>& keys);

  uint32_t shards() const { return static_cast<uint32_t>(members_.size()); }
  // Whether shard `shard` serves any key of the plan.
  bool HasKeys(uint32_t shard) const;
  // The keys of the plan.
  uint64_t keys() const { return total_keys_; }

  // Indices into keys[table] of the keys `shard` serves, in request order.
  const std::vector<uint32_t>& members(uint32_t shard, size_t table) const {
    return members_[shard][table];
  }

  // Adds one TableLookup per table with keys on `shard` (fp32 rows, writing
  // lookups unless `read_only`, without rows in the answer if `omit_rows`);
  // returns the key bytes written.
  uint64_t FillLookup(uint32_t shard, bool read_only, v1::LookupRequest* request,
                      bool omit_rows = false) const;
  // A writing lookup of `step` for every shard with keys, in each
  // request's lookup (requests->size() == shards()), stamped by `clock`.
  // Returns the key bytes written.
  uint64_t FillLookups(int64_t step, const LookupClock& clock,
                       std::vector<v1::ExchangeRequest>* requests) const;
  // FillLookup of only the keys `keep` marks (keep[tb][k] != 0, one entry
  // per key of keys[tb]); a table with none of them on `shard` is left out.
  uint64_t FillLookupOf(uint32_t shard, bool read_only, v1::LookupRequest* request, bool omit_rows,
                        const std::vector<std::vector<uint8_t>>& keep) const;
  // Adds one TableGradients per table with keys on `shard`: its keys and
  // their rows of `grads[tb]`. Returns the payload bytes written.
  uint64_t FillPush(uint32_t shard, const std::vector<const float*>& grads,
                    v1::PushRequest* request) const;
  // FillPush with the gradients summed in place: the request's `gradients`
  // fields are sized but not written, and (*at)[tb][k], for each key k of
  // table tb on `shard`, is set to the address of key k's row in them
  // (dim[tb] floats), for the caller to write before sending. The addresses stay valid
  // while the request is not modified. (*at)[tb] must have keys[tb].size()
  // entries. Returns the payload bytes.
  uint64_t FillPushInPlace(uint32_t shard, v1::PushRequest* request,
                           std::vector<std::vector<float*>>* at) const;
  // Copies `response` (the answer to FillLookup's request for `shard`, or
  // the lookup of an exchange's) into `rows[tb]`; INTERNAL naming the shard,
  // table and field if its shape is not the one asked for. Adds the row
  // bytes read to `*received`.
  absl::Status ScatterRows(uint32_t shard, const v1::LookupResponse& response,
                           const std::vector<float*>& rows, uint64_t* received) const;
  absl::Status ScatterRows(uint32_t shard, const ExchangeAnswer& response,
                           const std::vector<float*>& rows, uint64_t* received) const;
  // ScatterRows without the copy: sets at[tb][k], for each key k of table tb
  // on `shard`, to the address of its row (dim[tb] floats, possibly
  // unaligned: read with memcpy) inside `response`, valid while `response`
  // lives unchanged. (*at)[tb] must have keys[tb].size() entries. Same
  // errors as ScatterRows.
  absl::Status RowAddresses(uint32_t shard, const ExchangeAnswer& response,
                            std::vector<std::vector<const char*>>* at, uint64_t* received) const;
  // RowAddresses of a lookup that asked for changed rows only
  // (TableLookup.changed_since): where the answer says which keys it holds
  // (TableRows.changed), only theirs are set and the others' entries are
  // left as they were; otherwise every key's. Adds the rows set to *rows.
  absl::Status ChangedRowAddresses(uint32_t shard, const ExchangeAnswer& response,
                                   std::vector<std::vector<const char*>>* at, uint64_t* received,
                                   uint64_t* rows) const;
  // Sets (*at)[tb][k] (sized here) to the address of key k's row in
  // rows[tb] (keys[tb].size() x dim[tb] floats, in key order); a table
  // whose rows[tb] is null is sized only.
  void PointAt(const std::vector<const float*>& rows,
               std::vector<std::vector<const char*>>* at) const;
  // The rows of every shard's answer by address (RowAddresses) into *at,
  // sized here. With `under` (rows in key order per table, null for none),
  // the lookups asked for changed rows only: PointAt(*under) first, then
  // ChangedRowAddresses, adding the rows that came to *changed.
  absl::Status CollectRowAddresses(const std::vector<ExchangeAnswer>& answers,
                                   const std::vector<const float*>* under,
                                   std::vector<std::vector<const char*>>* at, uint64_t* received,
                                   uint64_t* changed) const;

 private:
  // Adds shard's TableGradients with their keys and a gradients field of
  // the right size, then calls row(tb, k, address) for each key's row in it.
  // FillLookup's work over the keys keep(tb, k) is true for.
  template <typename KeepFn>
  uint64_t AddLookup(uint32_t shard, bool read_only, v1::LookupRequest* request, bool omit_rows,
                     KeepFn keep) const;
  template <typename RowFn>
  uint64_t AddPush(uint32_t shard, v1::PushRequest* request, RowFn row) const;
  // Checks the shape of `rows` (a view of a lookup's answer: FieldRows or
  // AnswerRows in the .cc) as ScatterRows does, then calls
  // row(tb, k, address) for each of its rows. With `partial`, a table's
  // answer may hold the rows of some keys only (TableRows.changed);
  // without, such an answer is INTERNAL.
  template <typename Rows, typename RowFn>
  absl::Status ForEachRow(uint32_t shard, const Rows& rows, uint64_t* received, RowFn row,
                          bool partial = false) const;

  const Client* client_ = nullptr;
  const std::vector<std::string>* tables_ = nullptr;
  const std::vector<uint32_t>* dims_ = nullptr;
  const std::vector<std::vector<uint64_t>>* keys_ = nullptr;
  // members_[shard][table]: indices into keys[table] of the keys shard owns.
  std::vector<std::vector<std::vector<uint32_t>>> members_;
  uint64_t total_keys_ = 0;
};

}  // namespace ember
