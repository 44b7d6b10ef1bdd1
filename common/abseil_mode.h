// Process-wide Abseil settings for Ember's binaries.
#pragma once

#include "absl/synchronization/mutex.h"

namespace ember {

// Debian's Abseil is built without NDEBUG, so every absl::Mutex acquisition
// (gRPC's and the stores') would feed a process-wide deadlock graph behind a
// global lock: about a fifth of a loaded shard's CPU. Ember's binaries switch
// it off at start; a library does not change it behind its host's back.
inline void DisableAbslDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace ember
