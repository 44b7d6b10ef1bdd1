// Shard::Peek: the early fetch of a synchronous trainer (ExchangeRequest.peek).
// Rows and their optimizer state are read without any effect on the
// tables, so that a trainer may read step t + 1's rows while step t
// computes and the shard still sees exactly the calls of plain s = 0 (the
// lookup's effects come later, with omit_rows). docs/client.md has the rule.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/uninitialized_resize.h"
#include "shard/message_bounds.h"
#include "shard/shard.h"

namespace ember {

namespace {

template <typename T>
absl::Span<T> SpanOf(std::string* bytes, size_t n) {
  ResizeUninitialized(bytes, n * sizeof(T));
  return absl::MakeSpan(reinterpret_cast<T*>(bytes->data()), n);
}

}  // namespace

bool Shard::Replayable(const EmbeddingStore& store) {
  const TableConfig& c = store.config();
  return store.CanPeek() && c.capacity == 0 && !c.ttl.enabled() && !c.admission.enabled();
}

absl::Status Shard::Peek(const v1::LookupRequest& request, v1::LookupResponse* response,
                         absl::Time deadline, uint64_t reserved_bytes) {
  static constexpr ReadKind kPeek{
      "Peek", "peek ", "peek.tables", "peek answer", "rows, optimizer state and framing", true};
  EMBER_ASSIGN_OR_RETURN(
      std::vector<Resolved> resolved,
      ResolveRead(request, kPeek, reserved_bytes,
                  [](const v1::TableLookup& t, absl::string_view field,
                     const Resolved& r) -> absl::StatusOr<uint64_t> {
                    const uint64_t n = r.keys.size();
                    const TableConfig& c = r.table->store->config();
                    const uint64_t state = c.dim * OptimizerStateFloatsPerElement(c.optimizer.kind);
                    const uint64_t steps = OptimizerHasStepCount(c.optimizer.kind) ? n : 0;
                    if (!t.with_state().empty() && t.with_state().size() != n) {
                      return absl::InvalidArgumentError(absl::StrCat(
                          "table '", t.table(), "' ", field, " field 'with_state': expected ", n,
                          " bytes (one per key) or none, received ", t.with_state().size()));
                    }
                    return TableRowsBound(t.table(), {n * c.dim * 4, n * state * 4, steps * 4, n},
                                          /*varints=*/4);
                  }));
  EMBER_RETURN_IF_ERROR(WaitForClock(request, "peek", deadline));
  EMBER_RETURN_IF_ERROR(CheckNotMoved(resolved, "Peek"));

  // Before any row is read: the log is kept from here, and a change it
  // misses after this point changes the token the trainer hands back.
  response->set_write_log(gate_.log().PeekToken());
  uint32_t others = 0;
  for (const auto& [worker, progress] : clock_.Workers()) others += worker != request.worker_id();
  response->set_other_workers(others);
  for (int i = 0; i < request.tables_size(); ++i) {
    const Resolved& r = resolved[i];
    EmbeddingStore& store = *r.table->store;
    const TableConfig& c = store.config();
    v1::TableRows* out = response->add_tables();
    out->set_table(request.tables(i).table());
    out->set_dtype(v1::DTYPE_FP32);
    out->set_dim(c.dim);
    out->set_replayable(Replayable(store));
    if (!out->replayable()) continue;  // the trainer fetches it after the push
    const size_t n = r.keys.size();
    const size_t state = c.dim * OptimizerStateFloatsPerElement(c.optimizer.kind);
    const bool has_steps = OptimizerHasStepCount(c.optimizer.kind);
    const std::string& with_state = request.tables(i).with_state();
    if (with_state.empty()) {  // every key's state, straight into the answer
      PeekedRows rows;
      rows.values = SpanOf<float>(out->mutable_rows(), n * c.dim);
      rows.state = SpanOf<float>(out->mutable_state(), n * state);
      rows.steps = SpanOf<uint32_t>(out->mutable_steps(), has_steps ? n : 0);
      rows.stored = SpanOf<uint8_t>(out->mutable_stored(), n);
      EMBER_RETURN_IF_ERROR(store.Peek(r.keys, rows));
      continue;
    }
    // The state of the keys asked for only: peeked into scratch kept per
    // thread, then packed.
    thread_local std::vector<float> all_state;
    thread_local std::vector<uint32_t> all_steps;
    all_state.resize(n * state);
    all_steps.resize(has_steps ? n : 0);
    PeekedRows rows;
    rows.values = SpanOf<float>(out->mutable_rows(), n * c.dim);
    rows.state = absl::MakeSpan(all_state);
    rows.steps = absl::MakeSpan(all_steps);
    rows.stored = SpanOf<uint8_t>(out->mutable_stored(), n);
    EMBER_RETURN_IF_ERROR(store.Peek(r.keys, rows));
    size_t m = 0;
    for (char wanted : with_state) m += wanted != 0;
    absl::Span<float> packed_state = SpanOf<float>(out->mutable_state(), m * state);
    absl::Span<uint32_t> packed_steps = SpanOf<uint32_t>(out->mutable_steps(), has_steps ? m : 0);
    for (size_t j = 0, k = 0; j < n; ++j) {
      if (with_state[j] == 0) continue;
      if (state > 0) {
        std::copy_n(all_state.data() + j * state, state, packed_state.data() + k * state);
      }
      if (has_steps) packed_steps[k] = all_steps[j];
      ++k;
    }
  }
  return absl::OkStatus();
}

}  // namespace ember
