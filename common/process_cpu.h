// CPU time of the calling process, for benchmarks and GetShardInfo.
#pragma once

#include <sys/resource.h>

namespace ember {

// User plus system CPU seconds of every thread of this process so far.
inline double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace ember
