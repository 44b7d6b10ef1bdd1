// The definition of one embedding table, as the stores see it (no protobuf).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace ember {

enum class InitializerKind : uint8_t { kZeros, kConstant, kUniform, kNormal, kTruncatedNormal };

struct InitializerConfig {
  InitializerKind kind = InitializerKind::kZeros;
  // kConstant: the value.
  float value = 0.0f;
  // kUniform: [min, max).
  float min = 0.0f;
  float max = 0.0f;
  // kNormal, kTruncatedNormal.
  float mean = 0.0f;
  float stddev = 0.0f;
  // Initial rows are a pure function of (seed, key, element).
  uint64_t seed = 0;
};

enum class OptimizerKind : uint8_t { kSgd, kAdagrad, kAdam, kFtrl, kRmsProp };

// Hyper-parameters; fields an optimizer does not use are ignored. Defaults are
// resolved (no zero-means-default here: the proto conversion does that).
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.01f;
  // Adagrad: starting accumulator. FTRL: starting n. RMSProp: starting ms.
  float initial_accumulator = 0.1f;
  // Adagrad, Adam and RMSProp.
  float epsilon = 1e-7f;
  // Adam.
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  // FTRL.
  float ftrl_beta = 1.0f;
  float l1 = 0.0f;
  float l2 = 0.0f;
  // RMSProp: decay of the mean square, in [0, 1).
  float rho = 0.9f;
};

enum class EvictionPolicy : uint8_t { kNone, kLru, kLfu };

// Rows untouched for a while are evicted (ember.v1.Ttl); at most one set.
struct TtlConfig {
  uint64_t seconds = 0;
  uint64_t steps = 0;
  bool enabled() const { return seconds > 0 || steps > 0; }
  uint64_t limit() const { return seconds > 0 ? seconds : steps; }
};

// A new key is stored at its min_count-th lookup (ember.v1.Admission).
struct AdmissionConfig {
  uint32_t min_count = 0;     // <= 1: off
  uint32_t sketch_width = 0;  // counters per sketch row, a power of two
  bool enabled() const { return min_count > 1; }
  static constexpr uint32_t kDefaultSketchWidth = 1u << 18;
  static constexpr uint32_t kMaxMinCount = 65535;  // the counters saturate there
};

struct TableConfig {
  std::string name;
  // Elements per row, 1..kMaxDim.
  uint32_t dim = 0;
  // Storage type of the rows; optimizer state is always fp32.
  DType dtype = DType::kFp32;
  InitializerConfig initializer;
  OptimizerConfig optimizer;
  // Most rows on this shard; 0 = limited by memory (and kMaxRowsPerStore).
  uint64_t capacity = 0;
  EvictionPolicy eviction = EvictionPolicy::kNone;
  TtlConfig ttl;
  AdmissionConfig admission;

  static constexpr uint32_t kMaxDim = 65536;
};

// OK, or INVALID_ARGUMENT naming the table and the first offending field.
absl::Status ValidateTableConfig(const TableConfig& config);

// fp32 optimizer-state values per row element (Adagrad 1, Adam 2, FTRL 2, RMSProp 1).
size_t OptimizerStateFloatsPerElement(OptimizerKind kind);

// True if the optimizer keeps a per-row step count (Adam's bias correction).
bool OptimizerHasStepCount(OptimizerKind kind);

absl::string_view OptimizerName(OptimizerKind kind);
absl::string_view InitializerName(InitializerKind kind);
absl::string_view EvictionPolicyName(EvictionPolicy policy);

}  // namespace ember
