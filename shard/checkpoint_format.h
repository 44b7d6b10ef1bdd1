// The on-disk format of shard checkpoints (docs/checkpoints.md): a table's
// data file, and the MANIFEST that lists them.
//
// Data file (little-endian throughout):
//   header   "EMBERTBL" | u32 format version | u32 dtype (ember.v1.DType) |
//            u32 dim | u32 optimizer-state floats per row | u32 flags
//            (bit 0: rows carry an Adam step count) | u32 0          (32 B)
//   blocks   u32 kind (1 rows, 2 removed keys) | u32 0 | u64 n       (16 B)
//            rows:    keys n x u64 | rows n x dim in the storage dtype |
//                     state n x floats f32 | [steps n x u32] | scores
//                     n x u32 | zeros to a multiple of 8 bytes
//            removed: keys n x u64
//   footer   u32 3 | u32 0 | u64 rows | u64 removed keys             (24 B)
// The manifest records each file's size and CRC32C.
//
// MANIFEST: "EMBERMAN" | u32 format version | u32 length | length bytes of
// ember.v1.CheckpointManifest | u32 CRC32C of everything before it.
//
// Readers check every size against the file before reading it, so a
// corrupted or truncated file is refused (DATA_LOSS naming the file, the
// offset and what is wrong), never trusted.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/file_system.h"
#include "ember/v1/checkpoint.pb.h"
#include "kernels/embedding_store.h"

namespace ember {

inline constexpr uint32_t kCheckpointFormatVersion = 1;
inline constexpr char kManifestFileName[] = "MANIFEST";

// Writes one table's data file. Not thread-safe.
class TableFileWriter {
 public:
  // Creates `path` and writes the header; the layout follows `config`.
  static absl::StatusOr<std::unique_ptr<TableFileWriter>> Create(FileSystem* fs,
                                                                 const std::string& path,
                                                                 const TableConfig& config);
  ~TableFileWriter();

  // Appends the batch's rows (values rounded to the storage dtype: exact,
  // as they come from a store of that dtype) and its removed keys.
  absl::Status Append(const SnapshotBatch& batch);
  // Writes the footer, syncs and closes the file, and fills the entry's
  // file_bytes, file_crc32c, rows and removed_keys.
  absl::Status Finish(v1::CheckpointTable* entry);

 private:
  TableFileWriter(std::string path, std::unique_ptr<WritableFile> file, const TableConfig& config);
  absl::Status Write(absl::string_view bytes);

  const std::string path_;
  std::unique_ptr<WritableFile> file_;
  const TableConfig config_;
  const size_t state_floats_;
  const bool has_step_;
  std::string buffer_;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
  uint64_t rows_ = 0;
  uint64_t removed_ = 0;
};

// Reads one table's data file and checks it against its manifest entry.
// Not thread-safe.
class TableFileReader {
 public:
  // Opens the file and checks its size and header against `entry` and
  // `config` (the table's definition from the manifest).
  static absl::StatusOr<std::unique_ptr<TableFileReader>> Open(FileSystem* fs,
                                                               const std::string& path,
                                                               const v1::CheckpointTable& entry,
                                                               const TableConfig& config);
  ~TableFileReader();

  // Reads the next block into `out` (rows in fp32, as Import takes them).
  // At the footer, checks the counts and the CRC32C and sets `*done`.
  absl::Status Next(SnapshotBatch* out, bool* done);

 private:
  TableFileReader(std::string path, std::unique_ptr<SequentialFile> file,
                  const v1::CheckpointTable& entry, const TableConfig& config);
  absl::Status Read(size_t n, std::string* out);
  absl::Status Corrupt(absl::string_view what) const;

  const std::string path_;
  std::unique_ptr<SequentialFile> file_;
  const v1::CheckpointTable entry_;
  const TableConfig config_;
  const size_t state_floats_;
  const bool has_step_;
  std::string buffer_;
  uint64_t offset_ = 0;
  uint32_t crc_ = 0;
  uint64_t rows_ = 0;
  uint64_t removed_ = 0;
};

// Writes `dir`/MANIFEST and syncs it.
absl::Status WriteManifest(FileSystem* fs, const std::string& dir,
                           const v1::CheckpointManifest& manifest);
// Reads and verifies `dir`/MANIFEST: framing, CRC32C, format version.
absl::StatusOr<v1::CheckpointManifest> ReadManifest(FileSystem* fs, const std::string& dir);

}  // namespace ember
