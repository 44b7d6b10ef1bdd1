// MemoryFileSystem: a FileSystem whose files are strings in a map, so that a
// fuzzer can hand the checkpoint reader a file without touching the disk.
// Directories are implied by the paths. Not thread-safe.
#pragma once

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file_system.h"

namespace ember::fuzz {

class MemoryFileSystem : public FileSystem {
 public:
  std::map<std::string, std::string>& files() { return files_; }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    files_[path].clear();
    return std::unique_ptr<WritableFile>(new Writer(&files_[path]));
  }
  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) override {
    auto it = files_.find(path);
    if (it == files_.end()) return absl::NotFoundError(path);
    return std::unique_ptr<SequentialFile>(new Reader(&it->second));
  }
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    auto it = files_.find(path);
    if (it == files_.end()) return absl::NotFoundError(path);
    return it->second.size();
  }
  absl::Status CreateDirs(const std::string&) override { return absl::OkStatus(); }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    auto it = files_.find(from);
    if (it == files_.end()) return absl::NotFoundError(from);
    files_[to] = std::move(it->second);
    files_.erase(from);
    return absl::OkStatus();
  }
  absl::Status SyncDir(const std::string&) override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    std::vector<std::string> names;
    const std::string prefix = path + "/";
    for (const auto& [name, unused] : files_) {
      if (name.rfind(prefix, 0) == 0) names.push_back(name.substr(prefix.size()));
    }
    return names;
  }
  bool IsDirectory(const std::string&) override { return false; }
  absl::Status RemoveAll(const std::string& path) override {
    files_.erase(path);
    return absl::OkStatus();
  }

 private:
  class Writer : public WritableFile {
   public:
    explicit Writer(std::string* data) : data_(data) {}
    absl::Status Append(absl::string_view data) override {
      data_->append(data.data(), data.size());
      return absl::OkStatus();
    }
    absl::Status Sync() override { return absl::OkStatus(); }
    absl::Status Close() override { return absl::OkStatus(); }

   private:
    std::string* data_;
  };
  class Reader : public SequentialFile {
   public:
    explicit Reader(const std::string* data) : data_(data) {}
    absl::Status Read(size_t n, char* buffer, size_t* read) override {
      *read = std::min(n, data_->size() - offset_);
      memcpy(buffer, data_->data() + offset_, *read);
      offset_ += *read;
      return absl::OkStatus();
    }

   private:
    const std::string* data_;
    size_t offset_ = 0;
  };

  std::map<std::string, std::string> files_;
};

}  // namespace ember::fuzz
