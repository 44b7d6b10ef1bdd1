// Which storage engine a shard's tables live in: "cpu" (host memory, the
// default) or "cuda:N" (GPU N's memory). The shard creates every table
// through NewStore, so the choice is one flag (ember-server --device).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/embedding_store.h"

namespace ember {

struct StoreDevice {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // the CUDA device for kCuda

  // "cpu" or "cuda:N".
  std::string ToString() const;
};

// Parses "cpu" or "cuda:N"; INVALID_ARGUMENT naming the field otherwise.
absl::StatusOr<StoreDevice> ParseStoreDevice(absl::string_view text);

// OK if tables can be created on `device` here: FAILED_PRECONDITION when the
// build has no CUDA or the GPU does not exist.
absl::Status CheckStoreDevice(const StoreDevice& device);

// The store for `config` on `device`.
absl::StatusOr<std::unique_ptr<EmbeddingStore>> NewStore(const TableConfig& config,
                                                         const StoreDevice& device);

}  // namespace ember
