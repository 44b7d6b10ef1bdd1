#include "kernels/embedding_store.h"

#include "absl/container/flat_hash_set.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/count_min_sketch.h"

namespace ember {

void ExportedRows::Clear() {
  keys.clear();
  values.clear();
  state.clear();
  steps.clear();
  scores.clear();
}

EmbeddingStore::EmbeddingStore(TableConfig config) : config_(std::move(config)) {
  if (config_.admission.enabled()) {
    admission_ = std::make_unique<CountMinSketch>(config_.admission.sketch_width);
  }
}

EmbeddingStore::~EmbeddingStore() = default;

StoreStats EmbeddingStore::Stats() const {
  StoreStats st = StatsImpl();
  st.admission_rejected = admission_rejected_.load(std::memory_order_relaxed);
  st.admission_dropped = admission_dropped_.load(std::memory_order_relaxed);
  if (admission_) st.memory_bytes += admission_->memory_bytes();
  return st;
}

absl::StatusOr<uint64_t> EmbeddingStore::EvictExpired(uint32_t) {
  return absl::UnimplementedError(
      absl::StrCat("table '", config_.name, "' field 'ttl': this store has no TTL"));
}

void SnapshotBatch::Clear() {
  rows.Clear();
  removed.clear();
}

absl::Status EmbeddingStore::ValidateRowBuffer(absl::string_view field, size_t n, DType dtype,
                                               size_t bytes) const {
  if (dtype != DType::kFp32 && dtype != DType::kFp16 && dtype != DType::kBf16) {
    return absl::InvalidArgumentError(absl::StrCat("table '", config_.name, "' field '", field,
                                                   "': unknown dtype ", static_cast<int>(dtype)));
  }
  const size_t expected = n * config_.dim * DTypeSize(dtype);
  if (bytes != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", config_.name, "' field '", field, "': expected ", expected, " bytes (", n,
        " keys x dim ", config_.dim, " x ", DTypeSize(dtype), " bytes ", DTypeName(dtype),
        "), received ", bytes));
  }
  return absl::OkStatus();
}

namespace {

// Distinct keys among those with found[i] == 0, given that `occurrences` of
// them are not found. Costs in proportion to the missing keys only.
size_t DistinctMissing(absl::Span<const uint64_t> keys, const uint8_t* found,
                       size_t occurrences) {
  if (occurrences <= 1) return occurrences;
  absl::flat_hash_set<uint64_t> distinct;
  distinct.reserve(occurrences);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!found[i]) distinct.insert(keys[i]);
  }
  return distinct.size();
}

}  // namespace

absl::StatusOr<FindResult> EmbeddingStore::Find(absl::Span<const uint64_t> keys, DType out_dtype,
                                                absl::Span<uint8_t> out, uint8_t* found) {
  EMBER_RETURN_IF_ERROR(ValidateRowBuffer("rows", keys.size(), out_dtype, out.size()));
  if (keys.empty()) return FindResult{};
  // The stores count missing occurrences; the contract counts distinct keys.
  std::vector<uint8_t> own;
  if (found == nullptr) {
    own.resize(keys.size());
    found = own.data();
  }
  EMBER_ASSIGN_OR_RETURN(FindResult result,
                         FindImpl(keys, out_dtype, out.data(), found, /*insert=*/false));
  result.missing = DistinctMissing(keys, found, result.missing);
  return result;
}

absl::StatusOr<FindResult> EmbeddingStore::FindOrInsert(absl::Span<const uint64_t> keys,
                                                        DType out_dtype,
                                                        absl::Span<uint8_t> out) {
  EMBER_RETURN_IF_ERROR(ValidateRowBuffer("rows", keys.size(), out_dtype, out.size()));
  if (keys.empty()) return FindResult{};
  if (admission_) return FindOrInsertAdmitted(keys, out_dtype, out.data());
  return FindImpl(keys, out_dtype, out.data(), nullptr, /*insert=*/true);
}

