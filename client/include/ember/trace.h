// ember::TraceRecorder: a timeline of a trainer's step pipelines in the
// Chrome trace-event JSON format, which Perfetto (ui.perfetto.dev) and
// chrome://tracing open. Give one recorder to PipelineOptions::trace; every
// pipeline using it adds its spans under a process "worker N":
//   trainer          Prefetch, Wait (the exposed embedding wait), Push
//   network          Exchange (one round trip to every shard, with the
//                    pushed and fetched steps), Pool (pooling on the host)
//   shard K          Exchange RPC attempts to shard K (retries included),
//                    with their status code
//
// Thread safety: Record and WriteJson may be called from any thread.
// Memory: at most max_events spans are kept; later ones are counted as
// dropped (the JSON says how many).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ember {

// Where a span is drawn: a process (a group of tracks) and a thread (one
// track) in the trace-event format. Spans on one track must nest.
struct TraceTrack {
  uint32_t process = 1;
  uint32_t thread = 0;
};

class TraceRecorder {
 public:
  explicit TraceRecorder(size_t max_events = 1 << 20);

  // A span of `track` from `start` to `end`. `name` must outlive the
  // recorder (a string literal). `args` is a JSON object's members without
  // braces (e.g. "\"step\":3"), may be empty.
  void Record(TraceTrack track, const char* name, absl::Time start, absl::Time end,
              std::string args = "");
  // Names a track (shown as a thread name) or a process (a group of tracks).
  void NameTrack(TraceTrack track, std::string name);
  void NameProcess(uint32_t process, std::string name);

  // The trace as JSON: {"traceEvents":[...], "displayTimeUnit":"ms", ...}.
  std::string ToJson() const;
  // Writes ToJson() to `path`; an error names the path.
  absl::Status WriteJson(const std::string& path) const;

  size_t events() const;
  uint64_t dropped() const;

 private:
  struct Span {
    TraceTrack track;
    const char* name;
    int64_t start_us;
    int64_t dur_us;
    std::string args;
  };
  const size_t max_events_;
  const absl::Time origin_;
  mutable std::mutex mu_;
  std::vector<Span> spans_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<TraceTrack, std::string>> track_names_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint32_t, std::string>> process_names_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ember
