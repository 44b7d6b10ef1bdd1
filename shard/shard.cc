#include "shard/shard.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/key_hash.h"
#include "common/process_cpu.h"
#include "common/status_macros.h"
#include "common/uninitialized_resize.h"
#include "common/wire.h"
#include "kernels/table_config_proto.h"
#include "shard/message_bounds.h"
#include "shard/push_gradients.h"

#ifndef EMBER_VERSION
#define EMBER_VERSION "dev"
#endif

namespace ember {

absl::Status ShardOptions::Validate() const {
  if (shard_count == 0) {
    return absl::InvalidArgumentError("shard_count: expected >= 1, received 0");
  }
  if (shard_index >= shard_count) {
    return absl::InvalidArgumentError(absl::StrCat("shard_index: expected < shard_count ",
                                                   shard_count, ", received ", shard_index));
  }
  EMBER_RETURN_IF_ERROR(KeyRouter::Make(routing, shard_count).status());
  if (max_keys_per_request == 0) {
    return absl::InvalidArgumentError("max_keys_per_request: expected >= 1, received 0");
  }
  if (write_log_keep <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("write_log_keep: expected > 0, received ",
                                                   absl::FormatDuration(write_log_keep)));
  }
  if (max_ssp_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("max_ssp_wait: expected >= 0, received ",
                                                   absl::FormatDuration(max_ssp_wait)));
  }
  if (max_tables < 1) {
    return absl::InvalidArgumentError("max_tables: expected >= 1, received 0");
  }
  if (max_message_bytes < 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_message_bytes: expected >= 1024, received ", max_message_bytes));
  }
  return CheckStoreDevice(device);
}

Shard::Shard(ShardOptions options) : options_(options), gate_(options.write_log_keep) {
  auto placement = std::make_shared<ShardPlacement>();
  placement->index = options_.shard_index;
  placement->count = options_.shard_count;
  placement->router = KeyRouter::Make(options_.routing, options_.shard_count).value_or(KeyRouter());
  if (options_.join) {
    placement->joining = true;
    placement->epoch = 0;
  }
  WriterLock lock(&mu_);
  SetPlacement(std::move(placement));
}

void Shard::SetPlacement(std::shared_ptr<const ShardPlacement> placement) {
  serving_epoch_.store(placement->joining || placement->retired ? kNotServing : placement->epoch,
                       std::memory_order_release);
  placement_ = std::move(placement);
}

std::shared_ptr<const ShardPlacement> Shard::placement() const {
  ReaderLock lock(&mu_);
  return placement_;
}

void Shard::FillTableInfo(const Table& table, v1::TableInfo* info) const {
  const StoreStats st = table.store->Stats();
  *info->mutable_config() = table.config;
  info->set_rows(st.rows);
  info->set_memory_bytes(st.memory_bytes);
  info->set_evictions(st.evictions);
  info->set_insert_failures(st.insert_failures);
  info->set_expired(st.expired);
  info->set_admission_rejected(st.admission_rejected);
  info->set_admission_dropped(st.admission_dropped);
}

absl::Status Shard::CreateTable(const v1::TableConfig& requested,
                                v1::CreateTableResponse* response) {
  EMBER_ASSIGN_OR_RETURN(v1::TableConfig normalized, NormalizeTableConfig(requested));
  EMBER_ASSIGN_OR_RETURN(TableConfig config, TableConfigFromProto(normalized));
  WriterLock lock(&mu_);
  if (auto it = tables_.find(normalized.name()); it != tables_.end()) {
    const std::string diff = TableConfigDifference(it->second->config, normalized);
    if (!diff.empty()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "table '", normalized.name(), "' exists with a different definition: ", diff));
    }
    response->set_created(false);
    FillTableInfo(*it->second, response->mutable_table());
    return absl::OkStatus();
  }
  if (tables_.size() >= options_.max_tables) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "table '", normalized.name(), "': the shard holds ", tables_.size(),
        " tables, limit max_tables is ", options_.max_tables));
  }
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingStore> store, NewStore(config, options_.device));
  auto table = std::make_shared<Table>(std::move(normalized), std::move(store));
  if (metrics_ != nullptr) table->series = metrics_->Table(table->config.name());
  response->set_created(true);
  FillTableInfo(*table, response->mutable_table());
  tables_.emplace(table->config.name(), std::move(table));
  gate_.log().ForgetAll();
  return absl::OkStatus();
}

