#include "common/base/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>

#include "common/base/status.h"

namespace tandem {
namespace {

bool ValidMetricName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool ValidLabelName(const std::string& name) {
  if (name.empty() || name.rfind("__", 0) == 0) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

void AtomicAdd(std::atomic<double>& target, double amount) {
  target.fetch_add(amount, std::memory_order_relaxed);
}

// Writes `{a="x",b="y"}` (or nothing) for constant labels + series labels + an extra pair.
void AppendLabels(std::string& out, const Labels& const_labels,
                  const std::vector<std::string>& names, const std::vector<std::string>& values,
                  const char* extra_name = nullptr, const std::string& extra_value = "") {
  bool any = !const_labels.empty() || !names.empty() || extra_name;
  if (!any) return;
  out += '{';
  bool first = true;
  auto add = [&](const std::string& name, const std::string& value) {
    if (!first) out += ',';
    first = false;
    out += name;
    out += "=\"";
    out += EscapeLabelValue(value);
    out += '"';
  };
  // A series label of the same name replaces a constant label (MetricsRegistry::AddGaugeAbout;
  // other families cannot have one).
  for (const auto& [name, value] : const_labels)
    if (std::find(names.begin(), names.end(), name) == names.end()) add(name, value);
  for (size_t i = 0; i < names.size(); ++i) add(names[i], values[i]);
  if (extra_name) add(extra_name, extra_value);
  out += '}';
}

void AppendHeader(std::string& out, const std::string& name, const std::string& help,
                  const char* type) {
  out += "# HELP " + name + " " + EscapeHelp(help) + "\n";
  out += "# TYPE " + name + " " + type + "\n";
}

}  // namespace

void Counter::Inc(double amount) {
  TANDEM_CHECK(amount >= 0, "counters only go up");
  AtomicAdd(value_, amount);
}

void Gauge::Inc(double amount) { AtomicAdd(value_, amount); }

Histogram::Histogram(const std::vector<double>& bounds)
    : bounds_(bounds), counts_(new std::atomic<uint64_t>[bounds.size() + 1]) {
  for (size_t i = 0; i + 1 < bounds_.size(); ++i)
    TANDEM_CHECK(bounds_[i] < bounds_[i + 1], "histogram bounds must increase");
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double value) {
  // Bucket i holds values in (bounds[i-1], bounds[i]]; Prometheus' "le" is inclusive.
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
  count_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0};
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  TANDEM_CHECK(start > 0 && factor > 1 && count > 0, "bad exponential buckets");
  std::vector<double> out;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) out.push_back(bound);
  return out;
}

template <typename T>
T& Family<T>::WithLabels(const std::vector<std::string>& values) {
  TANDEM_CHECK(values.size() == label_names_.size(),
               name_ + ": expected " + std::to_string(label_names_.size()) + " label values");
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = series_.find(values);
  if (it != series_.end()) return *it->second;
  std::unique_ptr<T> series;
  if constexpr (std::is_same_v<T, Histogram>) {
    series = std::make_unique<Histogram>(bounds_);
  } else {
    series = std::make_unique<T>();
  }
  T& ref = *series;
  series_.emplace(values, std::move(series));
  return ref;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

MetricsRegistry::MetricsRegistry(Labels const_labels) : const_labels_(std::move(const_labels)) {
  for (const auto& [name, value] : const_labels_)
    TANDEM_CHECK(ValidLabelName(name), "invalid label name '" + name + "'");
}

void MetricsRegistry::CheckNew(const std::string& name, const std::vector<std::string>& labels,
                               MetricType type, bool replaces_constant_labels) {
  TANDEM_CHECK(ValidMetricName(name), "invalid metric name '" + name + "'");
  for (const std::string& label : labels) {
    TANDEM_CHECK(ValidLabelName(label), name + ": invalid label name '" + label + "'");
    TANDEM_CHECK(type != MetricType::kHistogram || label != "le", name + ": 'le' is reserved");
    for (const auto& [const_name, unused] : const_labels_)
      TANDEM_CHECK(replaces_constant_labels || label != const_name, name + ": label '" + label + "' is a constant label");
  }
  if (type == MetricType::kCounter)
    TANDEM_CHECK(name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0,
                 "counter '" + name + "' must end in _total");
}

template <typename T>
Family<T>& MetricsRegistry::Add(MetricType type, std::vector<std::unique_ptr<Family<T>>>& owner,
                               const std::string& name, const std::string& help,
                               const std::vector<std::string>& label_names,
                               std::vector<double> bounds, bool replaces_constant_labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = entries_.find(name); it != entries_.end()) {
    TANDEM_CHECK(it->second.type == type, name + " registered with another type");
    auto* family = static_cast<Family<T>*>(it->second.family);
    TANDEM_CHECK(family->label_names_ == label_names, name + " registered with other labels");
    return *family;
  }
  CheckNew(name, label_names, type, replaces_constant_labels);
  owner.emplace_back(new Family<T>(name, help, label_names, std::move(bounds)));
  entries_[name] = Entry{type, owner.back().get()};
  order_.push_back(name);
  return *owner.back();
}

