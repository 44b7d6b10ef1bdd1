// ServingTable: a table exported for serving (ember-export), loaded into
// this process as a local, read-only lookup table. No shard is involved.
//
// File format (docs/checkpoints.md#export-for-serving), little-endian:
//   "EMBEREXP" | u32 format version (1) | u32 dtype (ember.v1.DType: 1 fp32,
//   2 fp16) | u32 dim | u32 config length L | u64 rows n |
//   L bytes: the table's ember.v1.TableConfig | zeros to a multiple of 8 |
//   keys n x u64, ascending, unique | rows n x dim in the dtype |
//   u32 CRC32C of everything before it.
//
// Lookups answer a key that is not in the file with its initial row (the
// table's initializer, rounded to its storage dtype), as a read-only lookup
// of a shard would.
//
// Thread safety: immutable after Load; Lookup may be called concurrently.
// Memory: the keys and rows live in host memory owned by the ServingTable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "ember/v1/types.pb.h"

namespace ember {

inline constexpr uint32_t kServingTableFormatVersion = 1;

// Writes `path` (atomically: a temporary file, fsync'd, renamed): `keys` (n,
// ascending, unique) with `rows` ((n, dim) fp32) stored as `dtype` (fp32 or
// fp16). INVALID_ARGUMENT naming the field when the shapes, the order or the
// dtype are wrong.
absl::Status WriteServingTable(const std::string& path, const v1::TableConfig& config,
                               absl::Span<const uint64_t> keys, absl::Span<const float> rows,
                               DType dtype);

class ServingTable {
 public:
  // Reads and verifies `path`: DATA_LOSS naming the file and the fault for a
  // bad magic, size, order of keys or CRC32C; FAILED_PRECONDITION for another
  // format version.
  static absl::StatusOr<std::unique_ptr<ServingTable>> Load(const std::string& path);

  const v1::TableConfig& config() const { return config_; }
  uint32_t dim() const { return config_.dim(); }
  // Rows in the file.
  uint64_t size() const { return keys_.size(); }
  // dtype the rows are kept in (as exported).
  DType dtype() const { return dtype_; }

  // Writes the rows of `keys` to `out` ((n, dim) fp32, row-major). found,
  // if given, receives n flags (1: in the file). INVALID_ARGUMENT if `out`
  // has the wrong size.
  absl::Status Lookup(absl::Span<const uint64_t> keys, absl::Span<float> out,
                      uint8_t* found = nullptr) const;

 private:
  ServingTable() = default;
  v1::TableConfig config_;
  DType dtype_ = DType::kFp32;
  DType storage_dtype_ = DType::kFp32;  // of the trained table: initial rows round to it
  std::vector<uint64_t> keys_;
  std::vector<uint8_t> rows_;
  struct Initializer;
  std::shared_ptr<const Initializer> initializer_;
};

}  // namespace ember
