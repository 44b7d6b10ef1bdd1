#include "shard/checkpoint_format.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "kernels/table_config_proto.h"

namespace ember {
namespace {

constexpr char kTableMagic[8] = {'E', 'M', 'B', 'E', 'R', 'T', 'B', 'L'};
constexpr char kManifestMagic[8] = {'E', 'M', 'B', 'E', 'R', 'M', 'A', 'N'};
constexpr size_t kHeaderBytes = 32;
constexpr size_t kBlockHeaderBytes = 16;
constexpr size_t kFooterBytes = 24;
constexpr uint32_t kRowsBlock = 1;
constexpr uint32_t kRemovedBlock = 2;
constexpr uint32_t kFooterBlock = 3;
constexpr uint32_t kFlagSteps = 1;
// Largest rows block a writer makes (unless one row is larger).
constexpr size_t kMaxBlockBytes = size_t{8} << 20;
// Largest manifest accepted: far above any real one (a table entry is about
// 200 bytes), low enough that a corrupted length cannot exhaust memory.
constexpr uint32_t kMaxManifestBytes = 64u << 20;

void PutU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }
void PutU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }
uint32_t GetU32(const char* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
size_t Pad8(size_t n) { return (8 - n % 8) % 8; }

// Bytes of one row in a rows block (keys, values, state, steps, scores).
size_t RowBytes(const TableConfig& c, size_t state_floats, bool has_step) {
  return 8 + c.dim * DTypeSize(c.dtype) + state_floats * 4 + (has_step ? 4 : 0) + 4;
}

std::string Header(const TableConfig& c, size_t state_floats, bool has_step) {
  std::string h(kTableMagic, 8);
  PutU32(&h, kCheckpointFormatVersion);
  PutU32(&h, static_cast<uint32_t>(DTypeToProto(c.dtype)));
  PutU32(&h, c.dim);
  PutU32(&h, static_cast<uint32_t>(state_floats));
  PutU32(&h, has_step ? kFlagSteps : 0);
  PutU32(&h, 0);
  return h;
}

}  // namespace

// ---- TableFileWriter

TableFileWriter::TableFileWriter(std::string path, std::unique_ptr<WritableFile> file,
                                 const TableConfig& config)
    : path_(std::move(path)),
      file_(std::move(file)),
      config_(config),
      state_floats_(config.dim * OptimizerStateFloatsPerElement(config.optimizer.kind)),
      has_step_(OptimizerHasStepCount(config.optimizer.kind)) {}

TableFileWriter::~TableFileWriter() = default;

absl::StatusOr<std::unique_ptr<TableFileWriter>> TableFileWriter::Create(
    FileSystem* fs, const std::string& path, const TableConfig& config) {
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(path));
  std::unique_ptr<TableFileWriter> w(new TableFileWriter(path, std::move(file), config));
  EMBER_RETURN_IF_ERROR(w->Write(Header(config, w->state_floats_, w->has_step_)));
  return w;
}

absl::Status TableFileWriter::Write(absl::string_view bytes) {
  crc_ = Crc32cExtend(crc_, bytes.data(), bytes.size());
  bytes_ += bytes.size();
  return file_->Append(bytes);
}

