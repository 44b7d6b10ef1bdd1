// Writes the fuzz targets' seed corpora under the directory given:
// <dir>/<target>/<seed>. Seeds are genuine inputs (table configs, a real
// checkpoint's manifest and table files, requests' bytes) plus fixed
// pseudo-random bytes for the targets that read their input structurally.
//   fuzz_corpus <dir>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "ember/v1/embedding_service.pb.h"
#include "kernels/table_config.h"
#include "kernels/table_config_proto.h"
#include "tests/fuzz/checkpoint_input.h"
#include "tests/fuzz/fuzz_tables.h"
#include "tests/fuzz/memory_file_system.h"

namespace ember::fuzz {
namespace {

void Write(const std::filesystem::path& dir, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

// One table's data file holding `n` rows and no removed keys.
std::string TableFile(const v1::TableConfig& proto, size_t n) {
  const TableConfig config = *TableConfigFromProto(*NormalizeTableConfig(proto));
  MemoryFileSystem fs;
  auto writer = TableFileWriter::Create(&fs, "/t", config);
  SnapshotBatch batch;
  const size_t state = config.dim * OptimizerStateFloatsPerElement(config.optimizer.kind);
  for (size_t i = 0; i < n; ++i) {
    batch.rows.keys.push_back(1000 + 7 * i);
    for (uint32_t d = 0; d < config.dim; ++d) batch.rows.values.push_back(0.25f * (i + d));
    for (size_t s = 0; s < state; ++s) batch.rows.state.push_back(0.5f);
    batch.rows.steps.push_back(OptimizerHasStepCount(config.optimizer.kind) ? 3 : 0);
    batch.rows.scores.push_back(static_cast<uint32_t>(i));
  }
  v1::CheckpointTable entry;
  if (!(*writer)->Append(batch).ok() || !(*writer)->Finish(&entry).ok()) {
    fprintf(stderr, "fuzz_corpus: writing a table file failed\n");
    exit(1);
  }
  return fs.files()["/t"];
}

}  // namespace
}  // namespace ember::fuzz

int main(int argc, char** argv) {
  using namespace ember::fuzz;
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_corpus <dir>\n");
    return 2;
  }
  const std::filesystem::path root = argv[1];
  std::mt19937_64 rng(20261203);
  const auto tables = FuzzTables();
  for (size_t t = 0; t < tables.size(); ++t) {
    Write(root / "table_config_fuzzer", "table" + std::to_string(t), tables[t].SerializeAsString());
    const std::string file = TableFile(tables[t], 3 + t);
    Write(root / "checkpoint_fuzzer", "table_file" + std::to_string(t),
          CheckpointFuzzInput(kTableFile, static_cast<uint8_t>(t), file));
    const std::string manifest = ManifestFor(static_cast<uint8_t>(t), file).SerializeAsString();
    Write(root / "checkpoint_fuzzer", "manifest_proto" + std::to_string(t),
          CheckpointFuzzInput(kManifestProto, 0, manifest));
    Write(root / "checkpoint_fuzzer", "manifest_file" + std::to_string(t),
          CheckpointFuzzInput(kRawManifest, 0, FrameManifest(manifest)));
  }
  // Genuine exchange answers and requests, cut every 1 + i * 37 bytes.
  for (int i = 0; i < 4; ++i) {
    ember::v1::ExchangeResponse answer;
    answer.mutable_push()->add_tables()->set_table("t");
    ember::v1::ExchangeRequest request;
    request.mutable_push()->set_step(i);
    request.mutable_lookup()->add_tables()->set_table("t");
    for (int t = 0; t <= i; ++t) {
      ember::v1::TableRows* rows = answer.mutable_lookup()->add_tables();
      rows->set_table("table" + std::to_string(t));
      rows->set_dim(8);
      rows->set_rows(RandomBytes(rng, 32 * (1 + 5 * t)));
      ember::v1::TableGradients* g = request.mutable_push()->add_tables();
      g->set_table("table" + std::to_string(t));
      g->set_keys(RandomBytes(rng, 8 * (1 + 5 * t)));
      g->set_gradients(RandomBytes(rng, 32 * (1 + 5 * t)));
    }
    const uint8_t cut = static_cast<uint8_t>(i * 37);
    Write(root / "in_place_parse_fuzzer", "answer" + std::to_string(i),
          std::string{static_cast<char>(cut << 1), '\0'} + answer.SerializeAsString());
    Write(root / "in_place_parse_fuzzer", "request" + std::to_string(i),
          std::string{static_cast<char>((cut << 1) | 1), '\0'} + request.SerializeAsString());
  }
  for (int i = 0; i < 8; ++i) {
    Write(root / "shard_fuzzer", "random" + std::to_string(i), RandomBytes(rng, 64u << (i % 6)));
    Write(root / "wire_fuzzer", "random" + std::to_string(i), RandomBytes(rng, 9 + 40 * i));
  }
  printf("fuzz_corpus: seeds written under %s\n", root.c_str());
  return 0;
}
