// libprotobuf's log lines, into the shard's log (spdlog) and bounded.
//
// libprotobuf logs one ERROR line each time it parses a string field that
// holds invalid UTF-8, and a request that does so fails to parse before any
// Ember code sees it (so before authentication): any client could write a
// line to the shard's log per request. With RouteProtobufLogs installed,
// each source line of libprotobuf logs at most once per `interval`; the
// lines held back in between are counted, and the count is reported with
// the next line logged from that source.
//
// Thread safety: RouteProtobufLogs must be called before any other thread
// uses protobuf (libprotobuf's SetLogHandler is not thread-safe); the
// handler it installs may run on any thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace ember {

void RouteProtobufLogs(absl::Duration interval = absl::Seconds(10));

// libprotobuf's lines so far: written to the log, and held back.
struct ProtobufLogCounts {
  uint64_t logged = 0;
  uint64_t held_back = 0;
};
ProtobufLogCounts ProtobufLogLines();

}  // namespace ember