absl::Status Shard::DropTable(absl::string_view name) {
  std::shared_ptr<Table> dropped;  // freed outside the lock
  WriterLock lock(&mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", name, "' not found"));
  }
  dropped = std::move(it->second);
  tables_.erase(it);
  gate_.log().ForgetAll();
  return absl::OkStatus();
}

void Shard::ListTables(v1::ListTablesResponse* response) const {
  std::vector<std::shared_ptr<Table>> tables;
  {
    ReaderLock lock(&mu_);
    for (const auto& [name, table] : tables_) tables.push_back(table);
  }
  std::sort(tables.begin(), tables.end(),
            [](const auto& a, const auto& b) { return a->config.name() < b->config.name(); });
  for (const auto& t : tables) FillTableInfo(*t, response->add_tables());
}

void Shard::GetShardInfo(v1::GetShardInfoResponse* r) const {
  const std::shared_ptr<const ShardPlacement> placement = this->placement();
  r->set_shard_index(placement->index);
  r->set_shard_count(placement->count);
  r->set_routing(placement->router.routing());
  r->set_routing_epoch(placement->epoch);
  r->set_joining(placement->joining);
  r->set_retired(placement->retired);
  for (const std::string& a : placement->addresses) r->add_cluster_addresses(a);
  r->set_move_held(gate_.held());
  r->set_max_keys_per_request(options_.max_keys_per_request);
  r->set_max_message_bytes(options_.max_message_bytes);
  r->set_version(EMBER_VERSION);
  r->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - start_time_));
  r->set_process_cpu_seconds(ProcessCpuSeconds());
  r->set_device(options_.device.ToString());
  for (const auto& [id, applied] : clock_.AppliedSteps()) {
    v1::WorkerStep* w = r->add_workers();
    w->set_worker_id(id);
    w->set_applied_step(applied);
  }
  ReaderLock lock(&mu_);
  r->set_restored_from(restored_from_);
}

absl::Status Shard::CheckRoutingEpoch(uint64_t epoch, absl::string_view rpc) const {
  const uint64_t serving = serving_epoch_.load(std::memory_order_acquire);
  if (serving != kNotServing && (epoch == 0 || epoch == serving)) return absl::OkStatus();
  const std::shared_ptr<const ShardPlacement> p = placement();
  if (p->joining) {
    return absl::UnavailableError(absl::StrCat(
        rpc,
        ": this shard waits to join a cluster (ember-server --join) and serves nothing "
        "until a move (ember-move) gives it its place"));
  }
  if (p->retired) {
    return absl::AbortedError(absl::StrCat(
        rpc, ": this shard left its cluster in a move to ", p->count, " shards (routing epoch ",
        p->epoch, ", addresses ", absl::StrJoin(p->addresses, ","),
        "). Nothing was read or applied; connect to the cluster's shards"));
  }
  if (epoch == 0 || epoch == p->epoch) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(
      rpc, ": routed by routing epoch ", epoch, ", but shard ", p->index, " of ", p->count,
      " is at routing epoch ", p->epoch, " (routing '", p->router.routing(),
      "'): the cluster was resharded since the client connected (or this shard "
      "was restored apart from its cluster). Nothing was read or applied; connect again to route "
      "by the cluster's shard count and routing"));
}

absl::Status Shard::CheckOwnership(const ShardPlacement& placement, absl::string_view table,
                                   absl::Span<const uint64_t> keys) const {
  if (placement.count == 1) return absl::OkStatus();
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t owner = placement.router.ShardOf(keys[i]);
    if (owner != placement.index) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", table, "' field 'keys': key ", keys[i], " at index ", i,
                       " is misrouted: expected shard ", owner, " of ", placement.count,
                       ", received by shard ", placement.index));
    }
  }
  return absl::OkStatus();
}

