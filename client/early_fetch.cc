#include "client/early_fetch.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/optimizer_rows.h"
#include "kernels/table_config_proto.h"

namespace ember {

// One peeked step: per table, its rows, their optimizer state and step
// counts, and where each row's key sits in the previous step's push.
struct EarlyFetch::Peeked {
  int64_t step = -1;
  bool patchable = true;            // every table replayable, no other worker
  std::vector<uint8_t> replayable;  // [table] on every shard that holds its keys
  std::vector<uint64_t> write_log;  // [shard] the answer's (LookupResponse.write_log)
  std::vector<std::vector<float>> rows;            // [table] keys x dim
  std::vector<std::vector<float>> state;           // [table] keys x dim x slots
  std::vector<std::vector<uint32_t>> steps;        // [table] keys (optimizers with a step count)
  std::vector<std::vector<uint8_t>> absent;        // [table] keys: not stored when peeked
  std::vector<std::vector<uint32_t>> in_previous;  // [table] key -> index in previous, or more
  std::vector<size_t> previous_keys;               // [table]
};

absl::StatusOr<std::vector<EarlyFetch::Table>> EarlyFetch::Describe(
    Client& client, const std::vector<std::string>& names) {
  EMBER_ASSIGN_OR_RETURN(std::vector<v1::TableInfo> infos, client.ListTables());
  std::vector<Table> out;
  for (const std::string& name : names) {
    const v1::TableInfo* info = nullptr;
    for (const v1::TableInfo& t : infos) {
      if (t.config().name() == name) info = &t;
    }
    if (info == nullptr) {
      return absl::NotFoundError(absl::StrCat("table '", name, "' not found on the cluster"));
    }
    EMBER_ASSIGN_OR_RETURN(v1::TableConfig normalized, NormalizeTableConfig(info->config()));
    EMBER_ASSIGN_OR_RETURN(TableConfig config, TableConfigFromProto(normalized));
    out.push_back({config.dim, config.dtype, config.optimizer});
  }
  return out;
}

EarlyFetch::EarlyFetch(std::vector<Table> tables, bool patch)
    : tables_(std::move(tables)), patch_(patch) {}

EarlyFetch::~EarlyFetch() = default;

uint64_t EarlyFetch::FillPeek(int64_t step, const std::vector<std::vector<uint64_t>>& keys,
                              const RequestPlan& plan,
                              const std::vector<std::vector<uint64_t>>& previous,
                              uint32_t worker_id, std::vector<v1::ExchangeRequest>* requests) {
  uint64_t bytes = 0;
  std::unique_ptr<Peeked> p = spare_ ? std::move(spare_) : std::make_unique<Peeked>();
  const size_t tables = tables_.size();
  p->step = step;
  p->patchable = patch_;
  p->replayable.assign(tables, 1);
  p->write_log.assign(plan.shards(), 0);
  p->rows.resize(tables);
  p->state.resize(tables);
  p->steps.resize(tables);
  p->absent.resize(tables);
  p->in_previous.resize(tables);
  p->previous_keys.resize(tables);
  for (size_t tb = 0; tb < tables; ++tb) {
    const Table& t = tables_[tb];
    const size_t n = keys[tb].size();
    p->rows[tb].resize(n * t.dim);
    p->state[tb].resize(n * t.dim * OptimizerStateFloatsPerElement(t.optimizer.kind));
    p->steps[tb].assign(OptimizerHasStepCount(t.optimizer.kind) ? n : 0, 0);
    p->absent[tb].assign(n, 1);  // until a peek answer says it is stored
    // Where each key sits in the previous step's push: the deduplicator
    // numbers previous's keys 0.. first, so an index below that count is a
    // shared key. Only the patch needs it.
    p->in_previous[tb].clear();
    p->previous_keys[tb] = 0;
    if (!patch_) continue;
    dedup_.Clear();
    std::vector<uint32_t> ignored;
    dedup_.Add(previous[tb], &ignored);
    dedup_.Add(keys[tb], &p->in_previous[tb]);
    p->previous_keys[tb] = previous[tb].size();
  }
  for (uint32_t sh = 0; sh < plan.shards(); ++sh) {
    if (!plan.HasKeys(sh)) continue;
    v1::LookupRequest* peek = (*requests)[sh].mutable_peek();
    bytes += plan.FillLookup(sh, /*read_only=*/true, peek);
    // Rows as of step - 2: the push that brings them to step - 1 is this
    // worker's own, applied on the trainer.
    peek->set_step(step);
    peek->set_staleness(1);
    peek->set_worker_id(worker_id);
    // Optimizer state only where the push will need it.
    int entry = 0;
    for (size_t tb = 0; tb < tables; ++tb) {
      const std::vector<uint32_t>& m = plan.members(sh, tb);
      if (m.empty()) continue;
      std::string* with_state = peek->mutable_tables(entry++)->mutable_with_state();
      with_state->resize(m.size());
      for (size_t j = 0; j < m.size(); ++j) {
        (*with_state)[j] = Patches(*p, tb, m[j]) ? 1 : 0;
      }
    }
  }
  filling_ = std::move(p);
  return bytes;
}

absl::Status EarlyFetch::Receive(int64_t step, const RequestPlan& plan,
                                 const std::vector<ExchangeAnswer>& answers) {
  if (!filling_ || filling_->step != step) {
    return absl::InternalError(
        absl::StrCat("EarlyFetch: answers for step ", step, " that was not asked for"));
  }
  std::unique_ptr<Peeked> p = std::move(filling_);
  const size_t tables = tables_.size();
  peek_bytes_ = 0;
  for (uint32_t sh = 0; sh < plan.shards(); ++sh) {
    if (!plan.HasKeys(sh)) continue;
    const v1::LookupResponse& answer = answers[sh].message().peek();
    if (answer.other_workers() > 0) p->patchable = false;
    p->write_log[sh] = answer.write_log();
    int entry = 0;
    for (size_t tb = 0; tb < tables; ++tb) {
      const std::vector<uint32_t>& m = plan.members(sh, tb);
      if (m.empty()) continue;
      if (entry >= answer.tables_size()) {
        return absl::InternalError(absl::StrCat("shard ", sh,
                                                " peek: expected an answer for table ", tb,
                                                ", received ", answer.tables_size(), " tables"));
      }
      const v1::TableRows& r = answer.tables(entry++);
      if (!r.replayable()) {  // no rows: fetched after the push
        p->patchable = false;
        p->replayable[tb] = 0;
        continue;
      }
      const Table& t = tables_[tb];
      const size_t state = t.dim * OptimizerStateFloatsPerElement(t.optimizer.kind);
      const size_t steps = p->steps[tb].empty() ? 0 : 1;
      size_t shared = 0;
      for (uint32_t u : m) shared += Patches(*p, tb, u);
      if (r.rows().size() != m.size() * t.dim * 4 || r.state().size() != shared * state * 4 ||
          r.steps().size() != shared * steps * 4 || r.stored().size() != m.size()) {
        return absl::InternalError(absl::StrCat(
            "shard ", sh, " peek of table '", r.table(), "': expected ", m.size(), " rows and ",
            shared, " with state and steps, received ", r.rows().size(), ", ", r.state().size(),
            " and ", r.steps().size(), " bytes and ", r.stored().size(), " stored flags"));
      }
      peek_bytes_ += r.rows().size() + r.state().size() + r.steps().size() + r.stored().size();
      size_t c = 0;  // the next state in the answer
      for (size_t j = 0; j < m.size(); ++j) {
        memcpy(p->rows[tb].data() + size_t{m[j]} * t.dim, r.rows().data() + j * t.dim * 4,
               t.dim * 4);
        p->absent[tb][m[j]] = r.stored()[j] ? 0 : 1;
        if (!Patches(*p, tb, m[j])) continue;
        if (state > 0) {  // (SGD has none: no null + 0 arithmetic)
          memcpy(p->state[tb].data() + size_t{m[j]} * state, r.state().data() + c * state * 4,
                 state * 4);
        }
        if (steps) memcpy(&p->steps[tb][m[j]], r.steps().data() + c * 4, 4);
        ++c;
      }
    }
  }
  if (peeked_) spare_ = std::move(peeked_);  // never patched (cannot happen in call order)
  peeked_ = std::move(p);
  return absl::OkStatus();
}

std::optional<int64_t> EarlyFetch::pending() const {
  if (!peeked_) return std::nullopt;
  return peeked_->step;
}

bool EarlyFetch::Patches(const Peeked& p, size_t tb, uint32_t u) const {
  return patch_ && p.in_previous[tb][u] < p.previous_keys[tb];
}

bool EarlyFetch::Patchable() const { return peeked_ && peeked_->patchable; }

void EarlyFetch::AskChanged(uint32_t shard, const RequestPlan& plan,
                            v1::LookupRequest* lookup) const {
  if (!peeked_) return;
  int entry = 0;
  for (size_t tb = 0; tb < tables_.size(); ++tb) {
    if (plan.members(shard, tb).empty()) continue;
    v1::TableLookup* t = lookup->mutable_tables(entry++);
    if (!peeked_->replayable[tb]) continue;
    // The peek saw every push of the steps before step - 1.
    t->set_changed_since(peeked_->step - 1);
    t->set_write_log(peeked_->write_log[shard]);
  }
}

uint64_t EarlyFetch::FillEffects(uint32_t shard, const RequestPlan& plan,
                                 v1::LookupRequest* lookup) const {
  if (!patched_) return 0;
  return plan.FillLookupOf(shard, /*read_only=*/false, lookup, /*omit_rows=*/true,
                           patched_->absent);
}

std::vector<const float*> EarlyFetch::PeekedRows() const {
  std::vector<const float*> rows(tables_.size(), nullptr);
  if (!peeked_) return rows;
  for (size_t tb = 0; tb < tables_.size(); ++tb) {
    if (peeked_->replayable[tb]) rows[tb] = peeked_->rows[tb].data();
  }
  return rows;
}

absl::StatusOr<std::vector<const float*>> EarlyFetch::Patch(
    const std::vector<const float*>& grads) {
  return PatchWith([&](size_t tb, uint32_t k) { return grads[tb] + size_t{k} * tables_[tb].dim; });
}

absl::StatusOr<std::vector<const float*>> EarlyFetch::Patch(
    const std::vector<std::vector<float*>>& grad_at) {
  return PatchWith([&](size_t tb, uint32_t k) -> const float* { return grad_at[tb][k]; });
}

template <typename GradOf>
absl::StatusOr<std::vector<const float*>> EarlyFetch::PatchWith(GradOf grad) {
  if (!Patchable()) {
    return absl::FailedPreconditionError("EarlyFetch::Patch: no patchable step is pending");
  }
  Peeked& p = *peeked_;
  rows_patched_ = 0;
  std::vector<const float*> out(tables_.size());
  for (size_t tb = 0; tb < tables_.size(); ++tb) {
    const Table& t = tables_[tb];
    const size_t state = t.dim * OptimizerStateFloatsPerElement(t.optimizer.kind);
    const std::vector<uint32_t>& in_previous = p.in_previous[tb];
    for (size_t u = 0; u < in_previous.size(); ++u) {
      const uint32_t k = in_previous[u];
      if (k >= p.previous_keys[tb]) continue;  // not pushed: exact as peeked
      opt::StepStoredRow(t.optimizer, t.storage, grad(tb, k), p.rows[tb].data() + u * t.dim,
                         state > 0 ? p.state[tb].data() + u * state : nullptr,
                         p.steps[tb].empty() ? nullptr : &p.steps[tb][u], t.dim);
      ++rows_patched_;
    }
    out[tb] = p.rows[tb].data();
  }
  spare_ = std::move(patched_);
  patched_ = std::move(peeked_);
  return out;
}

void EarlyFetch::Drop() {
  if (peeked_) spare_ = std::move(peeked_);
}

uint64_t EarlyFetch::FillAfterPush(int64_t step, bool patched, const RequestPlan& plan,
                                   const LookupClock& clock,
                                   std::vector<v1::ExchangeRequest>* requests) const {
  uint64_t bytes = 0;
  for (uint32_t sh = 0; sh < plan.shards(); ++sh) {
    if (!plan.HasKeys(sh)) continue;
    v1::LookupRequest* lookup = (*requests)[sh].mutable_lookup();
    if (patched) {
      bytes += FillEffects(sh, plan, lookup);
    } else {
      bytes += plan.FillLookup(sh, /*read_only=*/false, lookup);
      AskChanged(sh, plan, lookup);
    }
    if (lookup->tables_size() == 0) {  // nothing for the lookup to do here
      (*requests)[sh].clear_lookup();
      continue;
    }
    clock.Stamp(step, lookup);
  }
  return bytes;
}

}  // namespace ember
