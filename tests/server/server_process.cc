#include "tests/server/server_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#ifndef EMBER_SERVER_BIN
#error "EMBER_SERVER_BIN must name the ember-server binary"
#endif

extern char** environ;

namespace ember::testing {

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::vector<std::string>& args, absl::Duration timeout, const std::string& stderr_path) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  // EMBER_SERVER_BIN in the environment overrides the binary built with the
  // test (the TSan stage runs its clients against a regular server).
  const char* bin = getenv("EMBER_SERVER_BIN");
  std::vector<std::string> argv_s = {bin != nullptr && *bin != '\0' ? bin : EMBER_SERVER_BIN,
                                     "--address=127.0.0.1", "--port=0"};
  // EMBER_SERVER_RPC_MODE runs the suite against another --rpc_mode (CTest
  // registers the integration suites once per mode).
  if (const char* mode = getenv("EMBER_SERVER_RPC_MODE"); mode != nullptr && *mode != '\0') {
    argv_s.push_back(absl::StrCat("--rpc_mode=", mode));
  }
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  if (!stderr_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  std::unique_ptr<ServerProcess> p(new ServerProcess());
  int rc = posix_spawn(&p->pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  p->stdout_fd_ = fds[0];
  if (rc != 0) {
    p->pid_ = -1;
    return absl::InternalError(absl::StrCat("posix_spawn ", argv_s[0], ": ", strerror(rc)));
  }

  const absl::Time deadline = absl::Now() + timeout;
  std::string out;
  while (absl::Now() < deadline) {
    pollfd pfd{p->stdout_fd_, POLLIN, 0};
    int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (poll(&pfd, 1, std::max(ms, 1)) <= 0) continue;
    char buf[256];
    ssize_t n = read(p->stdout_fd_, buf, sizeof(buf));
    if (n <= 0) break;  // the process closed stdout: it exited
    out.append(buf, n);
    if (auto pos = out.find("EMBER_READY port="); pos != std::string::npos &&
                                                   out.find('\n', pos) != std::string::npos) {
      p->port_ = std::atoi(out.c_str() + pos + strlen("EMBER_READY port="));
      if (auto m = out.find("metrics_port=", pos); m != std::string::npos) {
        p->metrics_port_ = std::atoi(out.c_str() + m + strlen("metrics_port="));
      }
      return p;
    }
  }
  return absl::UnavailableError(
      absl::StrCat("ember-server did not report ready within ", absl::FormatDuration(timeout),
                   "; stdout: '", out, "'"));
}

bool ServerProcess::Running() {
  if (pid_ <= 0 || reaped_) return false;
  int status;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    reaped_ = true;
    return false;
  }
  return true;
}

absl::StatusOr<int> ServerProcess::Stop(int signal, absl::Duration timeout) {
  if (pid_ <= 0 || reaped_) return absl::FailedPreconditionError("not running");
  kill(pid_, signal);
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      return status;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  reaped_ = true;
  return absl::DeadlineExceededError(
      absl::StrCat("ember-server did not exit within ", absl::FormatDuration(timeout)));
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

absl::StatusOr<Cluster> StartCluster(
    int n, const std::vector<std::string>& extra,
    const std::function<std::vector<std::string>(int)>& per_shard) {
  Cluster shards;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> args = {absl::StrCat("--shard_index=", i),
                                     absl::StrCat("--shard_count=", n), "--worker_threads=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    if (per_shard) {
      const std::vector<std::string> own = per_shard(i);
      args.insert(args.end(), own.begin(), own.end());
    }
    absl::StatusOr<std::unique_ptr<ServerProcess>> p = ServerProcess::Start(args);
    if (!p.ok()) return p.status();
    shards.push_back(std::move(*p));
  }
  return shards;
}

}  // namespace ember::testing