absl::Status TableFileWriter::Append(const SnapshotBatch& batch) {
  const ExportedRows& r = batch.rows;
  const size_t n = r.keys.size();
  // Column `v`'s elements of rows [begin, begin + count), `per_row` each.
  auto bytes_of = [](const auto& v, size_t begin, size_t count, size_t per_row) {
    return absl::string_view(reinterpret_cast<const char*>(v.data() + begin * per_row),
                             count * per_row * sizeof(v[0]));
  };
  auto block_header = [this](uint32_t kind, uint64_t count) {
    buffer_.clear();
    PutU32(&buffer_, kind);
    PutU32(&buffer_, 0);
    PutU64(&buffer_, count);
    return Write(buffer_);
  };
  // A reader holds one block in memory: blocks are kept to kMaxBlockBytes
  // however large the batch.
  const size_t row_bytes = RowBytes(config_, state_floats_, has_step_);
  const size_t block_rows = std::max<size_t>(1, kMaxBlockBytes / row_bytes);
  const size_t dim = config_.dim;
  for (size_t begin = 0; begin < n; begin += block_rows) {
    // The batch's arrays are written as they are (fp32 rows need no
    // conversion), not assembled into one buffer first: one copy less.
    const size_t count = std::min(block_rows, n - begin);
    EMBER_RETURN_IF_ERROR(block_header(kRowsBlock, count));
    EMBER_RETURN_IF_ERROR(Write(bytes_of(r.keys, begin, count, 1)));
    if (config_.dtype == DType::kFp32) {
      EMBER_RETURN_IF_ERROR(Write(bytes_of(r.values, begin, count, dim)));
    } else {
      std::string converted(count * dim * DTypeSize(config_.dtype), '\0');
      ConvertElements(r.values.data() + begin * dim, DType::kFp32, converted.data(), config_.dtype,
                      count * dim);
      EMBER_RETURN_IF_ERROR(Write(converted));
    }
    EMBER_RETURN_IF_ERROR(Write(bytes_of(r.state, begin, count, state_floats_)));
    if (has_step_) EMBER_RETURN_IF_ERROR(Write(bytes_of(r.steps, begin, count, 1)));
    EMBER_RETURN_IF_ERROR(Write(bytes_of(r.scores, begin, count, 1)));
    EMBER_RETURN_IF_ERROR(Write(std::string(Pad8(kBlockHeaderBytes + count * row_bytes), '\0')));
    rows_ += count;
  }
  if (!batch.removed.empty()) {
    EMBER_RETURN_IF_ERROR(block_header(kRemovedBlock, batch.removed.size()));
    EMBER_RETURN_IF_ERROR(Write(bytes_of(batch.removed, 0, batch.removed.size(), 1)));
    removed_ += batch.removed.size();
  }
  return absl::OkStatus();
}

absl::Status TableFileWriter::Finish(v1::CheckpointTable* entry) {
  std::string footer;
  PutU32(&footer, kFooterBlock);
  PutU32(&footer, 0);
  PutU64(&footer, rows_);
  PutU64(&footer, removed_);
  EMBER_RETURN_IF_ERROR(Write(footer));
  EMBER_RETURN_IF_ERROR(file_->Sync());
  EMBER_RETURN_IF_ERROR(file_->Close());
  entry->set_file_bytes(bytes_);
  entry->set_file_crc32c(crc_);
  entry->set_rows(rows_);
  entry->set_removed_keys(removed_);
  return absl::OkStatus();
}

// ---- TableFileReader

TableFileReader::TableFileReader(std::string path, std::unique_ptr<SequentialFile> file,
                                 const v1::CheckpointTable& entry, const TableConfig& config)
    : path_(std::move(path)),
      file_(std::move(file)),
      entry_(entry),
      config_(config),
      state_floats_(config.dim * OptimizerStateFloatsPerElement(config.optimizer.kind)),
      has_step_(OptimizerHasStepCount(config.optimizer.kind)) {}

TableFileReader::~TableFileReader() = default;

absl::Status TableFileReader::Corrupt(absl::string_view what) const {
  return absl::DataLossError(
      absl::StrCat("checkpoint file '", path_, "' at offset ", offset_, ": ", what));
}

