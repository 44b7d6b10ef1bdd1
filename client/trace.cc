#include "ember/trace.h"

#include <fstream>

#include "absl/strings/str_cat.h"

namespace ember {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrCat("\\u00", c < 0x10 ? "0" : "", absl::Hex(static_cast<int>(c)));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

TraceRecorder::TraceRecorder(size_t max_events) : max_events_(max_events), origin_(absl::Now()) {}

void TraceRecorder::Record(TraceTrack track, const char* name, absl::Time start, absl::Time end,
                           std::string args) {
  Span s{track, name, absl::ToInt64Microseconds(start - origin_),
         std::max<int64_t>(0, absl::ToInt64Microseconds(end - start)), std::move(args)};
  std::lock_guard<std::mutex> lock(mu_);
  if (spans_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  spans_.push_back(std::move(s));
}

void TraceRecorder::NameTrack(TraceTrack track, std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  track_names_.emplace_back(track, std::move(name));
}

void TraceRecorder::NameProcess(uint32_t process, std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  process_names_.emplace_back(process, std::move(name));
}

std::string TraceRecorder::ToJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "{\"traceEvents\":[";
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  for (const auto& [process, name] : process_names_) {
    sep();
    absl::StrAppend(&out, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":", process,
                    ",\"args\":{\"name\":", JsonString(name), "}}");
  }
  for (const auto& [track, name] : track_names_) {
    sep();
    absl::StrAppend(&out, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":", track.process,
                    ",\"tid\":", track.thread, ",\"args\":{\"name\":", JsonString(name), "}}");
  }
  for (const Span& s : spans_) {
    sep();
    absl::StrAppend(&out, "{\"ph\":\"X\",\"cat\":\"ember\",\"name\":", JsonString(s.name),
                    ",\"pid\":", s.track.process, ",\"tid\":", s.track.thread,
                    ",\"ts\":", s.start_us, ",\"dur\":", s.dur_us,
                    ",\"args\":{", s.args, "}}");
  }
  absl::StrAppend(&out, "],\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_events\":", dropped_,
                  "}}\n");
  return out;
}

absl::Status TraceRecorder::WriteJson(const std::string& path) const {
  const std::string json = ToJson();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << json;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("trace: cannot write '", path, "'"));
  return absl::OkStatus();
}

size_t TraceRecorder::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_.size();
}

uint64_t TraceRecorder::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

}  // namespace ember
