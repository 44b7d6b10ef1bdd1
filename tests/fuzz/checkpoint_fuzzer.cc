// Fuzzes the checkpoint reader (manifest and table data files, through
// LoadCheckpointTables as ember-export and a restore use it) with the input
// laid out as tests/fuzz/checkpoint_input.h says.
//
// Checked besides memory safety and undefined behaviour: a refusal names the
// checkpoint asked for (a refused parent is named beside it), and a table
// file that loads holds no more rows than its manifest entry says.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "shard/checkpoint_format.h"
#include "shard/checkpointer.h"
#include "tests/fuzz/checkpoint_input.h"
#include "tests/fuzz/fuzz_tables.h"
#include "tests/fuzz/memory_file_system.h"

namespace ember::fuzz {
namespace {
constexpr char kDir[] = "/ckpt/c1";
}  // namespace
}  // namespace ember::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember;
  if (size < 2 || size > (1u << 20)) return 0;
  const uint8_t mode = data[0] % 3;
  const uint8_t table = data[1];
  const std::string payload(reinterpret_cast<const char*>(data) + 2, size - 2);

  google::protobuf::LogSilencer silence;  // invalid UTF-8 in a manifest is logged: noise
  fuzz::MemoryFileSystem fs;
  const std::string manifest_path = JoinPath(fuzz::kDir, kManifestFileName);
  uint64_t expected_rows = UINT64_MAX;
  switch (mode) {
    case fuzz::kRawManifest:
      fs.files()[manifest_path] = payload;
      break;
    case fuzz::kManifestProto:
      fs.files()[manifest_path] = fuzz::FrameManifest(payload);
      break;
    default: {
      const v1::CheckpointManifest m = fuzz::ManifestFor(table, payload);
      expected_rows = m.tables(0).rows();
      fs.files()[manifest_path] = fuzz::FrameManifest(m.SerializeAsString());
      fs.files()[JoinPath(fuzz::kDir, "t.tbl")] = payload;
      break;
    }
  }
  v1::CheckpointManifest manifest;
  absl::StatusOr<std::vector<RestoredTable>> tables =
      LoadCheckpointTables(&fs, fuzz::kDir, &manifest);
  if (!tables.ok()) {
    if (tables.status().message().find(fuzz::kDir) == std::string::npos) {
      fprintf(stderr, "checkpoint_fuzzer: refusal does not name the checkpoint: %s\n",
              tables.status().ToString().c_str());
      abort();
    }
    return 0;
  }
  for (const RestoredTable& t : *tables) {
    const uint64_t rows = t.store->Stats().rows;
    if (expected_rows != UINT64_MAX && rows > expected_rows) {
      fprintf(stderr, "checkpoint_fuzzer: %llu rows loaded, the manifest says %llu\n",
              static_cast<unsigned long long>(rows), static_cast<unsigned long long>(expected_rows));
      abort();
    }
  }
  return 0;
}
