// ember-move: changes the shard count of a running cluster (see
// ember/cluster_move.h and docs/operations.md, "Changing the shard count
// online").
//   ember-move --from=h:5000,h:5001 --to=h:5000,h:5001,h:5002
// Prints one line per new shard and the totals; exits 1 on failure, with the
// reason on stderr.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "common/tls_flags.h"
#include "ember/cluster_move.h"

ABSL_FLAG(std::string, from, "",
          "The cluster's shards now, host:port by shard index, comma-separated.");
ABSL_FLAG(std::string, to, "",
          "The cluster after the move, host:port by new shard index: shards of --from that "
          "stay, and shards started with ember-server --join. Shards of --from not named "
          "here leave the cluster.");
ABSL_FLAG(std::string, routing, "", "The new cluster's routing; empty: the cluster's.");
ABSL_FLAG(std::string, id, "", "The cut's checkpoint id; empty: move-<epoch>-<unix ms>.");
ABSL_FLAG(std::string, auth_token, "",
          "Bearer token with the admin role, for shards started with --auth_tokens_file.");
ABSL_FLAG(double, timeout_seconds, 300, "Deadline of each call (the cut, each commit).");

namespace {

std::vector<std::string> Addresses(const std::string& flag) {
  return absl::StrSplit(flag, ',', absl::SkipEmpty());
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Changes the shard count of a running cluster: --from=<shards now> --to=<shards after>");
  absl::ParseCommandLine(argc, argv);
  ember::MoveOptions options;
  options.from = Addresses(absl::GetFlag(FLAGS_from));
  options.to = Addresses(absl::GetFlag(FLAGS_to));
  options.routing = absl::GetFlag(FLAGS_routing);
  options.id = absl::GetFlag(FLAGS_id);
  options.tls = ember::ClientTlsFromFlags();
  options.auth_token = absl::GetFlag(FLAGS_auth_token);
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds));
  absl::StatusOr<ember::MoveResult> moved = ember::MoveCluster(options);
  if (!moved.ok()) {
    std::fprintf(stderr, "ember-move: %s\n", moved.status().ToString().c_str());
    return 1;
  }
  for (size_t j = 0; j < moved->shards.size(); ++j) {
    const auto& s = moved->shards[j];
    std::printf("shard %zu of %zu (%s): %llu rows, %llu from other shards, %.3f s\n", j,
                moved->shards.size(), options.to[j].c_str(),
                static_cast<unsigned long long>(s.rows()),
                static_cast<unsigned long long>(s.moved_rows()), s.seconds());
  }
  std::printf(
      "moved %zu -> %zu shards at step %lld, routing epoch %llu: %llu rows, %llu moved "
      "(%.1f%%); pushes held %.3f s (cut %.3f s, commit %.3f s)\n",
      options.from.size(), options.to.size(), static_cast<long long>(moved->step),
      static_cast<unsigned long long>(moved->routing_epoch),
      static_cast<unsigned long long>(moved->rows),
      static_cast<unsigned long long>(moved->moved_rows),
      moved->rows == 0
          ? 0.0
          : 100.0 * static_cast<double>(moved->moved_rows) / static_cast<double>(moved->rows),
      moved->held_seconds, moved->cut_seconds, moved->commit_seconds);
  return 0;
}
