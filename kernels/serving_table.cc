#include "kernels/serving_table.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_system.h"
#include "common/status_macros.h"
#include "kernels/initializer_math.h"
#include "kernels/table_config_proto.h"

namespace ember {
namespace {

constexpr char kMagic[8] = {'E', 'M', 'B', 'E', 'R', 'E', 'X', 'P'};
constexpr size_t kHeaderBytes = 32;  // magic, version, dtype, dim, config length, rows

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T Get(const char* p) {
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}
size_t Pad8(size_t n) { return (8 - n % 8) % 8; }

}  // namespace

struct ServingTable::Initializer {
  InitializerConfig config;
};

absl::Status WriteServingTable(const std::string& path, const v1::TableConfig& config,
                               absl::Span<const uint64_t> keys, absl::Span<const float> rows,
                               DType dtype) {
  const std::string where = absl::StrCat("serving table '", path, "'");
  if (dtype != DType::kFp32 && dtype != DType::kFp16) {
    return absl::InvalidArgumentError(absl::StrCat(where, " field 'dtype': expected fp32 or fp16, received ",
                                                   DTypeName(dtype)));
  }
  const size_t n = keys.size();
  const size_t dim = config.dim();
  if (dim == 0 || rows.size() != n * dim) {
    return absl::InvalidArgumentError(absl::StrCat(where, " field 'rows': expected ", n, " x dim ",
                                                   dim, " floats, received ", rows.size()));
  }
  for (size_t i = 1; i < n; ++i) {
    if (keys[i - 1] >= keys[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " field 'keys': expected ascending unique keys, received ", keys[i - 1],
          " before ", keys[i], " at index ", i));
    }
  }
  // Stored normalized (defaults filled), so that a reader can rebuild the
  // initializer without knowing the defaults.
  absl::StatusOr<v1::TableConfig> normalized = NormalizeTableConfig(config);
  if (normalized.ok()) {
    if (absl::Status s = TableConfigFromProto(*normalized).status(); !s.ok()) normalized = s;
  }
  if (!normalized.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " field 'config': ", normalized.status().message()));
  }
  const std::string config_bytes = normalized->SerializeAsString();
  std::string out(kMagic, 8);
  Put<uint32_t>(&out, kServingTableFormatVersion);
  Put<uint32_t>(&out, dtype == DType::kFp32 ? 1 : 2);
  Put<uint32_t>(&out, static_cast<uint32_t>(dim));
  Put<uint32_t>(&out, static_cast<uint32_t>(config_bytes.size()));
  Put<uint64_t>(&out, n);
  out += config_bytes;
  out.append(Pad8(out.size()), '\0');
  out.append(reinterpret_cast<const char*>(keys.data()), n * 8);
  const size_t at = out.size();
  out.resize(at + n * dim * DTypeSize(dtype));
  if (n > 0) ConvertElements(rows.data(), DType::kFp32, out.data() + at, dtype, n * dim);
  Put<uint32_t>(&out, Crc32c(out));

  FileSystem* fs = FileSystem::Posix();
  const std::string temp = path + ".tmp";
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(temp));
  EMBER_RETURN_IF_ERROR(file->Append(out));
  EMBER_RETURN_IF_ERROR(file->Sync());
  EMBER_RETURN_IF_ERROR(file->Close());
  return fs->Rename(temp, path);
}