absl::StatusOr<FindResult> EmbeddingStore::FindOrInsertAdmitted(absl::Span<const uint64_t> keys,
                                                                 DType dtype, uint8_t* out) {
  // Look up without inserting; then insert only the missing keys the sketch
  // admits. Their rows are the initial rows Find already wrote, unless a
  // racing push changed one meanwhile: copy the inserted rows back too.
  std::vector<uint8_t> found(keys.size());
  EMBER_ASSIGN_OR_RETURN(FindResult result,
                         FindImpl(keys, dtype, out, found.data(), /*insert=*/false));
  result.missing = DistinctMissing(keys, found.data(), result.missing);
  std::vector<uint64_t> admitted;
  std::vector<size_t> positions;
  uint64_t rejected = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (found[i]) continue;
    if (admission_->Add(keys[i]) >= config_.admission.min_count) {
      admitted.push_back(keys[i]);
      positions.push_back(i);
    } else {
      ++rejected;
    }
  }
  admission_rejected_.fetch_add(rejected, std::memory_order_relaxed);
  if (admitted.empty()) return result;
  const size_t row_bytes = config_.dim * DTypeSize(dtype);
  std::vector<uint8_t> rows(admitted.size() * row_bytes);
  EMBER_RETURN_IF_ERROR(FindImpl(admitted, dtype, rows.data(), nullptr, /*insert=*/true).status());
  for (size_t j = 0; j < positions.size(); ++j) {
    memcpy(out + positions[j] * row_bytes, rows.data() + j * row_bytes, row_bytes);
  }
  return result;
}

absl::StatusOr<PushResult> EmbeddingStore::ApplyAdmitted(absl::Span<const uint64_t> keys,
                                                         DType grad_dtype,
                                                         const GradientRows& grads) {
  // Stored keys are updated; a missing key only once the sketch admits it
  // (a lookup counted it min_count times; its row may have been evicted
  // since). The rest of the gradients are dropped and counted.
  std::vector<uint8_t> found(keys.size());
  std::vector<uint8_t> scratch(keys.size() * config_.dim * sizeof(float));
  EMBER_RETURN_IF_ERROR(
      FindImpl(keys, DType::kFp32, scratch.data(), found.data(), /*insert=*/false).status());
  const size_t row_bytes = config_.dim * DTypeSize(grad_dtype);
  std::vector<uint64_t> kept_keys;
  std::vector<uint8_t> kept_grads;
  uint64_t dropped = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (found[i] || admission_->Estimate(keys[i]) >= config_.admission.min_count) {
      kept_keys.push_back(keys[i]);
      const uint8_t* row = grads.row(i, row_bytes);
      kept_grads.insert(kept_grads.end(), row, row + row_bytes);
    } else {
      ++dropped;
    }
  }
  admission_dropped_.fetch_add(dropped, std::memory_order_relaxed);
  if (kept_keys.empty()) return PushResult{};
  return ApplyGradientsImpl(kept_keys, grad_dtype,
                            absl::Span<const uint8_t>(kept_grads.data(), kept_grads.size()));
}

