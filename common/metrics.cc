#include "common/metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ember::metrics {
namespace {

[[noreturn]] void Misuse(const std::string& what) {
  std::fprintf(stderr, "ember metrics: %s\n", what.c_str());
  std::abort();
}

bool ValidName(const std::string& name, bool label) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                       (!label && c == ':');
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return !(label && name.rfind("__", 0) == 0);
}

std::string EscapeHelp(const std::string& h) {
  std::string out;
  for (char c : h) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

const char* TypeName(Type t) {
  switch (t) {
    case Type::kCounter: return "counter";
    case Type::kGauge: return "gauge";
    case Type::kHistogram: return "histogram";
  }
  return "untyped";
}

}  // namespace

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  char buf[32];  // shortest text that reads back as the same double
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::vector<double> LatencyBounds() {
  return {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
          25e-3, 50e-3,  100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0};
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  const size_t b = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[b].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Snap() const {
  Snapshot s;
  s.bounds = bounds_;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

void FamilyBase::CheckLabels(const Labels& values) const {
  if (values.size() != label_names_.size()) {
    Misuse(absl::StrCat(name_, ": expected ", label_names_.size(), " label values (",
                        absl::StrJoin(label_names_, ", "), "), received ", values.size()));
  }
}

std::string FamilyBase::SeriesName(const std::string& suffix, const std::string& first_labels,
                                   const Labels& values, const char* extra_name,
                                   const std::string& extra_value) const {
  std::string s = name_ + suffix;
  if (first_labels.empty() && label_names_.empty() && extra_name == nullptr) return s;
  s += '{';
  s += first_labels;
  bool comma = !first_labels.empty();
  for (size_t i = 0; i < label_names_.size(); ++i) {
    if (comma) s += ',';
    absl::StrAppend(&s, label_names_[i], "=\"", EscapeLabelValue(values[i]), "\"");
    comma = true;
  }
  if (extra_name != nullptr) {
    if (comma) s += ',';
    absl::StrAppend(&s, extra_name, "=\"", extra_value, "\"");
  }
  s += '}';
  return s;
}

void FamilyBase::Header(std::string* out) const {
  absl::StrAppend(out, "# HELP ", name_, " ", EscapeHelp(help_), "\n# TYPE ", name_, " ",
                  TypeName(type_), "\n");
}

template <typename M>
M& Family<M>::With(const Labels& values) {
  CheckLabels(values);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = series_.find(values);
  if (it == series_.end()) {
    if constexpr (std::is_same_v<M, Histogram>) {
      it = series_.emplace(values, std::make_unique<Histogram>(bounds_)).first;
    } else {
      it = series_.emplace(values, std::make_unique<M>()).first;
    }
  }
  return *it->second;
}

template <typename M>
void Family<M>::ExposeSamples(std::string* out, const std::string& first_labels) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [labels, m] : series_) {
    if constexpr (std::is_same_v<M, Histogram>) {
      const Histogram::Snapshot s = m->Snap();
      for (size_t i = 0; i < s.cumulative.size(); ++i) {
        const std::string le = i < s.bounds.size() ? FormatValue(s.bounds[i]) : "+Inf";
        absl::StrAppend(out, SeriesName("_bucket", first_labels, labels, "le", le), " ",
                        s.cumulative[i], "\n");
      }
      absl::StrAppend(out, SeriesName("_sum", first_labels, labels), " ", FormatValue(s.sum), "\n");
      absl::StrAppend(out, SeriesName("_count", first_labels, labels), " ", s.count, "\n");
    } else {
      absl::StrAppend(out, SeriesName("", first_labels, labels), " ", FormatValue(m->Value()),
                      "\n");
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

template <typename M>
Family<M>& Registry::Add(const std::string& name, const std::string& help,
                         std::vector<std::string> label_names, Type type,
                         std::vector<double> bounds) {
  if (!ValidName(name, false)) Misuse(absl::StrCat("invalid metric name '", name, "'"));
  for (const std::string& l : label_names) {
    if (!ValidName(l, true) || l == "le" || l == "quantile") {
      Misuse(absl::StrCat(name, ": invalid label name '", l, "'"));
    }
  }
  if (type == Type::kHistogram && !std::is_sorted(bounds.begin(), bounds.end())) {
    Misuse(absl::StrCat(name, ": histogram bounds must increase"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    if (it->second->type() != type || it->second->label_names() != label_names) {
      Misuse(absl::StrCat("metric '", name, "' declared twice with different types or labels"));
    }
    return static_cast<Family<M>&>(*it->second);
  }
  auto family = std::make_unique<Family<M>>(name, help, std::move(label_names), type,
                                            std::move(bounds));
  Family<M>& ref = *family;
  families_.emplace(name, std::move(family));
  return ref;
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names) {
  return Add<Counter>(name, help, std::move(label_names), Type::kCounter, {});
}
Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names) {
  return Add<Gauge>(name, help, std::move(label_names), Type::kGauge, {});
}
Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> bounds) {
  return Add<Histogram>(name, help, std::move(label_names), Type::kHistogram, std::move(bounds));
}

void Registry::OnScrape(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  scrape_callbacks_.push_back(std::move(fn));
}

void Registry::RunScrapeCallbacks() const {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    callbacks = scrape_callbacks_;
  }
  for (const auto& fn : callbacks) fn();
}

void Registry::Attach(const Registry* child, const std::string& label_name,
                      const std::string& label_value) {
  if (!ValidName(label_name, true)) Misuse(absl::StrCat("invalid label name '", label_name, "'"));
  std::lock_guard<std::mutex> lock(mu_);
  attached_.push_back(
      {child, absl::StrCat(label_name, "=\"", EscapeLabelValue(label_value), "\"")});
}

void Registry::Detach(const Registry* child) {
  std::lock_guard<std::mutex> lock(mu_);
  attached_.erase(std::remove_if(attached_.begin(), attached_.end(),
                                 [child](const Attached& a) { return a.registry == child; }),
                  attached_.end());
}

std::string Registry::Expose() const {
  RunScrapeCallbacks();
  std::lock_guard<std::mutex> lock(mu_);
  for (const Attached& a : attached_) a.registry->RunScrapeCallbacks();
  // Each name once: its family here (or the first child's that has it),
  // then the same family's series in every child, labelled.
  std::vector<std::unique_lock<std::mutex>> child_locks;
  for (const Attached& a : attached_) child_locks.emplace_back(a.registry->mu_);
  std::map<std::string, const FamilyBase*> headers;
  for (const auto& [name, family] : families_) headers.emplace(name, family.get());
  for (const Attached& a : attached_) {
    for (const auto& [name, family] : a.registry->families_) headers.emplace(name, family.get());
  }
  std::string out;
  for (const auto& [name, header] : headers) {
    header->Header(&out);
    if (auto it = families_.find(name); it != families_.end()) {
      it->second->ExposeSamples(&out, "");
    }
    for (const Attached& a : attached_) {
      auto it = a.registry->families_.find(name);
      if (it == a.registry->families_.end() || it->second->type() != header->type()) continue;
      it->second->ExposeSamples(&out, a.labels);
    }
  }
  return out;
}

void AddProcessMetrics(Registry* registry) {
  Counter& cpu = registry->AddCounter("process_cpu_seconds_total",
                                  "User and system CPU time of the process, in seconds.")
                   .With({});
  Gauge& rss = registry->AddGauge("process_resident_memory_bytes",
                                  "Resident memory of the process, in bytes.")
                   .With({});
  Gauge& vsz = registry->AddGauge("process_virtual_memory_bytes",
                                  "Virtual memory of the process, in bytes.")
                   .With({});
  Gauge& fds = registry->AddGauge("process_open_fds", "Open file descriptors of the process.")
                   .With({});
  Gauge& start = registry->AddGauge("process_start_time_seconds",
                                    "Start of the process, in seconds since the Unix epoch.")
                     .With({});
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  // Boot time, to turn the start tick of /proc/self/stat into epoch seconds.
  double boot = 0;
  {
    std::ifstream in("/proc/stat");
    std::string key;
    while (in >> key) {
      if (key == "btime") {
        in >> boot;
        break;
      }
    }
  }
  registry->OnScrape([=, &cpu, &rss, &vsz, &fds, &start] {
    std::ifstream in("/proc/self/stat");
    std::string line;
    std::getline(in, line);
    // Fields after the command name (which may hold spaces) start at ')'.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) return;
    std::istringstream fields(line.substr(close + 2));
    std::vector<std::string> f;
    for (std::string x; fields >> x;) f.push_back(x);
    // f[0] is field 3 (state): utime 14, stime 15, starttime 22, vsize 23, rss 24.
    if (f.size() < 22) return;
    cpu.Mirror((std::stod(f[11]) + std::stod(f[12])) / tick);
    start.Set(boot + std::stod(f[19]) / tick);
    vsz.Set(std::stod(f[20]));
    rss.Set(std::stod(f[21]) * page);
    int n = 0;
    if (DIR* d = opendir("/proc/self/fd")) {
      while (readdir(d) != nullptr) ++n;
      closedir(d);
    }
    fds.Set(std::max(0, n - 3));  // ".", ".." and the directory's own descriptor
  });
}

}  // namespace ember::metrics
