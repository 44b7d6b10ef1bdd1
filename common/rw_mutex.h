// RwMutex: the reader/writer lock of Ember's data structures.
//
// It is absl::Mutex, except in ThreadSanitizer builds: Debian's Abseil is not
// built with TSAN, so TSAN cannot see absl::Mutex's synchronisation and would
// report every access it protects. There std::shared_mutex (pthread_rwlock,
// which TSAN intercepts) stands in, keeping the same reader/writer semantics.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#if defined(__SANITIZE_THREAD__)
#include <shared_mutex>
#define EMBER_RW_MUTEX_IS_STD 1
#endif

namespace ember {

class ABSL_LOCKABLE RwMutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }

 private:
#if defined(EMBER_RW_MUTEX_IS_STD)
  std::shared_mutex mu_;
#else
  // absl::Mutex spelled with the std names used above.
  struct AbslMutex {
    void lock() { mu.Lock(); }
    void unlock() { mu.Unlock(); }
    void lock_shared() { mu.ReaderLock(); }
    void unlock_shared() { mu.ReaderUnlock(); }
    absl::Mutex mu;
  };
  AbslMutex mu_;
#endif
};

// Holds `mu` exclusively for its scope.
class ABSL_SCOPED_LOCKABLE WriterLock {
 public:
  explicit WriterLock(RwMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  RwMutex* mu_;
};

// Holds `mu` shared for its scope.
class ABSL_SCOPED_LOCKABLE ReaderLock {
 public:
  explicit ReaderLock(RwMutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) { mu_->ReaderLock(); }
  ~ReaderLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  RwMutex* mu_;
};

}  // namespace ember
