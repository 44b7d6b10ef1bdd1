// reshard_bench: what changing a cluster's shard count through checkpoints
// costs (issue 36's bar), in one run, alternating, medians over --rounds:
//   1. plain restore: each part of a 2-shard cluster checkpoint into a
//      fresh shard of its own index (read + import), bytes per second;
//   2. offline reshard 2 -> 3 (shard/reshard.h, what `ember-checkpoint
//      reshard` runs): read every part, write three, bytes read per second;
//   3. a resharded restore: shard 0 of 3 restoring from both parts
//      (--restore_from=P0,P1): reads both, keeps a third;
//   4. peak memory (max RSS) of `ember-checkpoint reshard --to=3` beside one
//      part's bytes, and beside `ember-checkpoint verify` of one part (the
//      same process reading without resharding).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "bench/reference_workload.h"
#include "common/key_hash.h"
#include "common/key_router.h"
#include "common/wire.h"
#include "shard/checkpointer.h"
#include "shard/reshard.h"
#include "shard/shard.h"

ABSL_FLAG(uint64_t, rows, 4'000'000, "Rows of the table in the whole cluster.");
ABSL_FLAG(uint32_t, dim, 8, "Elements per row.");
ABSL_FLAG(std::string, dir, "/tmp/ember_reshard_bench", "Scratch directory (emptied).");
ABSL_FLAG(int, rounds, 3, "Rounds of each measurement; medians are printed.");
ABSL_FLAG(bool, keep, false, "Keep the scratch directory (the parts) at the end.");
ABSL_FLAG(std::string, tool, "",
          "ember-checkpoint binary; empty: ../server/ember-checkpoint "
          "beside this binary.");