absl::StatusOr<std::unique_ptr<ServingTable>> ServingTable::Load(const std::string& path) {
  FileSystem* fs = FileSystem::Posix();
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("serving table '", path, "': ", what));
  };
  EMBER_ASSIGN_OR_RETURN(uint64_t size, fs->FileSize(path));
  if (size < kHeaderBytes + 4) return corrupt(absl::StrCat(size, " bytes is too short"));
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file, fs->NewSequentialFile(path));
  std::string data(size, '\0');
  size_t got = 0;
  EMBER_RETURN_IF_ERROR(file->Read(size, data.data(), &got));
  if (got != size) return corrupt("shorter than its size");
  if (data.compare(0, 8, kMagic, 8) != 0) return corrupt("not an Ember serving table (bad magic)");
  const uint32_t version = Get<uint32_t>(&data[8]);
  if (version != kServingTableFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("serving table '", path, "': format version ",
                                                      version, ", this build reads version ",
                                                      kServingTableFormatVersion));
  }
  const uint32_t dtype_code = Get<uint32_t>(&data[12]);
  const uint64_t dim = Get<uint32_t>(&data[16]);
  const uint64_t config_bytes = Get<uint32_t>(&data[20]);
  const uint64_t n = Get<uint64_t>(&data[24]);
  if (dtype_code != 1 && dtype_code != 2) return corrupt(absl::StrCat("unknown dtype ", dtype_code));
  const DType dtype = dtype_code == 1 ? DType::kFp32 : DType::kFp16;
  const uint64_t keys_at = kHeaderBytes + config_bytes + Pad8(kHeaderBytes + config_bytes);
  const uint64_t room = size - 4;
  const uint64_t row_bytes = dim * DTypeSize(dtype) + 8;
  if (dim == 0 || keys_at > room || n > (room - keys_at) / row_bytes ||
      keys_at + n * row_bytes != room) {
    return corrupt(absl::StrCat("sizes (", n, " rows, dim ", dim, ", config ", config_bytes,
                                " bytes) do not add up to the file's ", size, " bytes"));
  }
  const uint32_t crc = Crc32c(data.data(), room);
  if (crc != Get<uint32_t>(&data[room])) {
    return corrupt(absl::StrCat("CRC32C mismatch: stored ", Get<uint32_t>(&data[room]),
                                ", computed ", crc));
  }
  std::unique_ptr<ServingTable> t(new ServingTable());
  if (!t->config_.ParseFromArray(data.data() + kHeaderBytes, static_cast<int>(config_bytes)) ||
      t->config_.dim() != dim) {
    return corrupt("the table definition does not parse or disagrees with the header's dim");
  }
  absl::StatusOr<TableConfig> config = TableConfigFromProto(t->config_);
  if (!config.ok()) return corrupt(config.status().message());
  t->dtype_ = dtype;
  t->storage_dtype_ = config->dtype;
  t->initializer_ = std::make_shared<Initializer>(Initializer{config->initializer});
  t->keys_.resize(n);
  if (n > 0) memcpy(t->keys_.data(), data.data() + keys_at, n * 8);
  for (uint64_t i = 1; i < n; ++i) {
    if (t->keys_[i - 1] >= t->keys_[i]) {
      return corrupt(absl::StrCat("keys not ascending at index ", i));
    }
  }
  t->rows_.assign(data.begin() + static_cast<std::ptrdiff_t>(keys_at + n * 8),
                  data.begin() + static_cast<std::ptrdiff_t>(room));
  return t;
}

absl::Status ServingTable::Lookup(absl::Span<const uint64_t> keys, absl::Span<float> out,
                                  uint8_t* found) const {
  const size_t d = dim();
  if (out.size() != keys.size() * d) {
    return absl::InvalidArgumentError(absl::StrCat(
        "serving table '", config_.name(), "' field 'out': expected ", keys.size(), " x dim ", d,
        " floats, received ", out.size()));
  }
  const size_t row_bytes = d * DTypeSize(dtype_);
  for (size_t i = 0; i < keys.size(); ++i) {
    float* row = out.data() + i * d;
    auto it = std::lower_bound(keys_.begin(), keys_.end(), keys[i]);
    const bool hit = it != keys_.end() && *it == keys[i];
    if (hit) {
      ConvertElements(rows_.data() + static_cast<size_t>(it - keys_.begin()) * row_bytes, dtype_,
                      row, DType::kFp32, d);
    } else {
      const uint64_t base = init::KeyBase(initializer_->config.seed, keys[i]);
      for (size_t j = 0; j < d; ++j) {
        row[j] = RoundTo(storage_dtype_,
                         init::Element(initializer_->config, base, static_cast<uint32_t>(j)));
      }
    }
    if (found != nullptr) found[i] = hit ? 1 : 0;
  }
  return absl::OkStatus();
}

}  // namespace ember
