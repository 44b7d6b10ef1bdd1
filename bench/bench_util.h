// Small helpers the benchmarks share: flag lists and order statistics.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace ember::bench {

// "0,1,5" -> {0, 1, 5}; parts that are not numbers are skipped.
inline std::vector<double> ParseList(const std::string& s) {
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    double v;
    if (absl::SimpleAtod(part, &v)) out.push_back(v);
  }
  return out;
}

// The q-quantile (0 <= q <= 1) of v by rank; 0 for an empty v.
inline double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

inline double Median(std::vector<double> v) { return Quantile(std::move(v), 0.5); }

}  // namespace ember::bench
