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
  trace.NameTrack(7, "worker \"0\"\\trainer");
  const absl::Time t0 = absl::Now();
  trace.Record(7, "Wait", t0, t0 + absl::Microseconds(250), "\"step\":1");
  trace.Record(7, "Push", t0 + absl::Microseconds(300), t0 + absl::Microseconds(310));
  trace.Record(7, "Wait", t0, t0);  // over the bound
  EXPECT_EQ(trace.events(), 2u);
  EXPECT_EQ(trace.dropped(), 1u);
  const std::string json = trace.ToJson();
  EXPECT_NE(json.find("\"dropped_events\":1}"), std::string::npos) << json;
  if (testing::kSanitizerBuild) return;  // see kSanitizerBuild
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  const auto& events = parsed.fields().at("traceEvents").list_value().values();
  ASSERT_EQ(events.size(), 3);  // the track name and two spans
  EXPECT_EQ(events[0].struct_value().fields().at("args").struct_value().fields().at("name")
                .string_value(),
            "worker \"0\"\\trainer");
  const auto& wait = events[1].struct_value().fields();
  EXPECT_EQ(wait.at("name").string_value(), "Wait");
  EXPECT_EQ(wait.at("ph").string_value(), "X");
  EXPECT_EQ(wait.at("dur").number_value(), 250);
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
