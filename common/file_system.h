// FileSystem: the file operations checkpoints need, behind an interface so
// tests can inject failures (leveldb's Env; HierarchicalKV's BaseKVFile).
//
// Errors are absl::Status values built from errno (absl::ErrnoToStatus),
// naming the operation and the path: NOT_FOUND for a missing file,
// RESOURCE_EXHAUSTED for a full disk, and so on.
//
// Thread safety: a FileSystem may be used from any thread; one file object
// is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember {

// A file being written from its start.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(absl::string_view data) = 0;
  // Makes every appended byte durable (fsync).
  virtual absl::Status Sync() = 0;
  // Closes the file; Append and Sync may not be called after it. The
  // destructor closes an open file, ignoring errors.
  virtual absl::Status Close() = 0;
};

// A file read from its start.
class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Reads up to `n` bytes into `buffer`; `*read` < n only at the end of the
  // file.
  virtual absl::Status Read(size_t n, char* buffer, size_t* read) = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // The operating system's files (POSIX calls). Never null; not owned.
  static FileSystem* Posix();

  // Creates or truncates `path`.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  virtual absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) = 0;
  virtual absl::StatusOr<uint64_t> FileSize(const std::string& path) = 0;
  // Creates the directory and missing parents; OK if it exists.
  virtual absl::Status CreateDirs(const std::string& path) = 0;
  // Atomically renames a file or directory (rename(2)); `to` must not exist
  // unless it is a file or an empty directory.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // Makes the directory's entries (creations, renames) durable.
  virtual absl::Status SyncDir(const std::string& path) = 0;
  // Names of the directory's entries, sorted, without "." and "..".
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) = 0;
  virtual bool IsDirectory(const std::string& path) = 0;
  // Removes a file or a directory tree; OK if it does not exist.
  virtual absl::Status RemoveAll(const std::string& path) = 0;
};

// Joins path components with '/'.
std::string JoinPath(absl::string_view a, absl::string_view b);

}  // namespace ember
