// checkpoint_bench: what a checkpoint costs, beside what this machine's disk
// does (issue 11's bar), in one run:
//   1. sequential write (dd-style: 1 MiB writes, then fdatasync) and read of
//      a file as large as the checkpoint;
//   2. a full checkpoint of one table (default 10M rows, dim 8, Adagrad),
//      split into the cut, the in-memory copy (pushes held) and the write;
//   3. restoring it into a fresh shard;
//   4. a delta after pushing to 1% of the rows;
//   5. lookup throughput of a serving thread without and while a checkpoint
//      is written, alternating.
// Figures are medians over --rounds; ratios are what to quote.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/key_hash.h"
#include "common/wire.h"
#include "shard/checkpointer.h"
#include "shard/shard.h"

ABSL_FLAG(uint64_t, rows, 10'000'000, "Rows of the table.");
ABSL_FLAG(uint32_t, dim, 8, "Elements per row.");
ABSL_FLAG(std::string, dir, "/tmp/ember_checkpoint_bench", "Scratch directory (emptied).");
ABSL_FLAG(int, rounds, 3, "Rounds of each measurement; medians are printed.");
ABSL_FLAG(int, restore_only, 0,
          "Profiling aid: take one checkpoint, restore it this many times, print, exit.");
ABSL_FLAG(double, serve_seconds, 2.0, "Length of each lookup-throughput window.");

