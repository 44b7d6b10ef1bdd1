#include "common/in_place_parse.h"

#include <cstdint>
#include <string>

#include <google/protobuf/descriptor.h>

namespace ember {
namespace {

// A cursor over the pieces: the next byte is pieces[piece][offset], at
// position `pos` of the whole.
struct Cursor {
  size_t piece = 0;
  size_t offset = 0;
  size_t pos = 0;
};

class PieceReader {
 public:
  explicit PieceReader(absl::Span<const absl::string_view> pieces) : pieces_(pieces) {
    for (absl::string_view p : pieces) size_ += p.size();
    Settle();
  }

  size_t size() const { return size_; }
  const Cursor& cursor() const { return at_; }

  bool ReadByte(uint8_t* b) {
    if (at_.pos >= size_) return false;
    *b = static_cast<uint8_t>(pieces_[at_.piece][at_.offset]);
    ++at_.offset;
    ++at_.pos;
    Settle();
    return true;
  }

  // A varint of at most `max_bytes` bytes; bits past 64 are dropped, as
  // protobuf drops them.
  bool ReadVarint(int max_bytes, uint64_t* v) {
    *v = 0;
    for (int i = 0; i < max_bytes; ++i) {
      uint8_t b;
      if (!ReadByte(&b)) return false;
      if (7 * i < 64) *v |= uint64_t{b & 0x7fu} << (7 * i);
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

  // A tag: at most 5 bytes, the bits past 32 dropped, as protobuf reads it.
  bool ReadTag(uint32_t* tag) {
    uint64_t v;
    if (!ReadVarint(5, &v)) return false;
    *tag = static_cast<uint32_t>(v);
    return true;
  }

  // A length: at most 5 bytes and below protobuf's bound (2 GiB less its
  // 16 slop bytes).
  bool ReadLength(uint64_t* length) {
    return ReadVarint(5, length) && *length <= INT32_MAX - 16;
  }

  // Moves past n bytes, appending their pieces to `out` if given.
  bool Skip(uint64_t n, std::vector<absl::string_view>* out) {
    if (n > size_ - at_.pos) return false;
    while (n > 0) {
      const absl::string_view p = pieces_[at_.piece];
      const size_t take = std::min<uint64_t>(n, p.size() - at_.offset);
      if (out != nullptr) out->push_back(p.substr(at_.offset, take));
      at_.offset += take;
      at_.pos += take;
      n -= take;
      Settle();
    }
    return true;
  }

  // Appends the bytes from `from` to the cursor to `out`.
  void CopySince(const Cursor& from, std::string* out) const {
    Cursor c = from;
    while (c.pos < at_.pos) {
      const absl::string_view p = pieces_[c.piece];
      const size_t take = std::min(p.size() - c.offset, at_.pos - c.pos);
      out->append(p.data() + c.offset, take);
      c.pos += take;
      ++c.piece;
      c.offset = 0;
    }
  }

 private:
  // Steps over the end of a piece (and empty pieces).
  void Settle() {
    while (at_.piece < pieces_.size() && at_.offset == pieces_[at_.piece].size()) {
      ++at_.piece;
      at_.offset = 0;
    }
  }

  absl::Span<const absl::string_view> pieces_;
  size_t size_ = 0;
  Cursor at_;
};

using OnField = std::function<void(google::protobuf::Message*, std::vector<absl::string_view>)>;

// Parses the message that ends at position `end` into `message`, following
// path[0] (and the rest below it).
bool ParseUntil(PieceReader& r, size_t end, absl::Span<const int> path,
                google::protobuf::Message* message, const OnField& on_field) {
  const google::protobuf::Reflection* reflection = message->GetReflection();
  const google::protobuf::FieldDescriptor* next =
      message->GetDescriptor()->FindFieldByNumber(path[0]);
  const bool leaf = path.size() == 1;
  std::string rest;  // every other field, as it was on the wire
  while (r.cursor().pos < end) {
    const Cursor field_start = r.cursor();
    uint32_t tag;
    if (!r.ReadTag(&tag)) return false;
    const uint64_t number = tag >> 3;
    const int wire_type = static_cast<int>(tag & 7);
    if (number == 0) return false;
    switch (wire_type) {
      case 0: {
        uint64_t v;
        if (!r.ReadVarint(10, &v)) return false;
        break;
      }
      case 1:
        if (!r.Skip(8, nullptr)) return false;
        break;
      case 5:
        if (!r.Skip(4, nullptr)) return false;
        break;
      case 2: {
        uint64_t length;
        // (The length itself may have run past `end`.)
        if (!r.ReadLength(&length) || r.cursor().pos > end || length > end - r.cursor().pos) {
          return false;
        }
        if (number == static_cast<uint64_t>(path[0]) && next != nullptr) {
          if (leaf) {
            std::vector<absl::string_view> value;
            r.Skip(length, &value);
            on_field(message, std::move(value));
          } else {
            google::protobuf::Message* child =
                next->is_repeated() ? reflection->AddMessage(message, next)
                                    : reflection->MutableMessage(message, next);
            if (!ParseUntil(r, r.cursor().pos + length, path.subspan(1), child, on_field)) {
              return false;
            }
          }
          continue;
        }
        if (!r.Skip(length, nullptr)) return false;
        break;
      }
      default:  // groups (3, 4) and invalid wire types
        return false;
    }
    r.CopySince(field_start, &rest);
  }
  if (r.cursor().pos != end) return false;  // a field ran past its message
  return rest.empty() || message->MergeFromString(rest);
}

// Whether `path` leads from `type` through message fields to a bytes field.
bool ValidPath(const google::protobuf::Descriptor* type, absl::Span<const int> path) {
  for (size_t d = 0; d < path.size(); ++d) {
    const google::protobuf::FieldDescriptor* f = type->FindFieldByNumber(path[d]);
    if (f == nullptr) return false;
    if (d + 1 == path.size()) return f->type() == google::protobuf::FieldDescriptor::TYPE_BYTES;
    if (f->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE) return false;
    type = f->message_type();
  }
  return false;
}

}  // namespace

bool ParseLeavingInPlace(absl::Span<const absl::string_view> pieces, absl::Span<const int> path,
                         google::protobuf::Message* message, const OnField& on_field) {
  message->Clear();
  if (!ValidPath(message->GetDescriptor(), path)) return false;
  PieceReader r(pieces);
  return ParseUntil(r, r.size(), path, message, on_field);
}

}  // namespace ember
