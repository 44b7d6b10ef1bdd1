// Fuzzes the table-config parser: any bytes parsed as ember.v1.TableConfig,
// then normalized, converted and validated as CreateTable and a restore do.
//
// Checked besides memory safety and undefined behaviour:
// - a refusal is INVALID_ARGUMENT with a message;
// - normalizing is idempotent;
// - a converted config passes ValidateTableConfig and differs from itself in
//   nothing (TableConfigDifference is empty).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "kernels/table_config_proto.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  fprintf(stderr, "table_config_fuzzer: %s\n", what.c_str());
  abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember;
  // Invalid UTF-8 in a name is refused by the parser, which logs it: noise.
  google::protobuf::LogSilencer silence;
  v1::TableConfig config;
  if (!config.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<v1::TableConfig> normalized = NormalizeTableConfig(config);
  if (!normalized.ok()) {
    if (normalized.status().code() != absl::StatusCode::kInvalidArgument ||
        normalized.status().message().empty()) {
      Fail("normalize refused with " + normalized.status().ToString());
    }
    return 0;
  }
  absl::StatusOr<v1::TableConfig> again = NormalizeTableConfig(*normalized);
  // Bytes, not field values: a NaN differs from itself.
  if (!again.ok() || again->SerializeAsString() != normalized->SerializeAsString()) {
    Fail("normalizing twice changed the config: " + normalized->ShortDebugString());
  }
  absl::StatusOr<TableConfig> converted = TableConfigFromProto(*normalized);
  if (!converted.ok()) {
    if (converted.status().message().empty()) Fail("empty refusal from TableConfigFromProto");
    return 0;
  }
  absl::Status valid = ValidateTableConfig(*converted);
  if (!valid.ok()) Fail("converted config fails validation: " + valid.ToString());
  // CreateTable compares a valid config with the existing table's.
  const std::string difference = TableConfigDifference(*normalized, *normalized);
  if (!difference.empty()) Fail("a config differs from itself: " + difference);
  return 0;
}