absl::Status Shard::CheckNotMoved(const std::vector<Resolved>& resolved, absl::string_view rpc) {
  for (const Resolved& r : resolved) {
    if (r.table->moved_out.load(std::memory_order_acquire)) {
      return absl::AbortedError(absl::StrCat(
          rpc,
          ": the cluster moved to another shard count while this call waited for the "
          "consistency clock (table '",
          r.table->config.name(),
          "'). Nothing was read or applied; connect again to route by the cluster's shard count "
          "and routing"));
    }
  }
  return absl::OkStatus();
}

absl::Status Shard::CheckKeyCount(uint64_t total_keys) const {
  if (total_keys > options_.max_keys_per_request) {
    return absl::ResourceExhaustedError(absl::StrCat("request carries ", total_keys,
                                                     " keys, limit max_keys_per_request is ",
                                                     options_.max_keys_per_request));
  }
  return absl::OkStatus();
}

absl::Status Shard::CheckRowBudget(const std::vector<Resolved>& resolved,
                                   const std::vector<bool>& writes) const {
  if (options_.max_rows == 0) return absl::OkStatus();
  uint64_t stored = 0;
  {
    ReaderLock lock(&mu_);
    for (const auto& [name, table] : tables_) stored += table->store->Stats().rows;
  }
  uint64_t keys = 0;
  for (size_t i = 0; i < resolved.size(); ++i) {
    if (writes[i]) keys += resolved[i].keys.size();
  }
  if (stored + keys <= options_.max_rows) return absl::OkStatus();
  // Near the limit: count the keys that would be inserted.
  uint64_t missing = 0;
  std::vector<uint8_t> rows;
  for (size_t i = 0; i < resolved.size(); ++i) {
    const Resolved& r = resolved[i];
    if (!writes[i] || r.keys.empty()) continue;
    rows.resize(r.keys.size() * r.table->config.dim() * sizeof(float));
    EMBER_ASSIGN_OR_RETURN(FindResult found,
                           r.table->store->Find(r.keys, DType::kFp32, absl::MakeSpan(rows)));
    missing += found.missing;
  }
  if (stored + missing > options_.max_rows) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the shard holds ", stored, " rows and the request would add ", missing,
        ", limit max_rows is ", options_.max_rows));
  }
  return absl::OkStatus();
}

absl::Status Shard::Resolve(absl::string_view rpc, absl::string_view field,
                            const std::string& table_name, const std::string& key_bytes,
                            v1::DType dtype, std::vector<Resolved>* resolved) {
  Resolved r;
  std::shared_ptr<const ShardPlacement> placement;
  {
    ReaderLock lock(&mu_);
    auto it = tables_.find(table_name);
    if (it == tables_.end()) {
      return absl::NotFoundError(
          absl::StrCat("table '", table_name, "' not found (field '", field, ".table')"));
    }
    r.table = it->second;
    placement = placement_;  // the routing of these tables
  }
  // Errors from here on belong to an existing table: count them per table.
  absl::Status s = ResolveTable(*placement, field, table_name, key_bytes, dtype, *resolved, &r);
  if (!s.ok()) {
    if (metrics_ != nullptr) metrics_->TableError(table_name, rpc, s.code());
    return s;
  }
  resolved->push_back(std::move(r));
  return absl::OkStatus();
}

absl::Status Shard::ResolveTable(const ShardPlacement& placement, absl::string_view field,
                                 const std::string& table_name, const std::string& key_bytes,
                                 v1::DType dtype, const std::vector<Resolved>& resolved,
                                 Resolved* out) const {
  Resolved& r = *out;
  for (const Resolved& other : resolved) {
    if (other.table == r.table) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table_name, "' field '", field, ".table': a table may appear once per request"));
    }
  }
  if (key_bytes.size() % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", table_name, "' field 'keys': expected a multiple of 8 bytes "
                     "(packed uint64), received ",
                     key_bytes.size()));
  }
  EMBER_ASSIGN_OR_RETURN(r.dtype, DTypeFromProto(dtype, table_name, "dtype"));
  r.keys = KeysView(key_bytes, &r.key_storage);
  return CheckOwnership(placement, table_name, r.keys);
}

