#include "server/protobuf_log.h"

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "absl/time/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"

namespace ember {
namespace {

struct Source {
  absl::Time last_logged = absl::InfinitePast();
  uint64_t held_back = 0;
};

std::mutex mu;
std::map<std::pair<std::string, int>, Source> sources;  // by file and line
absl::Duration min_interval = absl::Seconds(10);
std::atomic<uint64_t> logged{0};
std::atomic<uint64_t> suppressed{0};

spdlog::level::level_enum Level(google::protobuf::LogLevel level) {
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO:
      return spdlog::level::info;
    case google::protobuf::LOGLEVEL_WARNING:
      return spdlog::level::warn;
    case google::protobuf::LOGLEVEL_ERROR:
      return spdlog::level::err;
    case google::protobuf::LOGLEVEL_FATAL:
      return spdlog::level::critical;
  }
  return spdlog::level::err;
}

void Handle(google::protobuf::LogLevel level, const char* filename, int line,
            const std::string& message) {
  uint64_t held_back = 0;
  if (level != google::protobuf::LOGLEVEL_FATAL) {  // a fatal line is the last: always shown
    std::lock_guard<std::mutex> lock(mu);
    Source& source = sources[{filename != nullptr ? filename : "", line}];
    const absl::Time now = absl::Now();
    if (now - source.last_logged < min_interval) {
      ++source.held_back;
      suppressed.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    source.last_logged = now;
    held_back = std::exchange(source.held_back, 0);
  }
  logged.fetch_add(1, std::memory_order_relaxed);
  if (held_back == 0) {
    spdlog::log(Level(level), "protobuf: {}", message);
  } else {
    spdlog::log(Level(level), "protobuf: {} ({} more such lines held back since the last one)",
                message, held_back);
  }
}

}  // namespace

void RouteProtobufLogs(absl::Duration interval) {
  {
    std::lock_guard<std::mutex> lock(mu);
    min_interval = interval;
  }
  google::protobuf::SetLogHandler(&Handle);
}

ProtobufLogCounts ProtobufLogLines() {
  return {.logged = logged.load(std::memory_order_relaxed),
          .held_back = suppressed.load(std::memory_order_relaxed)};
}

}  // namespace ember