namespace ember {
namespace {

void Die(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "reshard_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

ShardOptions Options(uint32_t index, uint32_t count) {
  ShardOptions o;
  o.shard_index = index;
  o.shard_count = count;
  return o;
}

// Runs the commands whose peak memory is measured, from a process forked
// before the bench grows: a child forked from the grown bench would count
// the bench's pages in its max RSS (Linux keeps the high-water mark across
// exec).
class Spawner {
 public:
  Spawner() {
    if (::pipe(to_) != 0 || ::pipe(from_) != 0) std::perror("pipe");
    pid_ = ::fork();
    if (pid_ != 0) return;
    while (true) {
      uint64_t len = 0;
      if (::read(to_[0], &len, 8) != 8 || len == 0) ::_exit(0);
      std::string line(len, '\0');
      for (size_t got = 0; got < len;) {
        const ssize_t r = ::read(to_[0], line.data() + got, len - got);
        if (r <= 0) ::_exit(1);
        got += static_cast<size_t>(r);
      }
      std::vector<std::string> argv = absl::StrSplit(line, '\0');
      const pid_t child = ::fork();
      if (child == 0) {
        std::vector<char*> args;
        for (auto& a : argv) args.push_back(a.data());
        args.push_back(nullptr);
        const int null = ::open("/dev/null", O_WRONLY);
        ::dup2(null, 1);
        ::execv(args[0], args.data());
        ::_exit(127);
      }
      int status = 0;
      struct rusage usage;
      ::wait4(child, &status, 0, &usage);
      uint64_t rss = WIFEXITED(status) && WEXITSTATUS(status) == 0
                         ? static_cast<uint64_t>(usage.ru_maxrss) * 1024
                         : 0;
      if (::write(from_[1], &rss, 8) != 8) ::_exit(1);
    }
  }
  ~Spawner() {
    const uint64_t zero = 0;
    if (::write(to_[1], &zero, 8) == 8) ::waitpid(pid_, nullptr, 0);
  }
  // Max RSS in bytes of the command, run to its end; exits on failure.
  uint64_t PeakRss(const std::vector<std::string>& argv) {
    const std::string line = absl::StrJoin(argv, std::string(1, '\0'));
    const uint64_t len = line.size();
    uint64_t rss = 0;
    if (::write(to_[1], &len, 8) != 8 ||
        ::write(to_[1], line.data(), len) != static_cast<ssize_t>(len) ||
        ::read(from_[0], &rss, 8) != 8 || rss == 0) {
      std::fprintf(stderr, "reshard_bench: %s failed\n", absl::StrJoin(argv, " ").c_str());
      std::exit(1);
    }
    return rss;
  }

 private:
  int to_[2], from_[2];
  pid_t pid_;
};

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  using namespace ember;
  Spawner spawner;  // first, while this process is small
  absl::ParseCommandLine(argc, argv);
  const uint64_t rows = absl::GetFlag(FLAGS_rows);
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  std::string tool = absl::GetFlag(FLAGS_tool);
  if (tool.empty()) {
    std::string self = argv[0];
    tool = JoinPath(self.substr(0, self.rfind('/') + 1), "../server/ember-checkpoint");
  }
  FileSystem* fs = FileSystem::Posix();
  Die(fs->RemoveAll(dir), "clean");
  Die(fs->CreateDirs(dir), "mkdir");
  std::printf(
      "reshard_bench: %u cores, %lu rows over 2 shards, dim %u, the reference table (Adagrad, "
      "fp32), %d rounds\n",
      std::thread::hardware_concurrency(), static_cast<unsigned long>(rows), dim, rounds);

  // A 2-shard cluster checkpoint.
  std::vector<std::string> parts;
  {
    const KeyRouter two = *KeyRouter::Make(kDefaultRouting, 2);
    for (uint32_t s = 0; s < 2; ++s) {
      Shard shard(Options(s, 2));
      v1::CreateTableResponse created;
      Die(shard.CreateTable(bench::ReferenceTableConfig({"t", rows, 1, 1}, dim), &created),
          "create");
      constexpr uint64_t kBatch = 200'000;
      std::vector<uint64_t> keys;
      for (uint64_t b = 0; b < rows; b += kBatch) {
        keys.clear();
        for (uint64_t i = b; i < std::min(rows, b + kBatch); ++i) {
          if (two.ShardOf(Mix64(i)) == s) keys.push_back(Mix64(i));
        }
        v1::PushRequest req;
        v1::TableGradients* t = req.add_tables();
        t->set_table("t");
        t->set_keys(PackKeys(keys));
        t->set_dtype(v1::DTYPE_FP32);
        std::vector<float> grads(keys.size() * dim, 0.5f);
        t->set_gradients(
            std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
        v1::PushResponse resp;
        Die(shard.Push(req, &resp), "push");
      }
      CheckpointerOptions co;
      co.directory = JoinPath(dir, absl::StrCat("shard-", s));
      Checkpointer checkpointer(&shard, co);
      v1::CheckpointRequest req;
      req.set_id("cut");
      v1::CheckpointResponse resp;
      Die(checkpointer.Checkpoint(req, absl::InfiniteFuture(), &resp), "checkpoint");
      parts.push_back(resp.path());
    }
  }
  absl::StatusOr<CheckpointParts> cluster = OpenCheckpointParts(fs, parts);
  Die(cluster.status(), "open");
  const double bytes = static_cast<double>(cluster->bytes);
  const double part_bytes = bytes / 2;

  std::vector<double> restore, reshard, owned;
  for (int r = 0; r < rounds; ++r) {
    absl::Time start = absl::Now();
    for (uint32_t s = 0; s < 2; ++s) {
      Shard fresh(Options(s, 2));
      Checkpointer loader(&fresh, CheckpointerOptions{});
      Die(loader.Restore(parts[s]).status(), "restore");
    }
    restore.push_back(absl::ToDoubleSeconds(absl::Now() - start));

    const std::string out = JoinPath(dir, "out");
    Die(fs->RemoveAll(out), "clean out");
    ReshardOptions ro;
    ro.shard_count = 3;
    ro.out_dir = out;
    start = absl::Now();
    Die(Reshard(fs, *cluster, ro).status(), "reshard");
    reshard.push_back(absl::ToDoubleSeconds(absl::Now() - start));

    start = absl::Now();
    {
      Shard fresh(Options(0, 3));
      Checkpointer loader(&fresh, CheckpointerOptions{});
      Die(loader.Restore(absl::StrJoin(parts, ",")).status(), "resharded restore");
    }
    owned.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  const double mb = bytes / 1e6;
  std::printf(
      "| what | seconds (median) | MB/s of checkpoint read | vs plain restore |\n"
      "| --- | --- | --- | --- |\n");
  std::printf("| plain restore, both parts (%.0f MB) | %.3f | %.0f | 1.00 |\n", mb,
              bench::Median(restore), mb / bench::Median(restore));
  std::printf("| reshard 2 -> 3 to disk | %.3f | %.0f | %.2f |\n", bench::Median(reshard),
              mb / bench::Median(reshard), bench::Median(restore) / bench::Median(reshard));
  std::printf("| restore shard 0 of 3 from both parts | %.3f | %.0f | %.2f |\n",
              bench::Median(owned), mb / bench::Median(owned),
              bench::Median(restore) / bench::Median(owned));

  const std::string out = JoinPath(dir, "out-tool");
  Die(fs->RemoveAll(out), "clean out");
  const uint64_t reshard_rss =
      spawner.PeakRss({tool, "reshard", "--to=3", "--out=" + out, parts[0], parts[1]});
  const uint64_t verify_rss = spawner.PeakRss({tool, "verify", parts[0]});
  std::printf(
      "peak RSS: ember-checkpoint reshard --to=3 %.1f MB, verify of one part %.1f MB; one "
      "part %.1f MB: reshard peak = %.2fx one part\n",
      reshard_rss / 1e6, verify_rss / 1e6, part_bytes / 1e6, reshard_rss / part_bytes);
  if (!absl::GetFlag(FLAGS_keep)) Die(fs->RemoveAll(dir), "clean");
  return 0;
}
