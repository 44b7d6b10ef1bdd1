// Conversion between the wire's ember.v1.TableConfig and the stores' TableConfig.
#pragma once

#include "absl/status/statusor.h"
#include "ember/v1/types.pb.h"
#include "kernels/table_config.h"

namespace ember {

// Fills the defaults the .proto documents (zero means default), so that two
// requests that mean the same table compare equal. INVALID_ARGUMENT for a
// missing initializer or optimizer or an unknown dtype.
absl::StatusOr<v1::TableConfig> NormalizeTableConfig(const v1::TableConfig& config);

// Converts a normalized config and validates it (ValidateTableConfig).
absl::StatusOr<TableConfig> TableConfigFromProto(const v1::TableConfig& normalized);

// Wire dtype -> DType; INVALID_ARGUMENT naming `table` and `field` otherwise.
// DTYPE_UNSPECIFIED means fp32.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view table,
                                     absl::string_view field);
v1::DType DTypeToProto(DType dtype);

// Empty if the two normalized configs are equal, else the first differing
// field with both values, e.g. "dim: existing 8, requested 16".
std::string TableConfigDifference(const v1::TableConfig& existing,
                                  const v1::TableConfig& requested);

}  // namespace ember
