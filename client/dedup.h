// KeyDeduplicator: unique keys in first-occurrence order plus, for every key
// added, the index of its unique key (unique + inverse). Reusable: Clear
// keeps the hash table's memory for the next step.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace ember {

class KeyDeduplicator {
 public:
  void Clear() {
    index_.clear();
    unique_.clear();
  }
  // Appends one inverse index per key to `inverse`.
  void Add(absl::Span<const uint64_t> keys, std::vector<uint32_t>* inverse) {
    inverse->reserve(inverse->size() + keys.size());
    for (uint64_t k : keys) {
      auto [it, inserted] = index_.try_emplace(k, static_cast<uint32_t>(unique_.size()));
      if (inserted) unique_.push_back(k);
      inverse->push_back(it->second);
    }
  }
  const std::vector<uint64_t>& unique() const { return unique_; }

 private:
  absl::flat_hash_map<uint64_t, uint32_t> index_;
  std::vector<uint64_t> unique_;
};

}  // namespace ember