absl::Status EmbeddingStore::ValidateGradients(absl::Span<const uint64_t> keys, DType grad_dtype,
                                               const GradientRows& grads) const {
  EMBER_RETURN_IF_ERROR(ValidateRowBuffer("gradients", keys.size(), grad_dtype, grads.bytes()));
  const size_t dim = config_.dim;
  const size_t row_bytes = dim * DTypeSize(grad_dtype);
  // One vectorised pass per run of rows that lie end to end (all of them
  // when packed); the element-wise loop only finds the culprit.
  size_t first_bad_row = keys.size();
  for (size_t i = 0, k; i < keys.size(); i = k) {
    const uint8_t* run = grads.row(i, row_bytes);
    k = grads.packed() != nullptr ? keys.size() : i + 1;
    while (k < keys.size() && grads.row(k, row_bytes) == run + (k - i) * row_bytes) ++k;
    if (!AllFinite(run, grad_dtype, (k - i) * dim)) {
      first_bad_row = i;
      break;
    }
  }
  for (size_t i = first_bad_row; i < keys.size(); ++i) {
    const uint8_t* row = grads.row(i, row_bytes);
    for (size_t j = 0; j < dim; ++j) {
      const float g = LoadElement(row, grad_dtype, j);
      if (!std::isfinite(g)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", config_.name, "' field 'gradients': expected finite values, received ", g,
            " at row ", i, " (key ", keys[i], ") element ", j));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PushResult> EmbeddingStore::ApplyGradients(absl::Span<const uint64_t> keys,
                                                          DType grad_dtype,
                                                          absl::Span<const uint8_t> grads) {
  EMBER_RETURN_IF_ERROR(ValidateGradients(keys, grad_dtype, grads));
  if (keys.empty()) return PushResult{};
  if (admission_) return ApplyAdmitted(keys, grad_dtype, grads);
  return ApplyGradientsImpl(keys, grad_dtype, grads);
}

absl::StatusOr<PushResult> EmbeddingStore::ApplyValidatedGradients(absl::Span<const uint64_t> keys,
                                                                   DType grad_dtype,
                                                                   const GradientRows& grads) {
  EMBER_RETURN_IF_ERROR(ValidateRowBuffer("gradients", keys.size(), grad_dtype, grads.bytes()));
  if (keys.empty()) return PushResult{};
  if (admission_) return ApplyAdmitted(keys, grad_dtype, grads);
  return ApplyGradientsImpl(keys, grad_dtype, grads);
}

absl::Status EmbeddingStore::Peek(absl::Span<const uint64_t> keys, const PeekedRows& out) {
  const size_t n = keys.size();
  const size_t state = config_.dim * OptimizerStateFloatsPerElement(config_.optimizer.kind);
  const size_t steps = OptimizerHasStepCount(config_.optimizer.kind) ? n : 0;
  auto check = [&](absl::string_view field, size_t expected, size_t received) {
    if (expected == received) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("table '", config_.name, "' Peek field '",
                                                   field, "': expected ", expected,
                                                   " elements, received ", received));
  };
  EMBER_RETURN_IF_ERROR(check("values", n * config_.dim, out.values.size()));
  EMBER_RETURN_IF_ERROR(check("state", n * state, out.state.size()));
  EMBER_RETURN_IF_ERROR(check("steps", steps, out.steps.size()));
  EMBER_RETURN_IF_ERROR(check("stored", n, out.stored.size()));
  if (n == 0) return absl::OkStatus();
  return PeekImpl(keys, out);
}

absl::Status EmbeddingStore::PeekImpl(absl::Span<const uint64_t>, const PeekedRows&) {
  return absl::UnimplementedError(
      absl::StrCat("table '", config_.name, "': this store cannot peek at rows"));
}

absl::StatusOr<size_t> EmbeddingStore::Erase(absl::Span<const uint64_t> keys) {
  if (keys.empty()) return 0;
  return EraseImpl(keys);
}

absl::Status EmbeddingStore::Export(ExportCursor* cursor, size_t max_rows, ExportedRows* out) {
  out->Clear();
  if (max_rows == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", config_.name, "' field 'max_rows': expected > 0, received 0"));
  }
  if (cursor->done) return absl::OkStatus();
  return ExportImpl(cursor, max_rows, out);
}

absl::Status EmbeddingStore::Import(const ExportedRows& rows) {
  const size_t n = rows.keys.size();
  const size_t dim = config_.dim;
  const size_t state = dim * OptimizerStateFloatsPerElement(config_.optimizer.kind);
  auto check = [&](absl::string_view field, size_t expected, size_t received) -> absl::Status {
    if (expected == received) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("table '", config_.name, "' field '", field,
                                                   "': expected ", expected, " elements, received ",
                                                   received));
  };
  EMBER_RETURN_IF_ERROR(check("values", n * dim, rows.values.size()));
  EMBER_RETURN_IF_ERROR(check("state", n * state, rows.state.size()));
  EMBER_RETURN_IF_ERROR(check("steps", n, rows.steps.size()));
  EMBER_RETURN_IF_ERROR(check("scores", n, rows.scores.size()));
  if (n == 0) return absl::OkStatus();
  return ImportImpl(rows);
}

absl::Status EmbeddingStore::Snapshot(SnapshotKind kind, ExportCursor* cursor, size_t max_rows,
                                      SnapshotBatch* out) {
  out->Clear();
  if (max_rows == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", config_.name, "' field 'max_rows': expected > 0, received 0"));
  }
  if (cursor->done) return absl::OkStatus();
  return SnapshotImpl(kind, cursor, max_rows, out);
}

absl::Status EmbeddingStore::SnapshotImpl(SnapshotKind kind, ExportCursor* cursor, size_t,
                                          SnapshotBatch* out) {
  if (kind == SnapshotKind::kDelta) {
    return absl::UnimplementedError(absl::StrCat(
        "table '", config_.name, "': this store does not track changed rows; take a full snapshot"));
  }
  ExportCursor all;
  EMBER_RETURN_IF_ERROR(ExportImpl(&all, std::numeric_limits<size_t>::max(), &out->rows));
  cursor->done = true;
  return absl::OkStatus();
}

absl::Status TableFullError(const TableConfig& config, size_t failed, absl::string_view what) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "table '", config.name, "' is full: ", failed, " ", what, " (capacity ", config.capacity,
      " rows on this shard, eviction ", EvictionPolicyName(config.eviction), ")"));
}

}  // namespace ember
