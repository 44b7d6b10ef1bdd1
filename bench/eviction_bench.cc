// eviction_bench: hit rate of the CPU store's sampled LRU beside an exact
// LRU, on the reference workload with every table's capacity set to a
// fraction (default 50%) of the distinct keys the stream touches (issue
// 11, item 7). Each step looks up every table's distinct keys of one batch,
// as a trainer's deduplicated request does; a hit is a key already stored.
// Pass 1 counts the distinct keys per table; pass 2 replays the same stream
// (same seed) against both caches.
#include <cstdio>
#include <list>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/reference_workload.h"
#include "kernels/embedding_store.h"
#include "kernels/table_config_proto.h"

ABSL_FLAG(int, steps, 4000, "Steps (batches of 128 examples) in the stream.");
ABSL_FLAG(uint64_t, scale_down, 1, "Divide the workload's cardinalities by this.");
ABSL_FLAG(double, capacity_fraction, 0.5, "Capacity as a fraction of each table's distinct keys.");
ABSL_FLAG(uint64_t, seed, 42, "Seed of the id stream.");

namespace ember::bench {
namespace {

// An exact LRU set of keys with a fixed capacity.
class ExactLru {
 public:
  explicit ExactLru(size_t capacity) : capacity_(capacity) {}
  bool Access(uint64_t key) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return true;
    }
    order_.push_front(key);
    index_[key] = order_.begin();
    if (order_.size() > capacity_) {
      index_.erase(order_.back());
      order_.pop_back();
    }
    return false;
  }

 private:
  size_t capacity_;
  std::list<uint64_t> order_;
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> index_;
};

std::vector<std::vector<uint64_t>> UniquePerTable(const Batch& b) {
  std::vector<std::vector<uint64_t>> out;
  for (const FeatureBatch& f : b.features) {
    absl::flat_hash_set<uint64_t> seen;
    std::vector<uint64_t> keys;
    for (uint64_t k : f.keys) {
      if (seen.insert(k).second) keys.push_back(k);
    }
    out.push_back(std::move(keys));
  }
  return out;
}

}  // namespace
}  // namespace ember::bench

int main(int argc, char** argv) {
  using namespace ember;
  using namespace ember::bench;
  absl::ParseCommandLine(argc, argv);
  const int steps = absl::GetFlag(FLAGS_steps);
  const std::vector<Feature> features = ReferenceFeatures(absl::GetFlag(FLAGS_scale_down));
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  std::printf("eviction_bench: %u cores, %d steps of 128 examples, scale_down %lu, seed %lu, "
              "capacity %.0f%% of each table's distinct keys\n",
              std::thread::hardware_concurrency(), steps,
              static_cast<unsigned long>(absl::GetFlag(FLAGS_scale_down)),
              static_cast<unsigned long>(seed), 100 * absl::GetFlag(FLAGS_capacity_fraction));

  std::vector<absl::flat_hash_set<uint64_t>> distinct(features.size());
  {
    BatchGenerator gen(features, 128, seed);
    for (int s = 0; s < steps; ++s) {
      auto unique = UniquePerTable(gen.Next());
      for (size_t f = 0; f < features.size(); ++f) distinct[f].insert(unique[f].begin(), unique[f].end());
    }
  }
  std::vector<std::unique_ptr<EmbeddingStore>> sampled;
  std::vector<ExactLru> exact;
  for (size_t f = 0; f < features.size(); ++f) {
    v1::TableConfig c = ReferenceTableConfig(features[f], 8);
    const uint64_t cap = std::max<uint64_t>(
        1, static_cast<uint64_t>(absl::GetFlag(FLAGS_capacity_fraction) * distinct[f].size()));
    c.set_capacity(cap);
    c.set_eviction(v1::EVICTION_POLICY_LRU);
    auto config = TableConfigFromProto(*NormalizeTableConfig(c));
    auto store = NewCpuStore(*config);
    if (!store.ok()) {
      std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
      return 1;
    }
    sampled.push_back(std::move(*store));
    exact.emplace_back(cap);
  }
  std::vector<uint64_t> lookups(features.size()), sampled_hits(features.size()),
      exact_hits(features.size());
  BatchGenerator gen(features, 128, seed);
  std::vector<float> rows;
  for (int s = 0; s < steps; ++s) {
    auto unique = UniquePerTable(gen.Next());
    for (size_t f = 0; f < features.size(); ++f) {
      const auto& keys = unique[f];
      rows.resize(keys.size() * 8);
      auto found = sampled[f]->FindOrInsert(
          keys, DType::kFp32, {reinterpret_cast<uint8_t*>(rows.data()), rows.size() * 4});
      if (!found.ok()) {
        std::fprintf(stderr, "%s\n", found.status().ToString().c_str());
        return 1;
      }
      lookups[f] += keys.size();
      sampled_hits[f] += keys.size() - found->missing;
      for (uint64_t k : keys) exact_hits[f] += exact[f].Access(k) ? 1 : 0;
    }
  }
  std::printf("\n| table | distinct keys | capacity | lookups | sampled LRU hit rate | exact LRU hit rate |\n"
              "| --- | --- | --- | --- | --- | --- |\n");
  uint64_t total = 0, total_sampled = 0, total_exact = 0;
  for (size_t f = 0; f < features.size(); ++f) {
    std::printf("| %s | %zu | %lu | %lu | %.4f | %.4f |\n", features[f].table.c_str(),
                distinct[f].size(),
                static_cast<unsigned long>(sampled[f]->config().capacity),
                static_cast<unsigned long>(lookups[f]),
                double(sampled_hits[f]) / double(lookups[f]),
                double(exact_hits[f]) / double(lookups[f]));
    total += lookups[f];
    total_sampled += sampled_hits[f];
    total_exact += exact_hits[f];
  }
  std::printf("| all | | | %lu | %.4f | %.4f |\n", static_cast<unsigned long>(total),
              double(total_sampled) / double(total), double(total_exact) / double(total));
  return 0;
}