void Shard::SetMetrics(ShardMetrics* metrics) {
  metrics_ = metrics;
  WriterLock lock(&mu_);
  for (auto& [name, table] : tables_) table->series = metrics->Table(name);
}

std::vector<std::shared_ptr<Shard::Table>> Shard::TableList() const {
  std::vector<std::shared_ptr<Table>> tables;
  ReaderLock lock(&mu_);
  tables.reserve(tables_.size());
  for (const auto& [name, table] : tables_) tables.push_back(table);
  return tables;
}

std::vector<Shard::TableStats> Shard::AllTableStats() const {
  std::vector<TableStats> out;
  for (const auto& t : TableList()) out.push_back({t->config.name(), t->store->Stats()});
  return out;
}

absl::Status Shard::RegisterWorker(const v1::RegisterWorkerRequest& request,
                                   v1::RegisterWorkerResponse* response) {
  if (request.first_step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", request.worker_id(), " field 'first_step': expected >= 0, received ",
        request.first_step()));
  }
  // A worker that joins may push steps below those a peek already waited
  // for: the write log cannot vouch for rows read before it.
  gate_.log().ForgetAll();
  response->set_registered_workers(clock_.Register(request.worker_id(), request.first_step()));
  return absl::OkStatus();
}

void Shard::UnregisterWorker(const v1::UnregisterWorkerRequest& request,
                             v1::UnregisterWorkerResponse* response) {
  response->set_was_registered(clock_.Unregister(request.worker_id()));
}

absl::Status Shard::Lookup(const v1::LookupRequest& request, v1::LookupResponse* response,
                           absl::Time deadline) {
  return LookupWithin(request, response, deadline, 0);
}

absl::Status Shard::NameRestore(absl::Status status) const {
  if (!absl::IsDataLoss(status)) return status;
  ReaderLock lock(&mu_);
  return absl::DataLossError(absl::StrCat("shard ", placement_->index, " of ", placement_->count,
                                          " (restored from '", restored_from_,
                                          "'): ", status.message()));
}

absl::Status Shard::WaitForClock(const v1::LookupRequest& request, absl::string_view what,
                                 absl::Time deadline) {
  if (!request.has_step()) return absl::OkStatus();
  const int64_t required = request.step() - int64_t{request.staleness()} - 1;
  if (required < 0) return absl::OkStatus();
  EMBER_RETURN_IF_ERROR(NameRestore(clock_.CheckRestored(
      request.worker_id(), required,
      absl::StrCat("asks for step ", request.step(), " with staleness ", request.staleness()))));
  const absl::Time start = absl::Now();
  absl::Status waited = clock_.WaitFor(
      required, std::min(deadline, start + options_.max_ssp_wait),
      absl::StrCat(what, " of worker ", request.worker_id(), " for step ", request.step(),
                   " with staleness ", request.staleness()));
  if (metrics_ != nullptr) {
    metrics_->ssp_wait().Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return waited;
}

absl::StatusOr<std::vector<Shard::Resolved>> Shard::ResolveRead(const v1::LookupRequest& request,
                                                                const ReadKind& kind,
                                                                uint64_t reserved_bytes,
                                                                const EntryBound& bound) {
  if (request.has_step() && request.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind.what, "field 'step': expected >= 0, received ", request.step()));
  }
  uint64_t total_keys = 0;
  for (const v1::TableLookup& t : request.tables()) total_keys += t.keys().size() / 8;
  EMBER_RETURN_IF_ERROR(CheckKeyCount(total_keys));
  std::vector<Resolved> resolved;
  resolved.reserve(request.tables_size());
  // The whole answer counts, framing included: gRPC refuses to send a
  // message over the limit, and by then missing keys would be inserted.
  uint64_t response_bytes = reserved_bytes;
  for (int i = 0; i < request.tables_size(); ++i) {
    const v1::TableLookup& t = request.tables(i);
    const std::string field = absl::StrCat(kind.entries, "[", i, "]");
    EMBER_RETURN_IF_ERROR(Resolve(kind.rpc, field, t.table(), t.keys(),
                                  kind.fp32_rows ? v1::DTYPE_FP32 : t.dtype(), &resolved));
    EMBER_ASSIGN_OR_RETURN(const uint64_t bytes, bound(t, field, resolved.back()));
    response_bytes += bytes;
  }
  if (response_bytes > options_.max_message_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(kind.answer, " would be up to ", response_bytes, " bytes (", kind.contents,
                     "), limit max_message_bytes is ", options_.max_message_bytes));
  }
  return resolved;
}

