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
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "common/file_system.h"
#include "server/checkpointer.h"

ABSL_FLAG(std::string, dir, "", "A shard's checkpoint directory (its --checkpoint_dir).");
ABSL_FLAG(std::string, id, "", "compact: name of the new checkpoint; empty: ckpt-<sequence>.");

namespace {

int List(const std::string& dir) {
  if (!ember::FileSystem::Posix()->IsDirectory(dir)) {
    std::fprintf(stderr, "ember-checkpoint: '%s' is not a directory\n", dir.c_str());
    return 1;
  }
  // Every data file is read against its manifest: what is listed restores.
  const ember::CheckpointListing listing =
      ember::ListCheckpointDirectory(ember::FileSystem::Posix(), dir, ember::ListCheck::kDataFiles);
  std::printf("| id | kind | parent | sequence | shard | step | workers | tables | rows | bytes | created |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const auto& m : listing.valid) {
    uint64_t rows = 0, bytes = 0;
    for (const auto& t : m.tables()) {
      rows += t.rows();
      bytes += t.file_bytes();
    }
    std::printf("| %s | %s | %s | %llu | %u/%u | %lld | %d | %d | %llu | %llu | %s |\n",
                m.id().c_str(), m.kind() == ember::v1::CHECKPOINT_KIND_DELTA ? "delta" : "full",
                m.parent_id().empty() ? "-" : m.parent_id().c_str(),
                static_cast<unsigned long long>(m.sequence()), m.shard_index(), m.shard_count(),
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

constexpr char kUsage[] =
    "usage: ember-checkpoint list|compact --dir=DIR [--id=NAME]\n"
    "       ember-checkpoint verify CHECKPOINT_PATH\n";

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() == 3 && std::string(args[1]) == "verify") return Verify(args[2]);
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
  std::fprintf(stderr, "ember-checkpoint: unknown command '%s' (list, verify or compact)\n",
               command.c_str());
  return 2;
}
