#include "common/vector_dispatch.h"

namespace ember {

const char* VectorIsa() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(EMBER_NO_VECTOR_CLONES)
  // The same order of preference as the clones' resolver.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "avx512f";
  if (__builtin_cpu_supports("avx2")) return "avx2";
#endif
  return "baseline";
}

}  // namespace ember
