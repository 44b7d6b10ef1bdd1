// ember-export: turns one cluster checkpoint (one directory per shard) into
// serving tables: per table, rows only (fp32 or fp16), keys sorted, in the
// format ember::ServingTable reads (kernels/serving_table.h).
//
//   ember-export --checkpoints=/ckpt/s0/cluster-199-...,/ckpt/s1/cluster-199-...
//       --out=/models/v3 [--dtype=fp16] [--tables=user,item]      (one command line)
#include <cstdio>
#include <map>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_system.h"
#include "common/key_router.h"
#include "common/status_macros.h"
#include "kernels/serving_table.h"
#include "shard/checkpointer.h"
#include "shard/reshard.h"

ABSL_FLAG(std::vector<std::string>, checkpoints, {},
          "The checkpoint directory of every shard of the cluster, comma-separated.");
ABSL_FLAG(std::string, out, "", "Directory for <table>.emb files (created).");
ABSL_FLAG(std::string, dtype, "fp32", "Row type in the files: fp32 or fp16.");
ABSL_FLAG(std::vector<std::string>, tables, {}, "Tables to export; empty: all.");

namespace ember {
namespace {

absl::Status Run() {
  const std::vector<std::string> paths = absl::GetFlag(FLAGS_checkpoints);
  const std::string out = absl::GetFlag(FLAGS_out);
  const std::string dtype_name = absl::GetFlag(FLAGS_dtype);
  if (paths.empty()) return absl::InvalidArgumentError("--checkpoints: expected one per shard, received none");
  if (out.empty()) return absl::InvalidArgumentError("--out: expected a directory, received none");
  if (dtype_name != "fp32" && dtype_name != "fp16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype: expected fp32 or fp16, received '", dtype_name, "'"));
  }
  const DType dtype = dtype_name == "fp32" ? DType::kFp32 : DType::kFp16;
  const std::vector<std::string> wanted = absl::GetFlag(FLAGS_tables);

  struct Merged {
    v1::TableConfig config;
    std::vector<std::pair<uint64_t, std::vector<float>>> rows;
  };
  std::map<std::string, Merged> tables;
  // Every shard exactly once, one cut: one cluster checkpoint.
  EMBER_ASSIGN_OR_RETURN(CheckpointParts parts, OpenCheckpointParts(FileSystem::Posix(), paths));
  const int64_t step = parts.step;
  const KeyRouter one = *KeyRouter::Make(kDefaultRouting, 1);
  for (size_t t = 0; t < parts.tables.size(); ++t) {
    const std::string& name = parts.tables[t].name();
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), name) == wanted.end()) continue;
    Merged& m = tables[name];
    m.config = parts.tables[t];
    const size_t dim = m.config.dim();
    EMBER_RETURN_IF_ERROR(StreamRoutedRows(
        FileSystem::Posix(), parts, t, one, [](uint32_t) { return true; },
        [&](uint32_t, const SnapshotBatch& batch) {
          for (size_t r = 0; r < batch.rows.keys.size(); ++r) {
            m.rows.emplace_back(batch.rows.keys[r],
                                std::vector<float>(batch.rows.values.begin() + r * dim,
                                                   batch.rows.values.begin() + (r + 1) * dim));
          }
          return absl::OkStatus();
        }));
  }
  for (const std::string& name : wanted) {
    if (!tables.count(name)) {
      return absl::NotFoundError(absl::StrCat("--tables: table '", name, "' is in no checkpoint"));
    }
  }
  if (absl::Status s = FileSystem::Posix()->CreateDirs(out); !s.ok()) return s;
  for (auto& [name, m] : tables) {
    std::sort(m.rows.begin(), m.rows.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<uint64_t> keys;
    std::vector<float> values;
    keys.reserve(m.rows.size());
    for (auto& [key, row] : m.rows) {
      keys.push_back(key);
      values.insert(values.end(), row.begin(), row.end());
    }
    const std::string path = JoinPath(out, name + ".emb");
    if (absl::Status s = WriteServingTable(path, m.config, keys, values, dtype); !s.ok()) return s;
    std::printf("%s: %zu rows, dim %u, %s -> %s\n", name.c_str(), keys.size(), m.config.dim(),
                dtype_name.c_str(), path.c_str());
  }
  std::printf("exported %zu tables of step %lld from %u shards\n", tables.size(),
              static_cast<long long>(step), parts.shard_count);
  return absl::OkStatus();
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ember-export --checkpoints=<shard 0 checkpoint>,<shard 1 checkpoint>,... --out=DIR "
      "[--dtype=fp16] [--tables=a,b]");
  absl::ParseCommandLine(argc, argv);
  absl::Status s = ember::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "ember-export: %s\n", s.ToString().c_str());
    return 2;
  }
  return 0;
}
