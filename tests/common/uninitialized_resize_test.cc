#include "common/uninitialized_resize.h"

#include <string>

#include "gtest/gtest.h"

namespace ember {
namespace {

// Every size a protobuf bytes field goes through: empty, within the inline
// buffer, past it (a reallocation), larger still, and smaller again.
TEST(ResizeUninitializedTest, GivesExactlyTheRequestedSizeAndKeepsThePrefix) {
  std::string s;
  for (size_t n : {0, 5, 15, 16, 17, 31, 100, 4096, 12, 0, 70000}) {
    const std::string before = s;
    ResizeUninitialized(&s, n);
    ASSERT_EQ(s.size(), n);
    ASSERT_GE(s.capacity(), n);
    ASSERT_EQ(s.c_str()[n], '\0');
    const size_t kept = std::min(before.size(), n);
    EXPECT_EQ(s.substr(0, kept), before.substr(0, kept)) << "n = " << n;
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + n) % 26);
  }
}

}  // namespace
}  // namespace ember
