#include "ember/batch.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace ember {

absl::Status ValidateBatch(const Batch& batch, const std::vector<std::string>& feature_names) {
  if (batch.features.size() != feature_names.size()) {
    return absl::InvalidArgumentError(absl::StrCat("batch field 'features': expected ",
                                                   feature_names.size(), " features, received ",
                                                   batch.features.size()));
  }
  size_t batch_size = 0;
  for (size_t f = 0; f < batch.features.size(); ++f) {
    const FeatureBatch& fb = batch.features[f];
    const std::string where = absl::StrCat("feature '", feature_names[f], "' field ");
    if (fb.offsets.empty() || fb.offsets[0] != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "'offsets': expected batch_size + 1 entries starting at 0, received ",
                       fb.offsets.empty() ? std::string("none")
                                          : absl::StrCat("first ", fb.offsets[0])));
    }
    if (f == 0) batch_size = fb.offsets.size() - 1;
    if (fb.offsets.size() - 1 != batch_size) {
      return absl::InvalidArgumentError(absl::StrCat(where, "'offsets': expected batch size ",
                                                     batch_size, " (as feature '",
                                                     feature_names[0], "'), received ",
                                                     fb.offsets.size() - 1));
    }
    for (size_t i = 1; i < fb.offsets.size(); ++i) {
      if (fb.offsets[i] < fb.offsets[i - 1]) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "'offsets': expected non-decreasing, received ", fb.offsets[i],
                         " after ", fb.offsets[i - 1], " at index ", i));
      }
    }
    if (static_cast<uint64_t>(fb.offsets.back()) != fb.keys.size()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "'keys': expected ", fb.offsets.back(),
                                                     " keys (offsets.back()), received ",
                                                     fb.keys.size()));
    }
    if (!fb.weights.empty() && fb.weights.size() != fb.keys.size()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "'weights': expected 0 or ",
                                                     fb.keys.size(), " weights, received ",
                                                     fb.weights.size()));
    }
    for (size_t j = 0; j < fb.weights.size(); ++j) {
      if (!std::isfinite(fb.weights[j])) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "'weights': expected finite values, received ", fb.weights[j], " at index ", j));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ember
