#include "shard/write_log.h"

#include <algorithm>
#include <limits>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ember {

void WriteLog::Record(const std::string& table, int64_t step, absl::Span<const uint64_t> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  if (step < forgotten_below_) return;  // no lookup can ask about it
  tables_[table].push_back(Push{step, std::vector<uint64_t>(keys.begin(), keys.end())});
}

void WriteLog::Forget(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (step <= forgotten_below_) return;
  forgotten_below_ = step;
  for (auto it = tables_.begin(); it != tables_.end();) {
    std::deque<Push>& pushes = it->second;
    // Pushes of one worker arrive in step order, of several nearly so.
    pushes.erase(
        std::remove_if(pushes.begin(), pushes.end(), [&](const Push& p) { return p.step < step; }),
        pushes.end());
    if (pushes.empty()) {
      tables_.erase(it++);
    } else {
      ++it;
    }
  }
}

WriteLog::WriteLog(absl::Duration keep)
    : keep_(keep),
      token_(std::random_device()() * uint64_t{0x100000001} ^ absl::ToUnixNanos(absl::Now())),
      kept_(keep == absl::InfiniteDuration()) {
  if (token_ == 0) token_ = 1;
}

void WriteLog::RestartLocked() {
  if (++token_ == 0) token_ = 1;
  tables_.clear();
  // Only questions with the new token count, about pushes recorded from
  // now on: none of them is forgotten yet (steps may start over).
  forgotten_below_ = std::numeric_limits<int64_t>::min();
}

void WriteLog::ForgetAll() {
  std::lock_guard<std::mutex> lock(mu_);
  RestartLocked();
}

bool WriteLog::BeginPush() {
  std::lock_guard<std::mutex> lock(mu_);
  if (kept_ && keep_ != absl::InfiniteDuration() && absl::Now() - last_peek_ > keep_) {
    kept_ = false;  // no peek for `keep`: stop; no old token is answered
    RestartLocked();
  }
  if (!kept_) ++unrecorded_;
  return kept_;
}

void WriteLog::EndUnrecorded() {
  std::lock_guard<std::mutex> lock(mu_);
  --unrecorded_;
}

uint64_t WriteLog::token() const {
  std::lock_guard<std::mutex> lock(mu_);
  return token_;
}

uint64_t WriteLog::PeekToken() {
  std::lock_guard<std::mutex> lock(mu_);
  last_peek_ = absl::Now();
  kept_ = true;
  return unrecorded_ > 0 ? 0 : token_;
}

bool WriteLog::Changed(const std::string& table, int64_t since, uint64_t token,
                       absl::Span<const uint64_t> keys, std::string* changed,
                       uint64_t* count) const {
  absl::flat_hash_set<uint64_t> written;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (token == 0 || token != token_ || since < forgotten_below_) return false;
    auto it = tables_.find(table);
    if (it != tables_.end()) {
      for (const Push& p : it->second) {
        if (p.step >= since) written.insert(p.keys.begin(), p.keys.end());
      }
    }
  }
  changed->resize(keys.size());
  *count = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const bool c = written.contains(keys[i]);
    (*changed)[i] = c ? 1 : 0;
    *count += c;
  }
  return true;
}

}  // namespace ember
