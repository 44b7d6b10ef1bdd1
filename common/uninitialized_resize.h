// Growing a std::string that the caller is about to overwrite whole, without
// first zero-filling it. Protobuf `bytes` fields are std::strings: a shard's
// rows or a client's gradients are sized, then written by a gather, and
// std::string::resize would write every byte twice (at dim 128 a memset of
// ~1 MB per request).
#pragma once

#include <cstddef>
#include <string>

namespace ember {

// Sets s->size() to n. Bytes past the old size are unspecified: the caller
// must write all of them before reading any. Not thread-safe on one string.
void ResizeUninitialized(std::string* s, size_t n);

}  // namespace ember
