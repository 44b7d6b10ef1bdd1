// CRC32C (Castagnoli, the iSCSI/ext4/leveldb checksum) of byte strings.
//
// Abseil 20220623 has no absl/crc, so this is the one implementation in the
// project: the SSE4.2 crc32 instruction where the CPU has it (checked once at
// run time, so binaries stay portable), a table-driven loop elsewhere. Both
// give the same values; tests/common/crc32c_test.cc checks them against the
// RFC 3720 vectors.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace ember {

// The CRC32C of `data` appended to bytes whose CRC32C is `crc` (0 for none),
// so Crc32cExtend(Crc32c(a), b) == Crc32c(a + b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }
inline uint32_t Crc32c(absl::string_view s) { return Crc32c(s.data(), s.size()); }

namespace internal {
// The portable path alone, for tests that compare the two.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);
// True if Crc32cExtend uses the CPU's crc32 instruction.
bool Crc32cIsHardware();
}  // namespace internal

}  // namespace ember
