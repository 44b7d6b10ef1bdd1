#include "client/request_plan.h"

#include <cstring>

#include "absl/strings/str_cat.h"
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

uint64_t RequestPlan::FillLookup(uint32_t shard, bool read_only,
                                 v1::LookupRequest* request) const {
  uint64_t bytes = 0;
  for (size_t tb = 0; tb < members_[shard].size(); ++tb) {
    const std::vector<uint32_t>& m = members_[shard][tb];
    if (m.empty()) continue;
    const uint64_t* keys = (*keys_)[tb].data();
    v1::TableLookup* t = request->add_tables();
    t->set_table((*tables_)[tb]);
    t->set_dtype(v1::DTYPE_FP32);
    t->set_read_only(read_only);
    std::string* out = t->mutable_keys();
    ResizeUninitialized(out, m.size() * 8);
    char* dst = out->data();
    for (size_t j = 0; j < m.size(); ++j) memcpy(dst + j * 8, &keys[m[j]], 8);
    bytes += out->size();
  }
  return bytes;
}

uint64_t RequestPlan::FillPush(uint32_t shard, const std::vector<const float*>& grads,
                               v1::PushRequest* request) const {
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
      memcpy(g->data() + j * dim * 4, grads[tb] + m[j] * dim, dim * 4);
    }
    bytes += k->size() + g->size();
  }
  return bytes;
}

template <typename RowFn>
absl::Status RequestPlan::ForEachRow(uint32_t shard, const v1::LookupResponse& response,
                                     uint64_t* received, RowFn row) const {
  int entry = 0;
  for (size_t tb = 0; tb < members_[shard].size(); ++tb) {
    const std::vector<uint32_t>& m = members_[shard][tb];
    if (m.empty()) continue;
    const size_t row_bytes = size_t{(*dims_)[tb]} * 4;
    const size_t expected = m.size() * row_bytes;
    if (entry >= response.tables_size() || response.tables(entry).rows().size() != expected) {
      return absl::InternalError(absl::StrCat(
          client_->ShardName(shard), " table '", (*tables_)[tb], "' field 'rows': expected ",
          expected, " bytes, received ",
          entry < response.tables_size() ? response.tables(entry).rows().size() : 0));
    }
    const std::string& r = response.tables(entry++).rows();
    *received += r.size();
    for (size_t j = 0; j < m.size(); ++j) row(tb, m[j], r.data() + j * row_bytes);
  }
  return absl::OkStatus();
}

absl::Status RequestPlan::ScatterRows(uint32_t shard, const v1::LookupResponse& response,
                                      const std::vector<float*>& rows, uint64_t* received) const {
  return ForEachRow(shard, response, received, [&](size_t tb, uint32_t k, const char* row) {
    const size_t dim = (*dims_)[tb];
    memcpy(rows[tb] + k * dim, row, dim * sizeof(float));
  });
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

absl::Status RequestPlan::RowAddresses(uint32_t shard, const v1::LookupResponse& response,
                                       std::vector<std::vector<const char*>>* at,
                                       uint64_t* received) const {
  return ForEachRow(shard, response, received,
                    [&](size_t tb, uint32_t k, const char* row) { (*at)[tb][k] = row; });
}

}  // namespace ember
