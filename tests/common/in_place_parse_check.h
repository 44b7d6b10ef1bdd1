// The differential check of ParseLeavingInPlace against protobuf's own
// parser, shared by its unit test and its fuzz target.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/unknown_field_set.h>
#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/in_place_parse.h"

namespace ember::testing {

// Whether protobuf kept a group among the unknown fields of `m` or of a
// message below it (ParseLeavingInPlace refuses groups; proto3 never writes
// them, but protobuf's parser skips them).
inline bool HasGroup(const google::protobuf::Message& m) {
  const google::protobuf::Reflection* r = m.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = r->GetUnknownFields(m);
  for (int i = 0; i < unknown.field_count(); ++i) {
    if (unknown.field(i).type() == google::protobuf::UnknownField::TYPE_GROUP) return true;
  }
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->is_repeated()) {
      for (int j = 0; j < r->FieldSize(m, f); ++j) {
        if (HasGroup(r->GetRepeatedMessage(m, f, j))) return true;
      }
    } else if (HasGroup(r->GetMessage(m, f))) {
      return true;
    }
  }
  return false;
}

// Parses `bytes`, cut into pieces at `cuts` (ascending offsets), with
// ParseLeavingInPlace and with protobuf. Returns "" when they agree: both
// refuse the bytes (or protobuf accepts only a group, which ours refuses),
// or both accept them and, with each in-place value put back into its
// field, the messages are equal. Otherwise says how they differ.
template <typename M>
std::string CheckInPlaceParse(absl::string_view bytes, absl::Span<const int> path,
                              absl::Span<const size_t> cuts) {
  google::protobuf::LogSilencer quiet;  // protobuf logs each invalid UTF-8 string it refuses
  std::vector<absl::string_view> pieces;
  size_t from = 0;
  for (size_t cut : cuts) {
    if (cut < from || cut > bytes.size()) continue;
    pieces.push_back(bytes.substr(from, cut - from));
    from = cut;
  }
  pieces.push_back(bytes.substr(from));
  M ours;
  std::map<google::protobuf::Message*, std::string> values;
  std::string outside;  // a reported piece that is not inside the input
  const bool ours_ok = ParseLeavingInPlace(
      pieces, path, &ours,
      [&](google::protobuf::Message* parent, std::vector<absl::string_view> value) {
        std::string v;
        for (absl::string_view p : value) {
          if (p.data() < bytes.data() || p.data() + p.size() > bytes.data() + bytes.size()) {
            outside = "a reported piece lies outside the input";
          }
          v.append(p.data(), p.size());
        }
        values[parent] = std::move(v);  // the last occurrence wins, as in protobuf
      });
  M theirs;
  const bool theirs_ok = theirs.ParseFromString(std::string(bytes));
  if (!outside.empty()) return outside;
  if (ours_ok && !theirs_ok) return "accepted bytes that protobuf refuses";
  if (!ours_ok && theirs_ok && !HasGroup(theirs)) return "refused bytes that protobuf accepts";
  if (!ours_ok) return "";
  for (auto& [parent, value] : values) {
    const google::protobuf::FieldDescriptor* f =
        parent->GetDescriptor()->FindFieldByNumber(path.back());
    if (!parent->GetReflection()->GetString(*parent, f).empty()) {
      return "a field reported in place was also stored";
    }
    parent->GetReflection()->SetString(parent, f, value);
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(ours, theirs)) {
    return absl::StrCat("parsed differently from protobuf:\n", ours.DebugString(), "\nvs\n",
                        theirs.DebugString());
  }
  return "";
}

}  // namespace ember::testing
