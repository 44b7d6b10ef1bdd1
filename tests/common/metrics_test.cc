// The metrics registry and its Prometheus text exposition.
#include "common/metrics.h"

#include <thread>

#include "gtest/gtest.h"

namespace ember::metrics {
namespace {

TEST(MetricsTest, ExposesCountersGaugesAndHistogramsInTheTextFormatSortedByName) {
  Registry r;
  auto& requests = r.AddCounter("ember_requests_total", "RPCs served.", {"rpc", "code"});
  requests.With({"Push", "OK"}).Add(2);
  requests.With({"Lookup", "OK"}).Add();
  r.AddGauge("ember_rows", "Rows stored.").With({}).Set(12.5);
  auto& latency = r.AddHistogram("ember_latency_seconds", "Latency.", {"rpc"}, {0.1, 1});
  latency.With({"Lookup"}).Observe(0.05);
  latency.With({"Lookup"}).Observe(0.5);
  latency.With({"Lookup"}).Observe(7);
  EXPECT_EQ(r.Expose(),
            "# HELP ember_latency_seconds Latency.\n"
            "# TYPE ember_latency_seconds histogram\n"
            "ember_latency_seconds_bucket{rpc=\"Lookup\",le=\"0.1\"} 1\n"
            "ember_latency_seconds_bucket{rpc=\"Lookup\",le=\"1\"} 2\n"
            "ember_latency_seconds_bucket{rpc=\"Lookup\",le=\"+Inf\"} 3\n"
            "ember_latency_seconds_sum{rpc=\"Lookup\"} 7.55\n"
            "ember_latency_seconds_count{rpc=\"Lookup\"} 3\n"
            "# HELP ember_requests_total RPCs served.\n"
            "# TYPE ember_requests_total counter\n"
            "ember_requests_total{rpc=\"Lookup\",code=\"OK\"} 1\n"
            "ember_requests_total{rpc=\"Push\",code=\"OK\"} 2\n"
            "# HELP ember_rows Rows stored.\n"
            "# TYPE ember_rows gauge\n"
            "ember_rows 12.5\n");
}

TEST(MetricsTest, LabelValuesAndHelpAreEscaped) {
  Registry r;
  r.AddCounter("c_total", "line one\nback\\slash", {"table"}).With({"a\"b\\c\nd"}).Add();
  EXPECT_EQ(r.Expose(),
            "# HELP c_total line one\\nback\\\\slash\n"
            "# TYPE c_total counter\n"
            "c_total{table=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST(MetricsTest, CountersIgnoreNegativeAddsAndGaugesMoveBothWays) {
  Registry r;
  Counter& c = r.AddCounter("c_total", "c").With({});
  c.Add(3);
  c.Add(-1);
  EXPECT_EQ(c.Value(), 3);
  Gauge& g = r.AddGauge("g", "g").With({});
  g.Add(5);
  g.Add(-7);
  EXPECT_EQ(g.Value(), -2);
  EXPECT_EQ(FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatValue(-2), "-2");
}

TEST(MetricsTest, ConcurrentUpdatesLoseNothing) {
  Registry r;
  auto& family = r.AddCounter("c_total", "c", {"t"});
  Histogram& h = r.AddHistogram("h_seconds", "h", {}).With({});
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      Counter& mine = family.With({t % 2 ? "odd" : "even"});
      for (int i = 0; i < 10000; ++i) {
        mine.Add();
        h.Observe(0.001);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(family.With({"odd"}).Value() + family.With({"even"}).Value(), 80000);
  EXPECT_EQ(h.Snap().count, 80000u);
}

TEST(MetricsTest, RedeclaringAFamilyReturnsItAndScrapeCallbacksRunOnExpose) {
  Registry r;
  auto& a = r.AddGauge("g", "help", {"x"});
  auto& b = r.AddGauge("g", "help", {"x"});
  EXPECT_EQ(&a, &b);
  int calls = 0;
  r.OnScrape([&] {
    ++calls;
    a.Clear();
    a.With({"now"}).Set(calls);
  });
  r.Expose();
  const std::string text = r.Expose();
  EXPECT_EQ(calls, 2);
  EXPECT_NE(text.find("g{x=\"now\"} 2\n"), std::string::npos) << text;
}

TEST(MetricsTest, AttachedRegistriesShareOneHeaderPerFamilyAndLabelTheirSeries) {
  Registry parent, shard0, shard1;
  parent.AddCounter("calls_total", "Calls.", {"rpc"}).With({"Lookup"}).Add(3);
  shard0.AddCounter("calls_total", "Calls.", {"rpc"}).With({"Push"}).Add(1);
  shard1.AddGauge("rows", "Rows.", {"table"}).With({"t"}).Set(7);
  shard1.AddGauge("calls_total", "Another type.", {"rpc"}).With({"Push"}).Set(9);
  int scraped = 0;
  shard0.OnScrape([&] { ++scraped; });
  parent.Attach(&shard0, "shard", "0");
  parent.Attach(&shard1, "shard", "1");
  const std::string text = parent.Expose();
  EXPECT_EQ(scraped, 1);
  EXPECT_EQ(text,
            "# HELP calls_total Calls.\n# TYPE calls_total counter\n"
            "calls_total{rpc=\"Lookup\"} 3\n"
            "calls_total{shard=\"0\",rpc=\"Push\"} 1\n"
            "# HELP rows Rows.\n# TYPE rows gauge\n"
            "rows{shard=\"1\",table=\"t\"} 7\n")
      << "shard 1's gauge of the counter's name is left out";
  parent.Detach(&shard0);
  parent.Detach(&shard1);
  EXPECT_EQ(parent.Expose(),
            "# HELP calls_total Calls.\n# TYPE calls_total counter\n"
            "calls_total{rpc=\"Lookup\"} 3\n");
  EXPECT_EQ(scraped, 1);
}

TEST(MetricsTest, ProcessMetricsReadThisProcess) {
  Registry r;
  AddProcessMetrics(&r);
  const std::string text = r.Expose();
  for (const char* name : {"process_cpu_seconds_total ", "process_resident_memory_bytes ",
                           "process_start_time_seconds ", "process_open_fds "}) {
    const size_t at = text.find(std::string("\n") + name);
    ASSERT_NE(at, std::string::npos) << name << " in\n" << text;
  }
  const size_t rss = text.find("\nprocess_resident_memory_bytes ");
  EXPECT_GT(std::stod(text.substr(rss + 31)), 1e6);  // a test binary holds megabytes
}

TEST(MetricsDeathTest, MisuseAbortsNamingTheMetric) {
  Registry r;
  auto& f = r.AddCounter("c_total", "c", {"a", "b"});
  EXPECT_DEATH(f.With({"only one"}), "c_total: expected 2 label values");
  EXPECT_DEATH(r.AddGauge("c_total", "c", {"a", "b"}), "declared twice");
  EXPECT_DEATH(r.AddGauge("bad-name", "x"), "invalid metric name");
}

}  // namespace
}  // namespace ember::metrics