absl::Status TableFileReader::Read(size_t n, std::string* out) {
  out->resize(n);
  size_t got = 0;
  EMBER_RETURN_IF_ERROR(file_->Read(n, out->data(), &got));
  if (got != n) {
    return Corrupt(absl::StrCat("truncated: expected ", n, " more bytes, received ", got));
  }
  crc_ = Crc32cExtend(crc_, out->data(), n);
  offset_ += n;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TableFileReader>> TableFileReader::Open(
    FileSystem* fs, const std::string& path, const v1::CheckpointTable& entry,
    const TableConfig& config) {
  EMBER_ASSIGN_OR_RETURN(uint64_t size, fs->FileSize(path));
  if (size != entry.file_bytes()) {
    return absl::DataLossError(absl::StrCat("checkpoint file '", path, "': expected ",
                                            entry.file_bytes(), " bytes (manifest), received ",
                                            size, size < entry.file_bytes() ? " (truncated)" : ""));
  }
  if (size < kHeaderBytes + kFooterBytes) {
    return absl::DataLossError(absl::StrCat("checkpoint file '", path, "': ", size,
                                            " bytes is shorter than a header and a footer"));
  }
  // The counts size the restore's allocations before any block is read, so
  // they are checked against what a file of this size can hold.
  const uint64_t body = size - kHeaderBytes - kFooterBytes;
  const uint64_t most_rows = body / RowBytes(
      config, config.dim * OptimizerStateFloatsPerElement(config.optimizer.kind),
      OptimizerHasStepCount(config.optimizer.kind));
  if (entry.rows() > most_rows || entry.removed_keys() > body / 8) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint file '", path, "': the manifest says ", entry.rows(), " rows and ",
        entry.removed_keys(), " removed keys, a file of ", size, " bytes holds at most ",
        most_rows, " rows or ", body / 8, " removed keys"));
  }
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file, fs->NewSequentialFile(path));
  std::unique_ptr<TableFileReader> r(new TableFileReader(path, std::move(file), entry, config));
  std::string header;
  EMBER_RETURN_IF_ERROR(r->Read(kHeaderBytes, &header));
  const std::string expected = Header(config, r->state_floats_, r->has_step_);
  if (header.compare(0, 8, expected, 0, 8) != 0) {
    return absl::DataLossError(
        absl::StrCat("checkpoint file '", path, "': not an Ember table file (bad magic)"));
  }
  if (GetU32(header.data() + 8) != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint file '", path, "': format version ", GetU32(header.data() + 8),
                     ", this build reads version ", kCheckpointFormatVersion));
  }
  if (header != expected) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint file '", path, "': header (dtype, dim, state, flags) = (",
        GetU32(header.data() + 12), ", ", GetU32(header.data() + 16), ", ",
        GetU32(header.data() + 20), ", ", GetU32(header.data() + 24),
        ") does not match table '", config.name, "' of the manifest: expected (",
        GetU32(expected.data() + 12), ", ", GetU32(expected.data() + 16), ", ",
        GetU32(expected.data() + 20), ", ", GetU32(expected.data() + 24), ")"));
  }
  return r;
}

absl::Status TableFileReader::Next(SnapshotBatch* out, bool* done) {
  out->Clear();
  *done = false;
  std::string head;
  EMBER_RETURN_IF_ERROR(Read(kBlockHeaderBytes, &head));
  const uint32_t kind = GetU32(head.data());
  const uint64_t n = GetU64(head.data() + 8);
  const uint64_t left = entry_.file_bytes() - offset_;  // after this block header
  if (kind == kFooterBlock) {
    std::string rest;
    EMBER_RETURN_IF_ERROR(Read(kFooterBytes - kBlockHeaderBytes, &rest));
    const uint64_t removed = GetU64(rest.data());
    if (offset_ != entry_.file_bytes()) return Corrupt("data after the footer");
    if (n != rows_ || removed != removed_) {
      return Corrupt(absl::StrCat("footer counts ", n, " rows and ", removed,
                                  " removed keys, the blocks held ", rows_, " and ", removed_));
    }
    if (rows_ != entry_.rows() || removed_ != entry_.removed_keys()) {
      return Corrupt(absl::StrCat("expected ", entry_.rows(), " rows and ",
                                  entry_.removed_keys(), " removed keys (manifest), received ",
                                  rows_, " and ", removed_));
    }
    if (crc_ != entry_.file_crc32c()) {
      return absl::DataLossError(absl::StrCat("checkpoint file '", path_,
                                              "': CRC32C mismatch: expected ",
                                              entry_.file_crc32c(), " (manifest), computed ",
                                              crc_));
    }
    *done = true;
    return absl::OkStatus();
  }
  if (left < kFooterBytes - kBlockHeaderBytes + 8) {
    return Corrupt("block header where the footer belongs");
  }
  const uint64_t room = left - (kFooterBytes - kBlockHeaderBytes);
  if (kind == kRemovedBlock) {
    if (n > room / 8) return Corrupt(absl::StrCat("removed-keys block of ", n, " keys overruns the file"));
    EMBER_RETURN_IF_ERROR(Read(n * 8, &buffer_));
    out->removed.resize(n);
    if (n > 0) memcpy(out->removed.data(), buffer_.data(), n * 8);
    removed_ += n;
    return absl::OkStatus();
  }
  if (kind != kRowsBlock) {
    return Corrupt(absl::StrCat("unknown block kind ", kind, " (expected 1, 2 or 3)"));
  }
  const size_t row_bytes = RowBytes(config_, state_floats_, has_step_);
  if (n == 0 || n > room / row_bytes) {
    return Corrupt(absl::StrCat("rows block of ", n, " rows of ", row_bytes,
                                " bytes does not fit the ", room, " bytes left"));
  }
  const size_t payload = n * row_bytes;
  EMBER_RETURN_IF_ERROR(Read(payload + Pad8(kBlockHeaderBytes + payload), &buffer_));
  const size_t dim = config_.dim;
  ExportedRows& rows = out->rows;
  const char* p = buffer_.data();
  rows.keys.resize(n);
  memcpy(rows.keys.data(), p, n * 8);
  p += n * 8;
  rows.values.resize(n * dim);
  ConvertElements(p, config_.dtype, rows.values.data(), DType::kFp32, n * dim);
  p += n * dim * DTypeSize(config_.dtype);
  rows.state.resize(n * state_floats_);
  if (state_floats_ != 0) memcpy(rows.state.data(), p, n * state_floats_ * 4);  // SGD: none
  p += n * state_floats_ * 4;
  rows.steps.assign(n, 0);
  if (has_step_) {
    memcpy(rows.steps.data(), p, n * 4);
    p += n * 4;
  }
  rows.scores.resize(n);
  memcpy(rows.scores.data(), p, n * 4);
  rows_ += n;
  return absl::OkStatus();
}

