// ember-checkpoint: offline work on one shard's checkpoint directory.
//
//   ember-checkpoint list --dir=/var/lib/ember/checkpoints
//       every checkpoint: id, kind, parent, step, tables, rows, bytes; and
//       the directories that do not verify, with the reason
//   ember-checkpoint verify /var/lib/ember/checkpoints/ckpt-000000000012
//       reads that checkpoint and, for a delta, its parents as a restore
//       would (manifests, every data file whole: sizes, blocks, counts,
//       CRC32C); exits 1 naming the first damaged file, 0 if none
//   ember-checkpoint compact --dir=/var/lib/ember/checkpoints [--id=NAME]
//       the newest valid checkpoint (base + deltas) rewritten as one full
//       checkpoint: a new base, so the deltas before it can go
//   ember-checkpoint reshard --to=N --out=DIR [--routing=R] [--id=NAME] PART...
//       every part of one cluster checkpoint (each shard's checkpoint of the
//       same id, full or delta) rewritten as N parts routed by R (default
//       splitmix64-jump65536), streaming: DIR/shard-<i>/<id> for shard i
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "common/file_system.h"
#include "common/key_router.h"
#include "shard/checkpointer.h"
#include "shard/reshard.h"

ABSL_FLAG(std::string, dir, "", "A shard's checkpoint directory (its --checkpoint_dir).");
ABSL_FLAG(std::string, id, "",
          "compact: name of the new checkpoint (empty: ckpt-<sequence>); reshard: of the new "
          "parts (empty: the parts' id).");
ABSL_FLAG(uint32_t, to, 0, "reshard: the new shard count.");
ABSL_FLAG(std::string, out, "", "reshard: where the new parts go (DIR/shard-<i>/<id>).");
ABSL_FLAG(std::string, routing, ember::kDefaultRouting, "reshard: the new parts' routing.");

namespace {

int List(const std::string& dir) {
  if (!ember::FileSystem::Posix()->IsDirectory(dir)) {
    std::fprintf(stderr, "ember-checkpoint: '%s' is not a directory\n", dir.c_str());
    return 1;
  }
  // Every data file is read against its manifest: what is listed restores.
  const ember::CheckpointListing listing =
      ember::ListCheckpointDirectory(ember::FileSystem::Posix(), dir, ember::ListCheck::kDataFiles);
  std::printf(
      "| id | kind | parent | sequence | shard | routing (epoch) | step | workers | tables | rows | "
      "bytes | created |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const auto& m : listing.valid) {
    uint64_t rows = 0, bytes = 0;
    for (const auto& t : m.tables()) {
      rows += t.rows();
      bytes += t.file_bytes();
    }
    std::printf("| %s | %s | %s | %llu | %u/%u | %s (%llu) | %lld | %d | %d | %llu | %llu | %s |\n",
                m.id().c_str(), m.kind() == ember::v1::CHECKPOINT_KIND_DELTA ? "delta" : "full",
                m.parent_id().empty() ? "-" : m.parent_id().c_str(),
                static_cast<unsigned long long>(m.sequence()), m.shard_index(), m.shard_count(),
                m.routing().c_str(),
                static_cast<unsigned long long>(ember::RoutingEpochOf(m)),
                static_cast<long long>(m.step()), m.workers_size(), m.tables_size(),
                static_cast<unsigned long long>(rows), static_cast<unsigned long long>(bytes),
                absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMicros(m.created_unix_micros()),
                                 absl::UTCTimeZone()).c_str());
  }
  for (const auto& why : listing.invalid) std::printf("refused: %s\n", why.c_str());
  return listing.valid.empty() && !listing.invalid.empty() ? 1 : 0;
}

int Verify(const std::string& path) {
  auto chain = ember::VerifyCheckpoint(ember::FileSystem::Posix(), path);
  if (!chain.ok()) {
    std::fprintf(stderr, "ember-checkpoint: %s: %s\n", path.c_str(),
                 chain.status().ToString().c_str());
    return 1;
  }
  uint64_t files = 0, bytes = 0;
  for (const auto& m : *chain) {
    for (const auto& t : m.tables()) {
      ++files;
      bytes += t.file_bytes();
    }
  }
  std::printf("%s: verified (%zu checkpoints in its chain, %llu data files, %llu bytes)\n",
              path.c_str(), chain->size(), static_cast<unsigned long long>(files),
              static_cast<unsigned long long>(bytes));
  return 0;
}

int Reshard(const std::vector<std::string>& parts) {
  auto cluster = ember::OpenCheckpointParts(ember::FileSystem::Posix(), parts);
  if (!cluster.ok()) {
    std::fprintf(stderr, "ember-checkpoint: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  ember::ReshardOptions options;
  options.shard_count = absl::GetFlag(FLAGS_to);
  options.routing = absl::GetFlag(FLAGS_routing);
  options.out_dir = absl::GetFlag(FLAGS_out);
  options.id = absl::GetFlag(FLAGS_id);
  auto result = ember::Reshard(ember::FileSystem::Posix(), *cluster, options);
  if (!result.ok()) {
    std::fprintf(stderr, "ember-checkpoint: %s\n", result.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "resharded %u parts (%s, step %lld) into %u (%s): %llu rows (%llu moved to another shard "
      "index: %.1f%%), %llu bytes read, %llu written in %.3f s (%.1f MB/s read)\n",
      cluster->shard_count, cluster->routing.c_str(), static_cast<long long>(cluster->step),
      options.shard_count, options.routing.c_str(), static_cast<unsigned long long>(result->rows),
      static_cast<unsigned long long>(result->moved_rows),
      100.0 * result->moved_rows / std::max<uint64_t>(result->rows, 1),
      static_cast<unsigned long long>(result->bytes_read),
      static_cast<unsigned long long>(result->bytes_written), result->seconds,
      result->bytes_read / 1e6 / std::max(result->seconds, 1e-9));
  for (const std::string& p : result->paths) std::printf("%s\n", p.c_str());
  return 0;
}

constexpr char kUsage[] =
    "usage: ember-checkpoint list|compact --dir=DIR [--id=NAME]\n"
    "       ember-checkpoint verify CHECKPOINT_PATH\n"
    "       ember-checkpoint reshard --to=N --out=DIR [--routing=R] [--id=NAME] PART...\n";

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() == 3 && std::string(args[1]) == "verify") return Verify(args[2]);
  if (args.size() >= 2 && std::string(args[1]) == "reshard") {
    if (args.size() < 3 || absl::GetFlag(FLAGS_to) == 0 || absl::GetFlag(FLAGS_out).empty()) {
      std::fprintf(stderr, "%s", kUsage);
      return 2;
    }
    return Reshard(std::vector<std::string>(args.begin() + 2, args.end()));
  }
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (args.size() != 2 || dir.empty()) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  const std::string command = args[1];
  if (command == "list") return List(dir);
  if (command == "compact") {
    auto compacted = ember::CompactCheckpoints(ember::FileSystem::Posix(), dir, absl::GetFlag(FLAGS_id));
    if (!compacted.ok()) {
      std::fprintf(stderr, "ember-checkpoint: %s\n", compacted.status().ToString().c_str());
      return 1;
    }
    std::printf("wrote %s (%llu bytes, step %lld)\n", compacted->path().c_str(),
                static_cast<unsigned long long>(compacted->bytes()),
                static_cast<long long>(compacted->manifest().step()));
    return 0;
  }
  std::fprintf(stderr,
               "ember-checkpoint: unknown command '%s' (list, verify, compact or reshard)\n",
               command.c_str());
  return 2;
}
