// Compiled as C++23 (see common/CMakeLists.txt) for
// std::string::resize_and_overwrite; the rest of Ember is C++20. libstdc++'s
// std::string has one layout in every -std mode, so the two mix.
#include "common/uninitialized_resize.h"

namespace ember {

void ResizeUninitialized(std::string* s, size_t n) {
#if defined(__cpp_lib_string_resize_and_overwrite)
  // Returns n, not the size passed to the operation: GCC 12's
  // resize_and_overwrite passes the grown capacity there when it reallocates.
  s->resize_and_overwrite(n, [n](char*, size_t) { return n; });
#else
  s->resize(n);
#endif
}

}  // namespace ember
