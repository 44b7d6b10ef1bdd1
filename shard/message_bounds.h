// Upper bounds on the serialized size of the shard's answers, computed
// before any row is read or inserted: gRPC refuses to send a message over
// its limit, and by then a lookup's new keys would already be stored.
// Internal to server/.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace ember {

// Bytes a message field of `n` payload bytes takes: tag, length, payload.
inline uint64_t FieldBytes(uint64_t n) {
  uint64_t varint = 1;
  for (uint64_t v = n; v >= 0x80; v >>= 7) ++varint;
  return 1 + varint + n;
}

// At most the serialized size of the TableRows answering `table` with
// bytes fields of the given sizes (rows; with a peek also state, steps,
// stored) and `varints` varint fields (dtype, dim, missing; a peek's
// replayable too; at most 11 bytes each with their tags): those and the
// name as fields, and the entry's own tag and length in LookupResponse.
inline uint64_t TableRowsBound(const std::string& table, std::initializer_list<uint64_t> fields,
                               int varints) {
  uint64_t n = FieldBytes(table.size()) + varints * 11;
  for (uint64_t f : fields) n += FieldBytes(f);
  return FieldBytes(n);
}

}  // namespace ember
