#include "shard/work_pool.h"

#include <algorithm>
#include <system_error>
#include <utility>

#include "spdlog/spdlog.h"

namespace ember {

WorkPool::WorkPool(int threads, absl::Duration idle_exit) : idle_exit_(idle_exit) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < std::max(threads, 1); ++i) StartThread(/*kept=*/true);
}

void WorkPool::StartThread(bool kept) {
  threads_.emplace_back([this, kept] { Run(kept); });  // it waits for mu_, held here
  ++running_;
}

void WorkPool::TakeEnded(std::vector<std::thread>* ended) {
  for (const std::thread::id id : ended_) {
    auto it = std::find_if(threads_.begin(), threads_.end(),
                           [id](const std::thread& t) { return t.get_id() == id; });
    ended->push_back(std::move(*it));
    threads_.erase(it);
  }
  ended_.clear();
}

void WorkPool::Stop() {
  std::list<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (Idle* idle : idle_) {
      idle->stop = true;
      idle->cv.notify_one();
    }
    idle_.clear();
    threads.swap(threads_);
    ended_.clear();
  }
  for (std::thread& t : threads) t.join();
}

void WorkPool::Post(std::function<void()> work) {
  std::vector<std::thread> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      if (!idle_.empty()) {
        Idle* idle = idle_.back();
        idle_.pop_back();
        idle->work = std::move(work);
        idle->cv.notify_one();
      } else {
        queue_.push_back(std::move(work));
        if (running_ < kMaxThreads) {
          try {
            StartThread(/*kept=*/false);
          } catch (const std::system_error& e) {
            // Out of threads: the closure waits for a busy one, as it does
            // at kMaxThreads.
            spdlog::warn("work pool: no thread added beside {} ({})", running_, e.what());
          }
        }
      }
      work = nullptr;
      TakeEnded(&ended);
    }
  }
  for (std::thread& t : ended) t.join();
  if (work) work();
}

size_t WorkPool::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

void WorkPool::Run(bool kept) {
  Idle me;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    std::function<void()> work;
    if (!queue_.empty()) {
      work = std::move(queue_.front());
      queue_.pop_front();
    } else if (stopping_) {
      break;
    } else {
      idle_.push_back(&me);
      const auto handed = [&] { return me.work != nullptr || me.stop; };
      if (kept) {
        me.cv.wait(lock, handed);
      } else if (!me.cv.wait_for(lock, absl::ToChronoNanoseconds(idle_exit_), handed)) {
        idle_.erase(std::find(idle_.begin(), idle_.end(), &me));
        ended_.push_back(std::this_thread::get_id());
        break;
      }
      if (me.stop) break;  // Stop took it off idle_
      work = std::move(me.work);
      me.work = nullptr;
    }
    lock.unlock();
    work();
    work = nullptr;  // what it holds is released outside the lock
    lock.lock();
  }
  --running_;
}

}  // namespace ember
