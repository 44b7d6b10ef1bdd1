// Where a benchmark pipeline's batches come from: a ring drawn up front and
// cycled, or a background thread that draws a fresh batch for every step.
#pragma once

#include <time.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "bench/reference_workload.h"
#include "ember/batch.h"

namespace ember::bench {

// Thread safety: Next() from one thread at a time.
class BatchSource {
 public:
  // Cycles `ring` (not empty).
  explicit BatchSource(std::vector<Batch> ring) : ring_(std::move(ring)) {}
  // Draws from `gen` on a thread of its own, keeping up to `ahead` batches
  // ready, so that drawing is off the pipeline's thread.
  BatchSource(BatchGenerator gen, size_t ahead) : gen_(std::move(gen)), ahead_(ahead) {
    thread_ = std::thread([this] { Draw(); });
  }
  ~BatchSource() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  BatchSource(const BatchSource&) = delete;
  BatchSource& operator=(const BatchSource&) = delete;

  Batch Next() {
    if (!ring_.empty()) return ring_[next_++ % ring_.size()];
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !ready_.empty(); });
    Batch b = std::move(ready_.front());
    ready_.pop_front();
    cv_.notify_all();
    return b;
  }

  // CPU seconds the drawing thread has used: benchmarks leave it out of the
  // trainer's CPU, since a real input pipeline's cost is not Ember's.
  double DrawCpuSeconds() const { return draw_cpu_ns_.load() * 1e-9; }

 private:
  void Draw() {
    for (;;) {
      Batch b = gen_->Next();
      timespec ts{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      draw_cpu_ns_ = ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || ready_.size() < ahead_; });
      if (stop_) return;
      ready_.push_back(std::move(b));
      cv_.notify_all();
    }
  }

  std::vector<Batch> ring_;
  size_t next_ = 0;
  std::optional<BatchGenerator> gen_;
  size_t ahead_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  bool stop_ = false;
  std::atomic<int64_t> draw_cpu_ns_{0};
  std::thread thread_;
};

}  // namespace ember::bench