absl::Status Shard::LookupWithin(const v1::LookupRequest& request, v1::LookupResponse* response,
                                 absl::Time deadline, uint64_t reserved_bytes) {
  // Validate everything before the first row is read or inserted.
  static constexpr ReadKind kLookup{"Lookup", "", "tables", "response", "rows and framing", false};
  EMBER_ASSIGN_OR_RETURN(
      std::vector<Resolved> resolved,
      ResolveRead(request, kLookup, reserved_bytes,
                  [](const v1::TableLookup& t, absl::string_view field,
                     const Resolved& r) -> absl::StatusOr<uint64_t> {
                    if (t.has_changed_since() && t.changed_since() < 0) {
                      return absl::InvalidArgumentError(absl::StrCat(
                          "table '", t.table(), "' ", field,
                          " field 'changed_since': expected >= 0, received ", t.changed_since()));
                    }
                    const uint64_t n = r.keys.size();
                    const uint64_t rows =
                        t.omit_rows() ? 0 : n * r.table->config.dim() * DTypeSize(r.dtype);
                    // With changed_since, fewer rows and a byte per key (`changed`).
                    return t.has_changed_since() ? TableRowsBound(t.table(), {rows, n}, 3)
                                                 : TableRowsBound(t.table(), {rows}, 3);
                  }));
  std::vector<bool> writes(request.tables_size());
  for (int i = 0; i < request.tables_size(); ++i) writes[i] = !request.tables(i).read_only();
  EMBER_RETURN_IF_ERROR(CheckRowBudget(resolved, writes));
  EMBER_RETURN_IF_ERROR(WaitForClock(request, "lookup", deadline));
  EMBER_RETURN_IF_ERROR(CheckNotMoved(resolved, "Lookup"));

  for (int i = 0; i < request.tables_size(); ++i) {
    const Resolved& r = resolved[i];
    EmbeddingStore& store = *r.table->store;
    v1::TableRows* out = response->add_tables();
    out->set_table(request.tables(i).table());
    out->set_dtype(DTypeToProto(r.dtype));
    out->set_dim(r.table->config.dim());
    // Find writes every byte of the rows (or fails, and the response is
    // dropped); rows the caller does not want go to scratch kept per thread.
    thread_local std::string omitted;
    std::string* rows = request.tables(i).omit_rows() ? &omitted : out->mutable_rows();
    ResizeUninitialized(rows, r.keys.size() * r.table->config.dim() * DTypeSize(r.dtype));
    absl::Span<uint8_t> buf(reinterpret_cast<uint8_t*>(rows->data()), rows->size());
    absl::StatusOr<FindResult> found = request.tables(i).read_only()
                                           ? store.Find(r.keys, r.dtype, buf)
                                           : store.FindOrInsert(r.keys, r.dtype, buf);
    if (!found.ok()) {
      if (metrics_ != nullptr) metrics_->TableError(request.tables(i).table(), "Lookup", found.status().code());
      return found.status();
    }
    out->set_missing(found->missing);
    if (request.tables(i).has_changed_since() && !request.tables(i).omit_rows()) {
      KeepChangedRows(r, request.tables(i).changed_since(), request.tables(i).write_log(), out);
    }
    if (r.table->series != nullptr) {
      r.table->series->lookup_requests->Add();
      r.table->series->lookup_keys->Add(static_cast<double>(r.keys.size()));
      r.table->series->lookup_bytes->Add(static_cast<double>(out->rows().size()));
      r.table->series->lookup_missing->Add(static_cast<double>(found->missing));
    }
  }
  return absl::OkStatus();
}

