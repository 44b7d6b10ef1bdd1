#include "kernels/table_config.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/row_policy.h"

namespace ember {
namespace {

absl::Status Invalid(const TableConfig& c, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("table '", c.name, "' field '", field, "': ", what));
}

bool Finite(float v) { return std::isfinite(v); }

}  // namespace

absl::Status ValidateTableConfig(const TableConfig& c) {
  if (c.name.empty() || c.name.size() > 128) {
    return Invalid(c, "name", absl::StrCat("expected 1-128 characters, received ", c.name.size()));
  }
  for (char ch : c.name) {
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '.' || ch == '-';
    if (!ok) return Invalid(c, "name", "expected only [A-Za-z0-9_.-]");
  }
  if (c.dim == 0 || c.dim > TableConfig::kMaxDim) {
    return Invalid(c, "dim",
                   absl::StrCat("expected 1..", TableConfig::kMaxDim, ", received ", c.dim));
  }
  const InitializerConfig& in = c.initializer;
  switch (in.kind) {
    case InitializerKind::kZeros: break;
    case InitializerKind::kConstant:
      if (!Finite(in.value)) {
        return Invalid(c, "initializer.constant.value",
                       absl::StrCat("expected finite, received ", in.value));
      }
      break;
    case InitializerKind::kUniform:
      if (!Finite(in.min) || !Finite(in.max) || !(in.min < in.max)) {
        return Invalid(c, "initializer.uniform",
                       absl::StrCat("expected finite min < max, received min ", in.min, " max ",
                                    in.max));
      }
      break;
    case InitializerKind::kNormal:
    case InitializerKind::kTruncatedNormal:
      if (!Finite(in.mean) || !Finite(in.stddev) || !(in.stddev > 0)) {
        return Invalid(c, "initializer.stddev",
                       absl::StrCat("expected finite mean and stddev > 0, received mean ",
                                    in.mean, " stddev ", in.stddev));
      }
      break;
  }
  const OptimizerConfig& o = c.optimizer;
  if (!Finite(o.learning_rate) || !(o.learning_rate > 0)) {
    return Invalid(c, "optimizer.learning_rate",
                   absl::StrCat("expected > 0, received ", o.learning_rate));
  }
  if (!Finite(o.initial_accumulator) || o.initial_accumulator < 0) {
    return Invalid(c, "optimizer.initial_accumulator",
                   absl::StrCat("expected >= 0, received ", o.initial_accumulator));
  }
  if (!Finite(o.epsilon) || !(o.epsilon > 0)) {
    return Invalid(c, "optimizer.epsilon", absl::StrCat("expected > 0, received ", o.epsilon));
  }
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1)) {
    return Invalid(c, "optimizer.adam.beta",
                   absl::StrCat("expected beta1, beta2 in [0, 1), received ", o.beta1, ", ",
                                o.beta2));
  }
  if (!(o.rho >= 0 && o.rho < 1)) {
    return Invalid(c, "optimizer.rmsprop.rho",
                   absl::StrCat("expected in [0, 1), received ", o.rho));
  }
  const std::pair<const char*, float> ftrl[] = {
      {"optimizer.ftrl.beta", o.ftrl_beta}, {"optimizer.ftrl.l1", o.l1}, {"optimizer.ftrl.l2", o.l2}};
  for (const auto& [field, v] : ftrl) {
    if (!Finite(v) || v < 0) {
      return Invalid(c, field, absl::StrCat("expected finite >= 0, received ", v));
    }
  }
  if (o.kind == OptimizerKind::kFtrl && o.ftrl_beta == 0 && o.initial_accumulator == 0 &&
      o.l2 == 0) {
    return Invalid(c, "optimizer.ftrl",
                   "expected beta, initial_accumulator or l2 > 0 (all 0 divide by zero on the "
                   "first push), received beta 0, initial_accumulator 0, l2 0");
  }
  if (c.ttl.seconds > 0 && c.ttl.steps > 0) {
    return Invalid(c, "ttl", absl::StrCat("expected seconds or steps, not both; received seconds ",
                                          c.ttl.seconds, " and steps ", c.ttl.steps));
  }
  if (c.ttl.limit() > 0xffffffffu) {
    return Invalid(c, "ttl", absl::StrCat("expected at most ", 0xffffffffu, ", received ",
                                          c.ttl.limit()));
  }
  if (c.admission.enabled()) {
    const uint32_t w = c.admission.sketch_width;
    if (c.admission.min_count > AdmissionConfig::kMaxMinCount) {
      return Invalid(c, "admission.min_count",
                     absl::StrCat("expected at most ", AdmissionConfig::kMaxMinCount,
                                  ", received ", c.admission.min_count));
    }
    if (w < 64 || w > (1u << 26) || (w & (w - 1)) != 0) {
      return Invalid(c, "admission.sketch_width",
                     absl::StrCat("expected a power of two in [64, 2^26], received ", w));
    }
  }
  return absl::OkStatus();
}

size_t OptimizerStateFloatsPerElement(OptimizerKind kind) {
  return row::VisitOptimizer(kind, [](auto rule) { return size_t{decltype(rule)::kStateSlots}; });
}

bool OptimizerHasStepCount(OptimizerKind kind) {
  return row::VisitOptimizer(kind, [](auto rule) { return decltype(rule)::kHasStep; });
}

absl::string_view OptimizerName(OptimizerKind kind) {
  return row::VisitOptimizer(kind, [](auto rule) { return absl::string_view(decltype(rule)::kName); });
}

absl::string_view InitializerName(InitializerKind kind) {
  switch (kind) {
    case InitializerKind::kZeros: return "zeros";
    case InitializerKind::kConstant: return "constant";
    case InitializerKind::kUniform: return "uniform";
    case InitializerKind::kNormal: return "normal";
    case InitializerKind::kTruncatedNormal: return "truncated_normal";
  }
  return "unknown";
}

absl::string_view EvictionPolicyName(EvictionPolicy policy) {
  switch (policy) {
    case EvictionPolicy::kNone: return "none";
    case EvictionPolicy::kLru: return "lru";
    case EvictionPolicy::kLfu: return "lfu";
  }
  return "unknown";
}

}  // namespace ember
