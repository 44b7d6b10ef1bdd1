#include "common/file_system.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ember {
namespace {

std::string FreshDir(const std::string& name) {
  const std::string dir = JoinPath(::testing::TempDir(), name);
  EXPECT_OK(FileSystem::Posix()->RemoveAll(dir));
  EXPECT_OK(FileSystem::Posix()->CreateDirs(dir));
  return dir;
}

std::string ReadAll(const std::string& path) {
  auto file = FileSystem::Posix()->NewSequentialFile(path);
  EXPECT_OK(file);
  std::string out;
  char buf[7];
  size_t got = 0;
  do {
    EXPECT_OK((*file)->Read(sizeof(buf), buf, &got));
    out.append(buf, got);
  } while (got == sizeof(buf));
  return out;
}

TEST(FileSystemTest, WrittenBytesReadBackAfterSyncAndClose) {
  FileSystem* fs = FileSystem::Posix();
  const std::string dir = FreshDir("fs_write");
  const std::string path = JoinPath(dir, "a");
  auto file = fs->NewWritableFile(path);
  ASSERT_OK(file);
  ASSERT_OK((*file)->Append("hello "));
  ASSERT_OK((*file)->Append(std::string(100, 'x')));
  ASSERT_OK((*file)->Sync());
  ASSERT_OK((*file)->Close());
  EXPECT_EQ(ReadAll(path), "hello " + std::string(100, 'x'));
  EXPECT_EQ(*fs->FileSize(path), 106u);
}

TEST(FileSystemTest, RenameListAndRemoveAllWorkOnDirectories) {
  FileSystem* fs = FileSystem::Posix();
  const std::string dir = FreshDir("fs_dirs");
  ASSERT_OK(fs->CreateDirs(JoinPath(dir, "x.tmp/sub")));
  ASSERT_OK(fs->Rename(JoinPath(dir, "x.tmp"), JoinPath(dir, "x")));
  ASSERT_OK(fs->SyncDir(dir));
  auto names = fs->ListDir(dir);
  ASSERT_OK(names);
  EXPECT_EQ(*names, std::vector<std::string>{"x"});
  EXPECT_TRUE(fs->IsDirectory(JoinPath(dir, "x/sub")));
  ASSERT_OK(fs->RemoveAll(JoinPath(dir, "x")));
  EXPECT_FALSE(fs->IsDirectory(JoinPath(dir, "x")));
  EXPECT_OK(fs->RemoveAll(JoinPath(dir, "never-there")));
}

TEST(FileSystemTest, MissingFileIsNotFoundNamingThePath) {
  auto file = FileSystem::Posix()->NewSequentialFile("/nonexistent/ember/file");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("/nonexistent/ember/file"), std::string::npos)
      << file.status();
}

}  // namespace
}  // namespace ember