absl::Status Shard::Push(const v1::PushRequest& request, v1::PushResponse* response,
                         GradientPieces in_place) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'step': expected >= 0, received ", request.step()));
  }
  uint64_t total_keys = 0;
  for (const v1::TableGradients& t : request.tables()) total_keys += t.keys().size() / 8;
  EMBER_RETURN_IF_ERROR(CheckKeyCount(total_keys));
  if (!in_place.empty() && in_place.size() != static_cast<size_t>(request.tables_size())) {
    return absl::InternalError(absl::StrCat("push with ", request.tables_size(),
                                            " tables given gradient pieces for ", in_place.size()));
  }

  std::vector<Resolved> resolved;
  resolved.reserve(request.tables_size());
  std::vector<GradientRows> grads;
  grads.reserve(request.tables_size());
  // Where pieces left in place are read from: kept per thread, because a
  // buffer allocated per push (up to MBs) is returned to the system and
  // faulted in again at every push (it cost 1.7x at dim 64).
  thread_local std::vector<const uint8_t*> addresses;
  thread_local std::vector<std::string> copies;
  addresses.clear();
  if (!in_place.empty()) {
    addresses.reserve(total_keys);
    if (copies.size() < static_cast<size_t>(request.tables_size())) {
      copies.resize(request.tables_size());
    }
  }
  for (int i = 0; i < request.tables_size(); ++i) {
    const v1::TableGradients& t = request.tables(i);
    EMBER_RETURN_IF_ERROR(Resolve("Push", absl::StrCat("tables[", i, "]"), t.table(), t.keys(),
                                  t.dtype(), &resolved));
    const Resolved& r = resolved.back();
    grads.push_back(in_place.empty()
                        ? GradientsOf(t, nullptr, 0, 0, nullptr, nullptr)
                        : GradientsOf(t, in_place[i], r.keys.size(),
                                      r.table->config.dim() * DTypeSize(r.dtype), &addresses,
                                      &copies[i]));
    absl::Status valid = r.table->store->ValidateGradients(r.keys, r.dtype, grads.back());
    if (!valid.ok()) {
      if (metrics_ != nullptr) metrics_->TableError(t.table(), "Push", valid.code());
      return valid;
    }
  }

  EMBER_RETURN_IF_ERROR(CheckRowBudget(resolved, std::vector<bool>(resolved.size(), true)));

  SspClock::Claim claim;
  EMBER_RETURN_IF_ERROR(NameRestore(clock_.Begin(request.worker_id(), request.step(), &claim)));
  if (claim == SspClock::Claim::kDuplicate) {
    response->set_duplicate(true);
    return absl::OkStatus();
  }
  const bool tracked = claim == SspClock::Claim::kClaimed;
  // A push that waited for a checkpoint's hold may find its tables moved
  // out; between a move's cut and its commit, the gate refuses pushes
  // past the cut (the commit would drop what they wrote).
  absl::Status movable = CheckNotMoved(resolved, "Push");
  absl::StatusOr<PushGate::Pass> pass =
      movable.ok() ? gate_.Enter(request.worker_id(), request.step(), tracked)
                   : absl::StatusOr<PushGate::Pass>(movable);
  if (!pass.ok()) {
    if (tracked) clock_.End(request.worker_id(), request.step(), false);
    return pass.status();
  }
  // The write log (while kept) learns of the push before the clock counts
  // it applied.
  for (int i = 0; i < request.tables_size(); ++i) {
    pass->Record(request.tables(i).table(), request.step(), resolved[i].keys);
  }
  absl::Status applied = Apply(request, resolved, grads, response);
  if (tracked) {
    clock_.End(request.worker_id(), request.step(), applied.ok());
    // No worker's lookup asks about steps below its own applied one.
    if (const int64_t oldest = clock_.MinApplied(); oldest != INT64_MAX) {
      gate_.log().Forget(oldest);
    }
  }
  return applied;
}

