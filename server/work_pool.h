// WorkPool: a fixed set of threads running posted closures in order of
// posting. The callback gRPC service hands it the calls that may block (a
// lookup waiting for the consistency clock), so that gRPC's own threads
// never do.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ember {

class WorkPool {
 public:
  explicit WorkPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~WorkPool() { Stop(); }
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Runs every closure already posted, then joins the threads. Idempotent;
  // not concurrent with itself.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  // Thread-safe. After Stop, `work` runs on the caller's thread.
  void Post(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopping_) {
        queue_.push_back(std::move(work));
        work = nullptr;
      }
    }
    if (work) {
      work();
    } else {
      cv_.notify_one();
    }
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      work();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ember