// ---- MANIFEST

absl::Status WriteManifest(FileSystem* fs, const std::string& dir,
                           const v1::CheckpointManifest& manifest) {
  std::string body;
  if (!manifest.SerializeToString(&body)) {
    return absl::InternalError("checkpoint manifest: cannot serialize");
  }
  std::string out(kManifestMagic, 8);
  PutU32(&out, kCheckpointFormatVersion);
  PutU32(&out, static_cast<uint32_t>(body.size()));
  out += body;
  PutU32(&out, Crc32c(out));
  const std::string path = JoinPath(dir, kManifestFileName);
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(path));
  EMBER_RETURN_IF_ERROR(file->Append(out));
  EMBER_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

absl::StatusOr<v1::CheckpointManifest> ReadManifest(FileSystem* fs, const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestFileName);
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("checkpoint file '", path, "': ", what));
  };
  EMBER_ASSIGN_OR_RETURN(uint64_t size, fs->FileSize(path));
  if (size < 20) return corrupt(absl::StrCat(size, " bytes is too short for a manifest"));
  if (size > kMaxManifestBytes + 20) {
    return corrupt(absl::StrCat(size, " bytes is larger than any manifest"));
  }
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file, fs->NewSequentialFile(path));
  std::string data(size, '\0');
  size_t got = 0;
  EMBER_RETURN_IF_ERROR(file->Read(size, data.data(), &got));
  if (got != size) return corrupt("shorter than its size");
  if (data.compare(0, 8, kManifestMagic, 8) != 0) return corrupt("not a manifest (bad magic)");
  const uint32_t version = GetU32(data.data() + 8);
  const uint32_t length = GetU32(data.data() + 12);
  if (uint64_t{length} + 20 != size) {
    return corrupt(absl::StrCat("length field says ", length, " bytes of manifest, the file holds ",
                                size - 20, " (truncated or corrupted)"));
  }
  const uint32_t stored_crc = GetU32(data.data() + 16 + length);
  const uint32_t crc = Crc32c(data.data(), 16 + length);
  if (stored_crc != crc) {
    return corrupt(absl::StrCat("CRC32C mismatch: stored ", stored_crc, ", computed ", crc));
  }
  if (version != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint file '", path, "': format version ", version,
                     ", this build reads version ", kCheckpointFormatVersion));
  }
  v1::CheckpointManifest manifest;
  if (!manifest.ParseFromArray(data.data() + 16, static_cast<int>(length))) {
    return corrupt("the manifest does not parse");
  }
  if (manifest.format_version() != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint file '", path, "': format version ", manifest.format_version(),
        ", this build reads version ", kCheckpointFormatVersion));
  }
  return manifest;
}

}  // namespace ember