void Shard::KeepChangedRows(const Resolved& r, int64_t since, uint64_t token,
                            v1::TableRows* out) const {
  std::string changed;
  uint64_t count = 0;
  if (!Replayable(*r.table->store) ||
      !gate_.log().Changed(out->table(), since, token, r.keys, &changed, &count)) {
    return;  // every row, as a plain lookup
  }
  if (count == changed.size()) return;  // every row changed: no mask needed
  const size_t row_bytes = size_t{r.table->config.dim()} * DTypeSize(r.dtype);
  std::string* rows = out->mutable_rows();
  size_t kept = 0;
  for (size_t k = 0; k < changed.size(); ++k) {
    if (!changed[k]) continue;
    if (kept != k)
      memmove(rows->data() + kept * row_bytes, rows->data() + k * row_bytes, row_bytes);
    ++kept;
  }
  rows->resize(kept * row_bytes);
  out->set_changed(std::move(changed));
}

bool Shard::MayWait(const v1::LookupRequest& lookup, const v1::PushRequest* push) const {
  if (!lookup.has_step()) return false;
  const int64_t required = lookup.step() - int64_t{lookup.staleness()} - 1;
  if (required < 0) return false;
  std::optional<std::pair<uint32_t, int64_t>> pushed;
  if (push != nullptr) pushed = {{push->worker_id(), push->step()}};
  return !clock_.Ready(required, pushed);
}

absl::Status Shard::Exchange(const v1::ExchangeRequest& request, v1::ExchangeResponse* response,
                             absl::Time deadline, GradientPieces in_place) {
  EMBER_RETURN_IF_ERROR(ExchangePush(request, response, in_place));
  return ExchangeLookup(request, response, deadline);
}

absl::Status Shard::ExchangePush(const v1::ExchangeRequest& request,
                                 v1::ExchangeResponse* response, GradientPieces in_place) {
  if (!request.has_push()) return absl::OkStatus();
  return Push(request.push(), response->mutable_push(), in_place);
}

absl::Status Shard::ExchangeLookup(const v1::ExchangeRequest& request,
                                   v1::ExchangeResponse* response, absl::Time deadline) {
  // The push's answer and the fields' framing share the message.
  uint64_t reserved = FieldBytes(response->push().ByteSizeLong()) + 2 * (1 + 10);
  if (request.has_lookup()) {
    absl::Status looked_up =
        LookupWithin(request.lookup(), response->mutable_lookup(), deadline, reserved);
    if (!looked_up.ok()) {
      if (!request.has_push()) return looked_up;
      return absl::Status(looked_up.code(),
                          absl::StrCat("push applied; lookup: ", looked_up.message()));
    }
    reserved += response->lookup().ByteSizeLong();
  }
  if (!request.has_peek()) return absl::OkStatus();
  absl::Status peeked = Peek(request.peek(), response->mutable_peek(), deadline, reserved);
  if (peeked.ok() || !(request.has_push() || request.has_lookup())) return peeked;
  return absl::Status(peeked.code(), absl::StrCat(request.has_lookup() ? "lookup served"
                                                                       : "push applied",
                                                  "; peek: ", peeked.message()));
}

absl::Status Shard::Apply(const v1::PushRequest& request, const std::vector<Resolved>& resolved,
                          const std::vector<GradientRows>& grads, v1::PushResponse* response) {
  for (int i = 0; i < request.tables_size(); ++i) {
    const Resolved& r = resolved[i];
    absl::StatusOr<PushResult> pushed =
        r.table->store->ApplyValidatedGradients(r.keys, r.dtype, grads[i]);
    if (!pushed.ok()) {
      if (metrics_ != nullptr) metrics_->TableError(request.tables(i).table(), "Push", pushed.status().code());
      return pushed.status();
    }
    if (r.table->series != nullptr) {
      r.table->series->push_requests->Add();
      r.table->series->push_keys->Add(static_cast<double>(r.keys.size()));
      r.table->series->push_bytes->Add(static_cast<double>(grads[i].bytes()));
    }
    v1::TablePushResult* out = response->add_tables();
    out->set_table(request.tables(i).table());
    out->set_updated(pushed->updated);
    out->set_inserted(pushed->inserted);
  }
  return absl::OkStatus();
}

}  // namespace ember
