// A small Prometheus metrics registry and its text exposition (format
// 0.0.4), for the shard and the trainer client. Prometheus-cpp is not
// packaged for Debian 12; this is the part of it Ember needs.
//
//   metrics::Registry registry;
//   auto& requests = registry.AddCounter("ember_requests_total", "RPCs served.", {"rpc", "code"});
//   metrics::Counter& ok = requests.With({"Lookup", "OK"});   // keep the reference
//   ok.Add();
//   std::string text = registry.Expose();
//
// A family is declared once, with its help text and label names. Series are
// created on first use; the reference With returns stays valid for the
// registry's life (until Clear of its family), so hot paths look a series
// up once and keep it. Counter, Gauge and Histogram updates are lock-free.
//
// Thread safety: everything may be called from any thread. Misuse that is a
// programming error (an invalid name, a wrong label count, one name declared
// with two types) aborts with a message at the call.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ember::metrics {

// Label values of one series, in its family's label-name order.
using Labels = std::vector<std::string>;

class Counter {
 public:
  // `v` >= 0 (a negative value is ignored: counters only go up).
  void Add(double v = 1.0) {
    if (v >= 0) value_.fetch_add(v, std::memory_order_relaxed);
  }
  double Value() const { return value_.load(std::memory_order_relaxed); }
  // For a counter that mirrors a monotonic count kept elsewhere (CPU time,
  // a store's evictions), set at scrape time.
  void Mirror(double v) { value_.store(v, std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // `bounds`: increasing upper bounds; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (= count)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Snap() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, +Inf last
  std::atomic<double> sum_{0.0};
};

// Bounds for latencies in seconds: 50 us to 10 s, about 2.5x apart.
std::vector<double> LatencyBounds();

enum class Type { kCounter, kGauge, kHistogram };

// Everything a family holds, independent of its metric type.
class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, std::vector<std::string> label_names, Type type)
      : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)),
        type_(type) {}
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  Type type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Appends this family's HELP, TYPE and samples.
  void Expose(std::string* out) const {
    Header(out);
    ExposeSamples(out, "");
  }
  // Appends the HELP and TYPE lines.
  void Header(std::string* out) const;
  // Appends the samples; `first_labels` (`name="value",...`, escaped; empty:
  // none) goes before each series' own labels.
  virtual void ExposeSamples(std::string* out, const std::string& first_labels) const = 0;

 protected:
  void CheckLabels(const Labels& values) const;
  std::string SeriesName(const std::string& suffix, const std::string& first_labels,
                         const Labels& values, const char* extra_name = nullptr,
                         const std::string& extra_value = "") const;

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const Type type_;
};

template <typename M>
class Family final : public FamilyBase {
 public:
  using FamilyBase::FamilyBase;
  Family(std::string name, std::string help, std::vector<std::string> labels, Type type,
         std::vector<double> bounds)
      : FamilyBase(std::move(name), std::move(help), std::move(labels), type),
        bounds_(std::move(bounds)) {}

  // The series of `values` (one per label name), created on first use.
  M& With(const Labels& values);
  // Drops every series; references from With become invalid. For families
  // that a scrape callback refills (e.g. per-table gauges).
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    series_.clear();
  }
  void ExposeSamples(std::string* out, const std::string& first_labels) const override;

 private:
  mutable std::mutex mu_;
  std::map<Labels, std::unique_ptr<M>> series_;
  std::vector<double> bounds_;  // histograms
};

class Registry {
 public:
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names = {});
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names,
                                  std::vector<double> bounds = LatencyBounds());

  // `fn` runs at the start of every Expose, to set values read at scrape
  // time (rows per table, process memory). It may use the registry.
  void OnScrape(std::function<void()> fn);

  // The text exposition of every family, sorted by name, with the
  // attached registries' series among them.
  std::string Expose() const;

  // Exposes `child`'s families with this registry's, each of its series
  // labelled label_name="label_value" first (e.g. shard="0": the shards in
  // a trainer's process, on the trainer's endpoint). A family of the same
  // name in both is one family (one HELP and TYPE: this registry's, or the
  // first attached one's); a child's family of another type is left out.
  // Its scrape callbacks run at every Expose. `child` must stay valid until
  // Detach; it must not be attached to this registry's children itself.
  void Attach(const Registry* child, const std::string& label_name, const std::string& label_value);
  void Detach(const Registry* child);

 private:
  struct Attached {
    const Registry* registry;
    std::string labels;  // label_name="label_value", escaped
  };
  // Runs the scrape callbacks (of this registry only).
  void RunScrapeCallbacks() const;

  template <typename M>
  Family<M>& Add(const std::string& name, const std::string& help,
                 std::vector<std::string> label_names, Type type, std::vector<double> bounds);

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>> families_;
  std::vector<std::function<void()>> scrape_callbacks_;
  std::vector<Attached> attached_;  // guarded by mu_
};

// Formats a sample value as the exposition format wants it (+Inf, NaN, and
// integers without an exponent).
std::string FormatValue(double v);

// Label value with \, " and newline escaped.
std::string EscapeLabelValue(const std::string& v);

// process_cpu_seconds_total, process_resident_memory_bytes,
// process_virtual_memory_bytes, process_start_time_seconds and
// process_open_fds, read from /proc at every scrape.
void AddProcessMetrics(Registry* registry);

}  // namespace ember::metrics
