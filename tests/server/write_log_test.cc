// The write log early fetch asks (shard/write_log.h): kept only while
// trainers peek, and never answering a question about rows a push wrote
// unrecorded.
#include "shard/write_log.h"

#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ember {
namespace {

// Which of `keys` of table "t" the log says changed since `since`; empty
// when it cannot answer.
std::string Changed(const WriteLog& log, int64_t since, uint64_t token,
                    const std::vector<uint64_t>& keys) {
  std::string changed;
  uint64_t count = 0;
  if (!log.Changed("t", since, token, keys, &changed, &count)) return "";
  for (char& c : changed) c = c ? '1' : '0';
  return changed;
}

TEST(WriteLogTest, NothingIsRecordedUntilAPeekThenEveryPushIs) {
  WriteLog log;
  EXPECT_FALSE(log.BeginPush());  // nobody peeks: the push records nothing
  log.EndUnrecorded();
  const uint64_t token = log.PeekToken();
  ASSERT_NE(token, 0u);
  ASSERT_TRUE(log.BeginPush());
  log.Record("t", 5, std::vector<uint64_t>{2});
  EXPECT_EQ(Changed(log, 5, token, {1, 2, 3}), "010");
}

TEST(WriteLogTest, APeekWhileAnUnrecordedPushWritesGetsATokenNoQuestionCanUse) {
  WriteLog log;
  ASSERT_FALSE(log.BeginPush());  // writing rows, unrecorded
  const uint64_t during = log.PeekToken();
  EXPECT_EQ(during, 0u);
  EXPECT_EQ(Changed(log, 0, during, {1}), "");
  log.EndUnrecorded();
  const uint64_t after = log.PeekToken();
  EXPECT_NE(after, 0u);
  EXPECT_EQ(Changed(log, 0, after, {1}), "0");
}

TEST(WriteLogTest, TheRecordStopsAfterKeepWithoutAPeekAndOldTokensAreNotAnswered) {
  WriteLog log(absl::Milliseconds(1));
  const uint64_t token = log.PeekToken();
  ASSERT_TRUE(log.BeginPush());
  log.Record("t", 1, std::vector<uint64_t>{7});
  EXPECT_EQ(Changed(log, 1, token, {7}), "1");
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(log.BeginPush());  // no peek for longer than keep
  log.EndUnrecorded();
  EXPECT_EQ(Changed(log, 1, token, {7}), "");
  EXPECT_NE(log.token(), token);
}

TEST(WriteLogTest, KeptAlwaysRecordsFromTheStart) {
  WriteLog log(absl::InfiniteDuration());
  const uint64_t token = log.token();
  ASSERT_TRUE(log.BeginPush());
  log.Record("t", 3, std::vector<uint64_t>{4});
  EXPECT_EQ(Changed(log, 3, token, {4, 5}), "10");
}

}  // namespace
}  // namespace ember
