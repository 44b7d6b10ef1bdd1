// The workload flags ember-trainer and ember-lookup-bench share: batch size,
// cardinalities, Zipf exponent, seed and whether ids are fresh every step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/reference_workload.h"

namespace ember::bench {

struct WorkloadFlags {
  int batch = 128;
  uint64_t scale_down = 1;
  double cardinality_scale = 1.0;
  double zipf_exponent = kReferenceZipfExponent;
  uint64_t seed = 42;
  // false: a ring of batches drawn up front is cycled (the working set stays
  // warm); true: every step draws a new batch.
  bool fresh_ids = false;

  std::vector<Feature> Features() const { return ReferenceFeatures(scale_down, cardinality_scale); }
  // The id stream of pipeline `p` (seed + p), continued by `round` > 0 with
  // a different seed.
  BatchGenerator Generator(int p, int round = 0) const {
    return BatchGenerator(Features(), batch,
                          seed + static_cast<uint64_t>(p) + 1000003ULL * static_cast<uint64_t>(round),
                          zipf_exponent);
  }
  // One line for the benchmark's header.
  std::string Describe() const;
};

// The flags' values; exits with a message on an invalid one.
WorkloadFlags ReadWorkloadFlags();

}  // namespace ember::bench