namespace ember {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Die(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "checkpoint_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

// Seconds to write `bytes` sequentially in 1 MiB writes and fdatasync; then
// to read them back.
std::pair<double, double> DiskSeconds(const std::string& path, uint64_t bytes) {
  std::vector<char> block(1 << 20, 'x');
  const absl::Time start = absl::Now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (uint64_t done = 0; done < bytes; done += block.size()) {
    if (::write(fd, block.data(), block.size()) < 0) std::perror("write");
  }
  ::fdatasync(fd);
  ::close(fd);
  const double write = absl::ToDoubleSeconds(absl::Now() - start);
  const absl::Time rstart = absl::Now();
  const int rfd = ::open(path.c_str(), O_RDONLY);
  while (::read(rfd, block.data(), block.size()) > 0) {
  }
  ::close(rfd);
  const double read = absl::ToDoubleSeconds(absl::Now() - rstart);
  ::unlink(path.c_str());
  return {write, read};
}

v1::TableConfig Table(uint32_t dim) {
  v1::TableConfig c;
  c.set_name("t");
  c.set_dim(dim);
  c.mutable_initializer()->mutable_uniform()->set_min(-0.05f);
  c.mutable_initializer()->mutable_uniform()->set_max(0.05f);
  c.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.01f);
  c.mutable_optimizer()->mutable_adagrad()->set_initial_accumulator(0.1f);
  return c;
}

void PushKeys(Shard& shard, uint64_t begin, uint64_t end, uint32_t dim, float g) {
  constexpr uint64_t kBatch = 200'000;
  std::vector<uint64_t> keys;
  for (uint64_t b = begin; b < end; b += kBatch) {
    keys.clear();
    for (uint64_t i = b; i < std::min(end, b + kBatch); ++i) keys.push_back(Mix64(i));
    v1::PushRequest req;
    v1::TableGradients* t = req.add_tables();
    t->set_table("t");
    t->set_keys(PackKeys(keys));
    t->set_dtype(v1::DTYPE_FP32);
    t->set_gradients(std::string(keys.size() * dim * 4, '\0'));
    std::vector<float> grads(keys.size() * dim, g);
    memcpy(t->mutable_gradients()->data(), grads.data(), grads.size() * 4);
    v1::PushResponse resp;
    Die(shard.Push(req, &resp), "push");
  }
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  using namespace ember;
  absl::ParseCommandLine(argc, argv);
  const uint64_t rows = absl::GetFlag(FLAGS_rows);
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  FileSystem* fs = FileSystem::Posix();
  Die(fs->RemoveAll(dir), "clean");
  Die(fs->CreateDirs(dir), "mkdir");
  std::printf("checkpoint_bench: %u cores, %lu rows, dim %u, Adagrad fp32, dir %s, %d rounds\n",
              std::thread::hardware_concurrency(), static_cast<unsigned long>(rows), dim,
              dir.c_str(), rounds);

  ShardOptions so;
  Shard shard(so);
  v1::CreateTableResponse created;
  Die(shard.CreateTable(Table(dim), &created), "create");
  const absl::Time fill = absl::Now();
  PushKeys(shard, 0, rows, dim, 0.5f);
  std::printf("filled in %.1f s\n", absl::ToDoubleSeconds(absl::Now() - fill));

  CheckpointerOptions co;
  co.directory = JoinPath(dir, "checkpoints");
  co.keep = 0;
  Checkpointer checkpointer(&shard, co);
  auto take = [&](bool incremental) {
    v1::CheckpointRequest req;
    req.set_incremental(incremental);
    v1::CheckpointResponse resp;
    Die(checkpointer.Checkpoint(req, absl::InfiniteFuture(), &resp), "checkpoint");
    return resp;
  };

  if (const int n = absl::GetFlag(FLAGS_restore_only); n > 0) {
    const std::string path = take(false).path();
    for (int i = 0; i < n; ++i) {
      Shard fresh(so);
      Checkpointer loader(&fresh, co);
      const absl::Time rs = absl::Now();
      Die(loader.Restore(path).status(), "restore");
      std::printf("restore %.3f s\n", absl::ToDoubleSeconds(absl::Now() - rs));
    }
    return 0;
  }
  std::vector<double> dd_write, dd_read, full_total, full_copy, full_write, restore, delta_total;
  uint64_t full_bytes = 0, delta_bytes = 0;
  std::string full_path;
  for (int r = 0; r < rounds; ++r) {
    const absl::Time start = absl::Now();
    v1::CheckpointResponse full = take(false);
    full_total.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    full_copy.push_back(full.copy_seconds());
    full_write.push_back(full.write_seconds());
    full_bytes = full.bytes();
    full_path = full.path();

    auto [w, rd] = DiskSeconds(JoinPath(dir, "dd.bin"), full_bytes);
    dd_write.push_back(w);
    dd_read.push_back(rd);

    Shard fresh(so);
    Checkpointer loader(&fresh, co);
    const absl::Time rs = absl::Now();
    Die(loader.Restore(full_path).status(), "restore");
    restore.push_back(absl::ToDoubleSeconds(absl::Now() - rs));

    PushKeys(shard, 0, rows / 100, dim, 0.25f);  // 1% of the rows
    const absl::Time ds = absl::Now();
    v1::CheckpointResponse delta = take(true);
    delta_total.push_back(absl::ToDoubleSeconds(absl::Now() - ds));
    delta_bytes = delta.bytes();
    Die(fs->RemoveAll(delta.path()), "remove");
    Die(fs->RemoveAll(full.path()), "remove");
  }
  const double mb = static_cast<double>(full_bytes) / 1e6;
  std::printf("\n| what | seconds | MB/s | vs dd write |\n| --- | --- | --- | --- |\n");
  auto row = [&](const char* what, double s, double bytes_mb) {
    std::printf("| %s | %.3f | %.0f | %.2f |\n", what, s, bytes_mb / s,
                (bytes_mb / s) / (mb / Median(dd_write)));
  };
  row("dd-style write + fdatasync", Median(dd_write), mb);
  row("read back (page cache)", Median(dd_read), mb);
  row("full checkpoint (cut + copy + write + fsync)", Median(full_total), mb);
  row("  of which the copy (pushes held)", Median(full_copy), mb);
  row("  of which the write", Median(full_write), mb);
  row("restore into a fresh shard", Median(restore), mb);
  std::printf("| delta after pushing 1%% of rows | %.3f | (%.1f MB) | %.3f of the full's time |\n",
              Median(delta_total), static_cast<double>(delta_bytes) / 1e6,
              Median(delta_total) / Median(full_total));
  std::printf("checkpoint %.1f MB; delta %.1f MB (%.4f of the full)\n", mb,
              static_cast<double>(delta_bytes) / 1e6,
              static_cast<double>(delta_bytes) / static_cast<double>(full_bytes));

  // Serving while a checkpoint is written: a lookup thread's throughput in
  // windows without and with a checkpoint running, alternating.
  const double window = absl::GetFlag(FLAGS_serve_seconds);
  std::vector<v1::LookupRequest> requests(64);
  std::mt19937_64 rng(1);
  for (auto& req : requests) {
    std::vector<uint64_t> keys(2000);
    for (auto& k : keys) k = Mix64(rng() % rows);
    v1::TableLookup* t = req.add_tables();
    t->set_table("t");
    t->set_keys(PackKeys(keys));
  }
  auto lookups_per_second = [&](bool checkpointing) {
    std::atomic<bool> stop{false};
    std::thread writer;
    if (checkpointing) {
      writer = std::thread([&] {
        while (!stop) Die(fs->RemoveAll(take(false).path()), "remove");
      });
    }
    uint64_t keys = 0;
    const absl::Time start = absl::Now();
    for (size_t i = 0; absl::Now() - start < absl::Seconds(window); ++i) {
      v1::LookupResponse resp;
      Die(shard.Lookup(requests[i % requests.size()], &resp), "lookup");
      keys += 2000;
    }
    const double rate = static_cast<double>(keys) / absl::ToDoubleSeconds(absl::Now() - start);
    stop = true;
    if (writer.joinable()) writer.join();
    return rate;
  };
  std::vector<double> without, with;
  for (int r = 0; r < rounds; ++r) {
    without.push_back(lookups_per_second(false));
    with.push_back(lookups_per_second(true));
  }
  std::printf("\nlookup keys/s: %.2fM without a checkpoint, %.2fM while checkpoints are written "
              "back to back: %.2f of it (a drop of %.0f%%)\n",
              Median(without) / 1e6, Median(with) / 1e6, Median(with) / Median(without),
              100 * (1 - Median(with) / Median(without)));
  Die(fs->RemoveAll(dir), "clean");
  return 0;
}
