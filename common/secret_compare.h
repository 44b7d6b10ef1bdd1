// Constant-time comparison of secrets (bearer tokens of the shard's services
// and of its metrics endpoint).
#pragma once

#include "absl/strings/string_view.h"

namespace ember {

// Whether `presented` equals `known`, compared without an early exit, so
// that the time taken does not tell how much of a guess was right (only
// whether its length was).
inline bool SameSecret(absl::string_view known, absl::string_view presented) {
  if (presented.size() != known.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < known.size(); ++i) diff |= known[i] ^ presented[i];
  return diff == 0;
}

}  // namespace ember
