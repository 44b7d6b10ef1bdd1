// ServerProcess: a real ember-server child process for integration tests.
//
// Starts the binary with --port=0 on 127.0.0.1, waits (bounded) for its
// "EMBER_READY port=N" line, and kills it on destruction if still running.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ember::testing {

class ServerProcess {
 public:
  // `args` are extra flags (e.g. "--shard_count=2"). Fails if the process
  // exits or does not report ready within `timeout`. `stderr_path`: a file
  // the process's log (stderr) is written to; empty: the test's stderr.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::vector<std::string>& args, absl::Duration timeout = absl::Seconds(30),
      const std::string& stderr_path = "");
  ~ServerProcess();

  int port() const { return port_; }
  // The Prometheus port when started with --metrics_port, else -1.
  int metrics_port() const { return metrics_port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }

  // Sends `signal` and waits up to `timeout` for the exit; returns the raw
  // wait status. DEADLINE_EXCEEDED if it did not exit (it is then killed).
  absl::StatusOr<int> Stop(int signal, absl::Duration timeout);
  // True while the process has not exited.
  bool Running();

 private:
  ServerProcess() = default;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int port_ = 0;
  int metrics_port_ = -1;
  bool reaped_ = false;
};

using Cluster = std::vector<std::unique_ptr<ServerProcess>>;

// `n` shard processes of one cluster: shard i gets --shard_index=i
// --shard_count=n --worker_threads=2, the `extra` flags, and the flags
// `per_shard(i)` gives (when set).
absl::StatusOr<Cluster> StartCluster(
    int n, const std::vector<std::string>& extra = {},
    const std::function<std::vector<std::string>(int)>& per_shard = nullptr);

}  // namespace ember::testing
