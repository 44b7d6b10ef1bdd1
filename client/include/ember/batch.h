// The input of one training step: per sparse feature, the ids of every
// example in CSR form, and how each example's rows are combined.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ember {

// How the rows of one example's ids become one vector (w: per-id weight,
// 1 when a feature has no weights; an example with no ids gives zeros):
//   kSum   sum_j w_j e_j
//   kMean  sum_j w_j e_j / sum_j w_j
//   kSqrtN sum_j w_j e_j / sqrt(sum_j w_j^2)
enum class Combiner { kSum, kMean, kSqrtN };

// One feature of one step. Example i's ids are keys[offsets[i] .. offsets[i+1]).
struct FeatureBatch {
  std::vector<int64_t> offsets;  // batch_size + 1 entries, offsets[0] == 0, non-decreasing
  std::vector<uint64_t> keys;    // offsets.back() keys, any uint64 value
  std::vector<float> weights;    // empty (all 1) or one finite weight per key
};

// One step: a FeatureBatch per feature of the pipeline, in the pipeline's
// feature order, all with the same batch size.
struct Batch {
  std::vector<FeatureBatch> features;
};

// OK, or INVALID_ARGUMENT naming the feature, the field and expected vs.
// received. `feature_names` gives the number of features and their names.
absl::Status ValidateBatch(const Batch& batch, const std::vector<std::string>& feature_names);

}  // namespace ember
