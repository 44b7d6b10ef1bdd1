// The Chrome-trace recorder: spans, track names, escaping and its bound.
#include "ember/trace.h"

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ember {
namespace {

TEST(TraceRecorderTest, KeepsAtMostMaxEventsAndCountsTheRestAsDropped) {
  TraceRecorder trace(/*max_events=*/2);
  const TraceTrack track{/*process=*/4, /*thread=*/7};
  trace.NameProcess(4, "worker 3");
  trace.NameTrack(track, "worker \"0\"\\trainer");
  const absl::Time t0 = absl::Now();
  trace.Record(track, "Wait", t0, t0 + absl::Microseconds(250), "\"step\":1");
  trace.Record(track, "Push", t0 + absl::Microseconds(300), t0 + absl::Microseconds(310));
  trace.Record(track, "Wait", t0, t0);  // over the bound
  EXPECT_EQ(trace.events(), 2u);
  EXPECT_EQ(trace.dropped(), 1u);
  const std::string json = trace.ToJson();
  EXPECT_NE(json.find("\"dropped_events\":1}"), std::string::npos) << json;
  if (testing::kSanitizerBuild) return;  // see kSanitizerBuild
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  const auto& events = parsed.fields().at("traceEvents").list_value().values();
  ASSERT_EQ(events.size(), 4);  // the process and track names and two spans
  const auto& process = events[0].struct_value().fields();
  EXPECT_EQ(process.at("name").string_value(), "process_name");
  EXPECT_EQ(process.at("pid").number_value(), 4);
  EXPECT_EQ(process.at("args").struct_value().fields().at("name").string_value(), "worker 3");
  const auto& thread = events[1].struct_value().fields();
  EXPECT_EQ(thread.at("name").string_value(), "thread_name");
  EXPECT_EQ(thread.at("pid").number_value(), 4);
  EXPECT_EQ(thread.at("tid").number_value(), 7);
  EXPECT_EQ(thread.at("args").struct_value().fields().at("name").string_value(),
            "worker \"0\"\\trainer");
  const auto& wait = events[2].struct_value().fields();
  EXPECT_EQ(wait.at("name").string_value(), "Wait");
  EXPECT_EQ(wait.at("ph").string_value(), "X");
  EXPECT_EQ(wait.at("dur").number_value(), 250);
  EXPECT_EQ(wait.at("pid").number_value(), 4);
  EXPECT_EQ(wait.at("tid").number_value(), 7);
  EXPECT_EQ(wait.at("args").struct_value().fields().at("step").number_value(), 1);
  EXPECT_EQ(parsed.fields().at("otherData").struct_value().fields().at("dropped_events")
                .number_value(),
            1);
}

TEST(TraceRecorderTest, UnwritablePathIsAnErrorNamingIt) {
  TraceRecorder trace;
  absl::Status s = trace.WriteJson("/nonexistent-dir/trace.json");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("/nonexistent-dir/trace.json"), std::string::npos) << s;
}

}  // namespace
}  // namespace ember
