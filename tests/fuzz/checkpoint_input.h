// The input layout of the checkpoint fuzzer, shared with the corpus writer so
// that its seeds are genuine checkpoints:
//   byte 0   mode: 0 the MANIFEST file as is; 1 a CheckpointManifest proto,
//            framed by the fuzzer (magic, version, CRC32C); 2 one table's
//            data file, its manifest built by the fuzzer to match (size,
//            CRC32C and the counts from its footer), so that the reader's
//            checks past the CRC are reached.
//   byte 1   mode 2: which of FuzzTables() the file belongs to.
//   bytes 2- the payload.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "common/crc32c.h"
#include "common/key_router.h"
#include "ember/v1/checkpoint.pb.h"
#include "kernels/table_config_proto.h"
#include "shard/checkpoint_format.h"
#include "tests/fuzz/fuzz_tables.h"

namespace ember::fuzz {

enum CheckpointFuzzMode : uint8_t { kRawManifest = 0, kManifestProto = 1, kTableFile = 2 };

inline std::string CheckpointFuzzInput(CheckpointFuzzMode mode, uint8_t table,
                                       const std::string& payload) {
  std::string out;
  out.push_back(static_cast<char>(mode));
  out.push_back(static_cast<char>(table));
  return out + payload;
}

// A MANIFEST file holding `proto` (docs/checkpoints.md's framing).
inline std::string FrameManifest(const std::string& proto) {
  std::string out("EMBERMAN", 8);
  const uint32_t version = kCheckpointFormatVersion;
  const uint32_t length = static_cast<uint32_t>(proto.size());
  out.append(reinterpret_cast<const char*>(&version), 4);
  out.append(reinterpret_cast<const char*>(&length), 4);
  out += proto;
  const uint32_t crc = Crc32c(out);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  return out;
}

// The manifest of a full checkpoint "c1" of shard 0 of 1 holding one table,
// FuzzTables()[table % 3], whose data file "t.tbl" is `file`: its size and
// CRC32C, and the counts its footer (the last 16 bytes) states.
inline v1::CheckpointManifest ManifestFor(uint8_t table, const std::string& file) {
  const auto tables = FuzzTables();
  v1::CheckpointManifest m;
  m.set_format_version(kCheckpointFormatVersion);
  m.set_id("c1");
  m.set_kind(v1::CHECKPOINT_KIND_FULL);
  m.set_sequence(1);
  m.set_shard_index(0);
  m.set_shard_count(1);
  m.set_routing(kDefaultRouting);
  m.set_step(-1);
  auto* entry = m.add_tables();
  *entry->mutable_config() = *NormalizeTableConfig(tables[table % tables.size()]);
  entry->set_file("t.tbl");
  entry->set_file_bytes(file.size());
  entry->set_file_crc32c(Crc32c(file));
  uint64_t rows = 0, removed = 0;
  if (file.size() >= 16) {
    memcpy(&rows, file.data() + file.size() - 16, 8);
    memcpy(&removed, file.data() + file.size() - 8, 8);
  }
  entry->set_rows(rows);
  entry->set_removed_keys(removed);
  entry->set_full(true);
  return m;
}

}  // namespace ember::fuzz
