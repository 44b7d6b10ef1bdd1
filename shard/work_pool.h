// WorkPool: threads running posted closures in order of posting. The async
// and callback gRPC services hand it the calls that may block (a lookup
// waiting for the consistency clock, an admin call), so that the threads
// that read calls never block.
//
// The pool grows: a closure posted while no thread is idle starts one more
// thread, and threads beyond the `threads` it keeps end after `idle_exit`
// without work. Why: a lookup waiting for the SSP clock holds its thread
// until other workers push, and a worker pushes its next step only once its
// own lookup is answered. With a fixed set of threads, a lookup that became
// ready while queued waited behind lookups that were waiting for that very
// worker's next push: every one of them stalled until its deadline. That
// happened with 4 SSP workers against a shard with 2 threads, and a
// production shard (--worker_threads=4) with more trainers than threads was
// exposed the same way. So no posted closure waits for a busy thread; a
// waiting lookup costs a thread, as it does on gRPC's sync server.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace ember {

class WorkPool {
 public:
  // Beyond this many threads, closures queue for a free one (a shard with
  // this many calls blocked at once has bigger problems than latency).
  static constexpr size_t kMaxThreads = 4096;

  // Keeps `threads` (>= 1) threads; the ones it adds under load end after
  // `idle_exit` without work.
  explicit WorkPool(int threads, absl::Duration idle_exit = absl::Seconds(30));
  ~WorkPool() { Stop(); }
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Runs every closure already posted, then joins the threads. Idempotent;
  // not concurrent with itself.
  void Stop();

  // Thread-safe. Starts `work` on an idle thread, or on a new one when none
  // is idle (up to kMaxThreads). After Stop, `work` runs on the caller's
  // thread.
  void Post(std::function<void()> work);

  // Threads running now (kept and added). Thread-safe.
  size_t threads() const;

 private:
  // A thread waiting for work; Post hands a closure to the one that waited
  // least (so the others stay idle long enough to end).
  struct Idle {
    std::condition_variable cv;
    std::function<void()> work;
    bool stop = false;
  };

  // `kept`: one of the threads the pool keeps, which ends only at Stop.
  void Run(bool kept);
  // Under mu_: starts a thread.
  void StartThread(bool kept);
  // Under mu_: moves the added threads that have left Run into `ended`, for
  // the caller to join outside the lock.
  void TakeEnded(std::vector<std::thread>* ended);

  const absl::Duration idle_exit_;
  mutable std::mutex mu_;
  std::deque<std::function<void()>> queue_;  // posted while no thread was idle
  std::vector<Idle*> idle_;                  // the last to go idle at the back
  bool stopping_ = false;
  size_t running_ = 0;  // threads inside Run
  std::list<std::thread> threads_;
  std::vector<std::thread::id> ended_;  // added threads that left Run, to join
};

}  // namespace ember