Family<Counter>& MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                             const std::vector<std::string>& label_names) {
  return Add(MetricType::kCounter, counters_, name, help, label_names, {});
}

Family<Gauge>& MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                         const std::vector<std::string>& label_names) {
  return Add(MetricType::kGauge, gauges_, name, help, label_names, {});
}

Family<Gauge>& MetricsRegistry::AddGaugeAbout(const std::string& name, const std::string& help,
                                              const std::vector<std::string>& label_names) {
  return Add(MetricType::kGauge, gauges_, name, help, label_names, {},
             /*replaces_constant_labels=*/true);
}

Family<Histogram>& MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                                 const std::vector<std::string>& label_names,
                                                 std::vector<double> bounds) {
  TANDEM_CHECK(!bounds.empty(), name + ": a histogram needs buckets");
  return Add(MetricType::kHistogram, histograms_, name, help, label_names, std::move(bounds));
}

std::string MetricsRegistry::Render() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  for (const std::string& name : order_) {
    const Entry& entry = entries_.at(name);
    if (entry.type == MetricType::kCounter || entry.type == MetricType::kGauge) {
      bool counter = entry.type == MetricType::kCounter;
      // Counter and Gauge share the rendering; only the value accessor differs.
      auto render = [&](const auto& family) {
        AppendHeader(out, name, family.help_, counter ? "counter" : "gauge");
        std::lock_guard<std::mutex> family_lock(family.mutex_);
        for (const auto& [values, series] : family.series_) {
          out += name;
          AppendLabels(out, const_labels_, family.label_names_, values);
          out += ' ';
          out += FormatMetricValue(series->Value());
          out += '\n';
        }
      };
      if (counter) render(*static_cast<const Family<Counter>*>(entry.family));
      else render(*static_cast<const Family<Gauge>*>(entry.family));
      continue;
    }
    const auto& family = *static_cast<const Family<Histogram>*>(entry.family);
    AppendHeader(out, name, family.help_, "histogram");
    std::lock_guard<std::mutex> family_lock(family.mutex_);
    for (const auto& [values, series] : family.series_) {
      // Read the buckets first and derive the count from them, so that a scrape racing an
      // Observe never shows a +Inf bucket that differs from _count.
      uint64_t cumulative = 0;
      const std::vector<double>& bounds = series->bounds();
      for (size_t i = 0; i <= bounds.size(); ++i) {
        cumulative += series->BucketCount(i);
        out += name + "_bucket";
        AppendLabels(out, const_labels_, family.label_names_, values, "le",
                     i < bounds.size() ? FormatMetricValue(bounds[i]) : "+Inf");
        out += ' ' + std::to_string(cumulative) + '\n';
      }
      out += name + "_sum";
      AppendLabels(out, const_labels_, family.label_names_, values);
      out += ' ' + FormatMetricValue(series->Sum()) + '\n';
      out += name + "_count";
      AppendLabels(out, const_labels_, family.label_names_, values);
      out += ' ' + std::to_string(cumulative) + '\n';
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  TANDEM_CHECK(ec == std::errc(), "to_chars failed");
  return std::string(buf, end);
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::map<std::string, double> ParseMetricSamples(const std::string& text, const std::string& name) {
  std::map<std::string, double> samples;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + start, end - start);
    start = end + 1;
    if (line.size() <= name.size() || line.substr(0, name.size()) != name) continue;
    std::string_view rest = line.substr(name.size());
    std::string labels;
    if (rest.front() == '{') {
      // Label values are escaped (\" inside), so the set ends at the first unescaped '}'.
      size_t i = 1;
      bool in_value = false;
      for (; i < rest.size(); ++i) {
        if (in_value && rest[i] == '\\') {
          ++i;
        } else if (rest[i] == '"') {
          in_value = !in_value;
        } else if (!in_value && rest[i] == '}') {
          break;
        }
      }
      if (i >= rest.size()) continue;
      labels = std::string(rest.substr(1, i - 1));
      rest = rest.substr(i + 1);
    }
    if (rest.empty() || rest.front() != ' ') continue;  // another metric with this prefix
    rest.remove_prefix(1);
    const std::string value(rest.substr(0, rest.find(' ')));
    double v = 0;
    if (value == "+Inf") {
      v = std::numeric_limits<double>::infinity();
    } else if (value == "-Inf") {
      v = -std::numeric_limits<double>::infinity();
    } else if (value == "NaN") {
      v = std::numeric_limits<double>::quiet_NaN();
    } else {
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || ptr != value.data() + value.size()) continue;
    }
    samples[labels] = v;
  }
  return samples;
}

}  // namespace tandem
