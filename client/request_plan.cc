#include "client/request_plan.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/uninitialized_resize.h"
#include "ember/client.h"

namespace ember {

void RequestPlan::Route(const Client& client, const std::vector<std::string>& tables,
                        const std::vector<uint32_t>& dims,
                        const std::vector<std::vector<uint64_t>>& keys) {
  client_ = &client;
  tables_ = &tables;
  dims_ = &dims;
  keys_ = &keys;
  const uint32_t n = client.shard_count();
  members_.resize(n);
  total_keys_ = 0;
  for (auto& per_table : members_) {
    per_table.resize(keys.size());
    for (auto& m : per_table) m.clear();
  }
  for (size_t tb = 0; tb < keys.size(); ++tb) {
    const std::vector<uint64_t>& k = keys[tb];
    total_keys_ += k.size();
    for (uint32_t u = 0; u < k.size(); ++u) members_[client.ShardOf(k[u])][tb].push_back(u);
  }
}

bool RequestPlan::HasKeys(uint32_t shard) const {
  for (const auto& m : members_[shard]) {
    if (!m.empty()) return true;
  }
  return false;
}

template <typename KeepFn>
uint64_t RequestPlan::AddLookup(uint32_t shard, bool read_only, v1::LookupRequest* request,
                                bool omit_rows, KeepFn keep) const {
  uint64_t bytes = 0;
  for (size_t tb = 0; tb < members_[shard].size(); ++tb) {
    const std::vector<uint32_t>& m = members_[shard][tb];
    size_t n = 0;
    for (uint32_t k : m) n += keep(tb, k);
    if (n == 0) continue;
    const uint64_t* keys = (*keys_)[tb].data();
    v1::TableLookup* t = request->add_tables();
    t->set_table((*tables_)[tb]);
    t->set_dtype(v1::DTYPE_FP32);
    t->set_read_only(read_only);
    t->set_omit_rows(omit_rows);
    std::string* out = t->mutable_keys();
    ResizeUninitialized(out, n * 8);
    char* dst = out->data();
    for (uint32_t k : m) {
      if (!keep(tb, k)) continue;
      memcpy(dst, &keys[k], 8);
      dst += 8;
    }
    bytes += out->size();
  }
  return bytes;
}

uint64_t RequestPlan::FillLookup(uint32_t shard, bool read_only, v1::LookupRequest* request,
                                 bool omit_rows) const {
  return AddLookup(shard, read_only, request, omit_rows, [](size_t, uint32_t) { return true; });
}

uint64_t RequestPlan::FillLookupOf(uint32_t shard, bool read_only, v1::LookupRequest* request,
                                   bool omit_rows,
                                   const std::vector<std::vector<uint8_t>>& keep) const {
  return AddLookup(shard, read_only, request, omit_rows,
                   [&](size_t tb, uint32_t k) { return keep[tb][k] != 0; });
}

template <typename RowFn>
uint64_t RequestPlan::AddPush(uint32_t shard, v1::PushRequest* request, RowFn row) const {
  uint64_t bytes = 0;
  for (size_t tb = 0; tb < members_[shard].size(); ++tb) {
    const std::vector<uint32_t>& m = members_[shard][tb];
    if (m.empty()) continue;
    const size_t dim = (*dims_)[tb];
    const uint64_t* keys = (*keys_)[tb].data();
    v1::TableGradients* t = request->add_tables();
    t->set_table((*tables_)[tb]);
    t->set_dtype(v1::DTYPE_FP32);
    std::string* k = t->mutable_keys();
    std::string* g = t->mutable_gradients();
    ResizeUninitialized(k, m.size() * 8);
    ResizeUninitialized(g, m.size() * dim * 4);
    for (size_t j = 0; j < m.size(); ++j) {
      memcpy(k->data() + j * 8, &keys[m[j]], 8);
      row(tb, m[j], g->data() + j * dim * 4);
    }
    bytes += k->size() + g->size();
  }
  return bytes;
}

uint64_t RequestPlan::FillPush(uint32_t shard, const std::vector<const float*>& grads,
                               v1::PushRequest* request) const {
  return AddPush(shard, request, [&](size_t tb, uint32_t k, char* row) {
    const size_t dim = (*dims_)[tb];
    memcpy(row, grads[tb] + k * dim, dim * 4);
  });
}

uint64_t RequestPlan::FillPushInPlace(uint32_t shard, v1::PushRequest* request,
                                      std::vector<std::vector<float*>>* at) const {
  return AddPush(shard, request, [&](size_t tb, uint32_t k, char* row) {
    // The field is a heap buffer (or, when short, inside the message), at
    // least 4-aligned; its rows are floats from here on.
    (*at)[tb][k] = reinterpret_cast<float*>(row);
  });
}

namespace {

// The rows of a LookupResponse, in its fields.
struct FieldRows {
  const v1::LookupResponse& r;
  int tables_size() const { return r.tables_size(); }
  size_t rows_size(int i) const { return r.tables(i).rows().size(); }
  const std::string& changed(int i) const { return r.tables(i).changed(); }
  template <typename Fn>
  void ForEachRow(int i, size_t row_bytes, Fn fn) const {
    const std::string& rows = r.tables(i).rows();
    for (size_t j = 0; j < rows.size() / row_bytes; ++j) fn(j, rows.data() + j * row_bytes);
  }
};

// The rows of an exchange's lookup, wherever the answer holds them.
struct AnswerRows {
  const ExchangeAnswer& a;
  int tables_size() const { return a.message().lookup().tables_size(); }
  size_t rows_size(int i) const { return a.rows_size(i); }
  const std::string& changed(int i) const { return a.message().lookup().tables(i).changed(); }
  template <typename Fn>
  void ForEachRow(int i, size_t row_bytes, Fn fn) const {
    a.ForEachRow(i, row_bytes, fn);
  }
};

// A ForEachRow callback that copies each row to its key's place in `rows`.
auto CopyRowTo(const std::vector<float*>& rows, const std::vector<uint32_t>& dims) {
  return [&rows, &dims](size_t tb, uint32_t k, const char* row) {
    memcpy(rows[tb] + size_t{k} * dims[tb], row, dims[tb] * sizeof(float));
  };
}

}  // namespace

template <typename Rows, typename RowFn>
absl::Status RequestPlan::ForEachRow(uint32_t shard, const Rows& rows, uint64_t* received,
                                     RowFn row, bool partial) const {
  int entry = 0;
  std::vector<uint32_t> held;  // with a partial answer: the keys it holds rows of
  for (size_t tb = 0; tb < members_[shard].size(); ++tb) {
    const std::vector<uint32_t>& m = members_[shard][tb];
    if (m.empty()) continue;
    const size_t row_bytes = size_t{(*dims_)[tb]} * 4;
    if (entry >= rows.tables_size()) {
      return absl::InternalError(absl::StrCat(client_->ShardName(shard), " table '", (*tables_)[tb],
                                              "' field 'rows': expected ", m.size() * row_bytes,
                                              " bytes, received none"));
    }
    const std::string& changed = rows.changed(entry);
    const std::vector<uint32_t>* keys = &m;
    if (!changed.empty()) {
      if (!partial || changed.size() != m.size()) {
        return absl::InternalError(absl::StrCat(
            client_->ShardName(shard), " table '", (*tables_)[tb], "' field 'changed': expected ",
            partial ? absl::StrCat(m.size(), " bytes") : "none (every row asked for)",
            ", received ", changed.size(), " bytes"));
      }
      held.clear();
      for (size_t j = 0; j < m.size(); ++j) {
        if (changed[j]) held.push_back(m[j]);
      }
      keys = &held;
    }
    const size_t expected = keys->size() * row_bytes;
    const size_t got = rows.rows_size(entry);
    if (got != expected) {
      return absl::InternalError(absl::StrCat(client_->ShardName(shard), " table '",
                                              (*tables_)[tb], "' field 'rows': expected ",
                                              expected, " bytes, received ", got));
    }
    *received += got;
    if (row_bytes == 0) {  // no rows to read (a zero dim)
      ++entry;
      continue;
    }
    rows.ForEachRow(entry++, row_bytes,
                    [&](size_t j, const char* address) { row(tb, (*keys)[j], address); });
  }
  return absl::OkStatus();
}

absl::Status RequestPlan::ScatterRows(uint32_t shard, const v1::LookupResponse& response,
                                      const std::vector<float*>& rows, uint64_t* received) const {
  return ForEachRow(shard, FieldRows{response}, received, CopyRowTo(rows, *dims_));
}

absl::Status RequestPlan::ScatterRows(uint32_t shard, const ExchangeAnswer& response,
                                      const std::vector<float*>& rows, uint64_t* received) const {
  return ForEachRow(shard, AnswerRows{response}, received, CopyRowTo(rows, *dims_));
}

absl::Status RequestPlan::RowAddresses(uint32_t shard, const ExchangeAnswer& response,
                                       std::vector<std::vector<const char*>>* at,
                                       uint64_t* received) const {
  return ForEachRow(shard, AnswerRows{response}, received,
                    [&](size_t tb, uint32_t k, const char* row) { (*at)[tb][k] = row; });
}

absl::Status RequestPlan::ChangedRowAddresses(uint32_t shard, const ExchangeAnswer& response,
                                              std::vector<std::vector<const char*>>* at,
                                              uint64_t* received, uint64_t* rows) const {
  return ForEachRow(
      shard, AnswerRows{response}, received,
      [&](size_t tb, uint32_t k, const char* row) {
        (*at)[tb][k] = row;
        ++*rows;
      },
      /*partial=*/true);
}

std::vector<std::shared_ptr<const v1::ExchangeRequest>> HandOver(
    std::vector<v1::ExchangeRequest>* requests) {
  std::vector<std::shared_ptr<const v1::ExchangeRequest>> shared;
  shared.reserve(requests->size());
  for (v1::ExchangeRequest& r : *requests) {
    auto owned = std::make_shared<v1::ExchangeRequest>();
    owned->Swap(&r);
    shared.push_back(std::move(owned));
  }
  return shared;
}

void LookupClock::Stamp(int64_t step, v1::LookupRequest* lookup) const {
  if (staleness < 0) return;
  lookup->set_step(step);
  lookup->set_staleness(static_cast<uint32_t>(staleness));
  lookup->set_worker_id(worker_id);
}

uint64_t RequestPlan::FillLookups(int64_t step, const LookupClock& clock,
                                  std::vector<v1::ExchangeRequest>* requests) const {
  uint64_t bytes = 0;
  for (uint32_t sh = 0; sh < shards(); ++sh) {
    if (!HasKeys(sh)) continue;
    v1::LookupRequest* lookup = (*requests)[sh].mutable_lookup();
    bytes += FillLookup(sh, /*read_only=*/false, lookup);
    clock.Stamp(step, lookup);
  }
  return bytes;
}

void RequestPlan::PointAt(const std::vector<const float*>& rows,
                          std::vector<std::vector<const char*>>* at) const {
  at->resize(keys_->size());
  for (size_t tb = 0; tb < keys_->size(); ++tb) {
    std::vector<const char*>& a = (*at)[tb];
    a.resize((*keys_)[tb].size());
    if (rows[tb] == nullptr) continue;
    const size_t dim = (*dims_)[tb];
    for (size_t k = 0; k < a.size(); ++k) {
      a[k] = reinterpret_cast<const char*>(rows[tb] + k * dim);
    }
  }
}

absl::Status RequestPlan::CollectRowAddresses(const std::vector<ExchangeAnswer>& answers,
                                              const std::vector<const float*>* under,
                                              std::vector<std::vector<const char*>>* at,
                                              uint64_t* received, uint64_t* changed) const {
  if (under != nullptr) {
    PointAt(*under, at);
  } else {
    at->resize(keys_->size());
    for (size_t tb = 0; tb < keys_->size(); ++tb) (*at)[tb].resize((*keys_)[tb].size());
  }
  for (uint32_t sh = 0; sh < shards(); ++sh) {
    if (!HasKeys(sh)) continue;
    EMBER_RETURN_IF_ERROR(under != nullptr
                              ? ChangedRowAddresses(sh, answers[sh], at, received, changed)
                              : RowAddresses(sh, answers[sh], at, received));
  }
  return absl::OkStatus();
}

}  // namespace ember
