#include "kernels/embedding_store.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ember {

void ExportedRows::Clear() {
  keys.clear();
  values.clear();
  state.clear();
  steps.clear();
  scores.clear();
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

absl::StatusOr<FindResult> EmbeddingStore::Find(absl::Span<const uint64_t> keys, DType out_dtype,
                                                absl::Span<uint8_t> out, uint8_t* found) {
  EMBER_RETURN_IF_ERROR(ValidateRowBuffer("rows", keys.size(), out_dtype, out.size()));
  if (keys.empty()) return FindResult{};
  return FindImpl(keys, out_dtype, out.data(), found, /*insert=*/false);
}

absl::StatusOr<FindResult> EmbeddingStore::FindOrInsert(absl::Span<const uint64_t> keys,
                                                        DType out_dtype,
                                                        absl::Span<uint8_t> out) {
  EMBER_RETURN_IF_ERROR(ValidateRowBuffer("rows", keys.size(), out_dtype, out.size()));
  if (keys.empty()) return FindResult{};
  return FindImpl(keys, out_dtype, out.data(), nullptr, /*insert=*/true);
}

absl::Status EmbeddingStore::ValidateGradients(absl::Span<const uint64_t> keys, DType grad_dtype,
                                               absl::Span<const uint8_t> grads) const {
  EMBER_RETURN_IF_ERROR(ValidateRowBuffer("gradients", keys.size(), grad_dtype, grads.size()));
  const size_t elements = keys.size() * config_.dim;
  for (size_t i = 0; i < elements; ++i) {
    float g = LoadElement(grads.data(), grad_dtype, i);
    if (!std::isfinite(g)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", config_.name, "' field 'gradients': expected finite values, received ", g,
          " at row ", i / config_.dim, " (key ", keys[i / config_.dim], ") element ",
          i % config_.dim));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PushResult> EmbeddingStore::ApplyGradients(absl::Span<const uint64_t> keys,
                                                          DType grad_dtype,
                                                          absl::Span<const uint8_t> grads) {
  EMBER_RETURN_IF_ERROR(ValidateGradients(keys, grad_dtype, grads));
  if (keys.empty()) return PushResult{};
  return ApplyGradientsImpl(keys, grad_dtype, grads.data());
}

absl::StatusOr<PushResult> EmbeddingStore::ApplyValidatedGradients(
    absl::Span<const uint64_t> keys, DType grad_dtype, absl::Span<const uint8_t> grads) {
  EMBER_RETURN_IF_ERROR(ValidateRowBuffer("gradients", keys.size(), grad_dtype, grads.size()));
  if (keys.empty()) return PushResult{};
  return ApplyGradientsImpl(keys, grad_dtype, grads.data());
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
