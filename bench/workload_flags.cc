#include "bench/workload_flags.h"

#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"

ABSL_FLAG(int, batch, 128, "Examples per step per pipeline.");
ABSL_FLAG(uint64_t, scale_down, 1, "Divide every cardinality by this (100: the test variant).");
ABSL_FLAG(double, cardinality_scale, 1.0,
          "Multiply every cardinality by this (after --scale_down): 10 makes the tail 10x longer.");
ABSL_FLAG(double, zipf_exponent, ember::bench::kReferenceZipfExponent,
          "Exponent of the Zipf id distribution of every feature (not 1).");
ABSL_FLAG(uint64_t, seed, 42, "Seed of the id streams (pipeline p uses seed + p).");
ABSL_FLAG(bool, fresh_ids, false,
          "Draw a new batch for every step instead of cycling batches drawn up front, so that "
          "the working set is not kept warm by repetition.");

namespace ember::bench {

WorkloadFlags ReadWorkloadFlags() {
  WorkloadFlags w;
  w.batch = absl::GetFlag(FLAGS_batch);
  w.scale_down = absl::GetFlag(FLAGS_scale_down);
  w.cardinality_scale = absl::GetFlag(FLAGS_cardinality_scale);
  w.zipf_exponent = absl::GetFlag(FLAGS_zipf_exponent);
  w.seed = absl::GetFlag(FLAGS_seed);
  w.fresh_ids = absl::GetFlag(FLAGS_fresh_ids);
  const char* bad = nullptr;
  if (w.batch < 1) bad = "--batch: expected >= 1";
  if (w.scale_down < 1) bad = "--scale_down: expected >= 1";
  if (!(w.cardinality_scale > 0)) bad = "--cardinality_scale: expected > 0";
  if (!(w.zipf_exponent > 0) || w.zipf_exponent == 1.0) bad = "--zipf_exponent: expected > 0 and != 1";
  if (bad != nullptr) {
    std::fprintf(stderr, "%s\n", bad);
    std::exit(2);
  }
  return w;
}

std::string WorkloadFlags::Describe() const {
  return absl::StrFormat(
      "17 features (cardinality / %u x %g), Zipf %g, batch %d, seed %u, %s", scale_down,
      cardinality_scale, zipf_exponent, batch, seed,
      fresh_ids ? "fresh ids every step" : "batches drawn up front and cycled");
}

}  // namespace ember::bench
