// Metrics in the Prometheus text exposition format (version 0.0.4), written by hand because
// prometheus-cpp is not packaged in Debian 12.
//
// A MetricsRegistry holds families (counter, gauge, histogram), each with fixed label names;
// a series is one set of label values. Registration and label lookup take a mutex: do them once
// and keep the returned reference (it lives as long as the registry). Updating a series is
// lock-free (relaxed atomics), so the hot path pays a few atomic adds.
//
// Names follow DESIGN.md: "tandem_" prefix, units in the suffix, counters end in "_total".
// Constant labels (role, model) given to the registry are added to every series.
// Invalid metric or label names are programming errors (TANDEM_CHECK).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Inc(double amount = 1.0);  // amount must be >= 0
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Inc(double amount = 1.0);
  void Dec(double amount = 1.0) { Inc(-amount); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // `bounds` are the upper bounds of the finite buckets, strictly increasing.
  explicit Histogram(const std::vector<double>& bounds);
  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Non-cumulative count of bucket i (i == bounds().size() is the +Inf bucket).
  uint64_t BucketCount(size_t i) const { return counts_[i].load(std::memory_order_relaxed); }
  uint64_t Count() const { return count_.load(std::memory_order_relaxed); }
  double Sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0.0};
};

// Buckets for latencies in seconds, from 1 ms to 10 min (as vLLM's TTFT/TPOT buckets span).
std::vector<double> LatencyBuckets();
// `count` buckets start, start*factor, ...
std::vector<double> ExponentialBuckets(double start, double factor, int count);

enum class MetricType { kCounter, kGauge, kHistogram };

// One metric name with its series. T is Counter, Gauge or Histogram.
template <typename T>
class Family {
 public:
  // Returns the series for these label values (in label-name order), creating it on first use.
  T& WithLabels(const std::vector<std::string>& values);
  // The series of a family without labels.
  T& Get() { return WithLabels({}); }

 private:
  friend class MetricsRegistry;
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> bounds)
      : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)),
        bounds_(std::move(bounds)) {}

  std::string name_;
  std::string help_;
  std::vector<std::string> label_names_;
  std::vector<double> bounds_;  // histograms only
  mutable std::mutex mutex_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> series_;
};

class MetricsRegistry {
 public:
  explicit MetricsRegistry(Labels const_labels = {});

  // Registering the same name twice with the same type and labels returns the same family;
  // with a different type or labels it is a programming error.
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              const std::vector<std::string>& label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          const std::vector<std::string>& label_names = {});
  // A gauge about another process than the one exporting it: a series label named like a
  // constant label replaces it on this family (the router's
  // tandem_recommended_replicas{role="decode"} instead of its own role="router").
  Family<Gauge>& AddGaugeAbout(const std::string& name, const std::string& help,
                               const std::vector<std::string>& label_names);
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  const std::vector<std::string>& label_names,
                                  std::vector<double> bounds);

  // The whole registry in Prometheus text format, families in registration order.
  std::string Render() const;

 private:
  struct Entry {
    MetricType type;
    void* family;  // Family<Counter|Gauge|Histogram>*, owned by the matching vector below
  };
  template <typename T>
  Family<T>& Add(MetricType type, std::vector<std::unique_ptr<Family<T>>>& owner,
                 const std::string& name, const std::string& help,
                 const std::vector<std::string>& label_names, std::vector<double> bounds,
                 bool replaces_constant_labels = false);
  void CheckNew(const std::string& name, const std::vector<std::string>& label_names,
                MetricType type, bool replaces_constant_labels = false);

  Labels const_labels_;
  mutable std::mutex mutex_;
  std::vector<std::string> order_;
  std::map<std::string, Entry> entries_;
  std::vector<std::unique_ptr<Family<Counter>>> counters_;
  std::vector<std::unique_ptr<Family<Gauge>>> gauges_;
  std::vector<std::unique_ptr<Family<Histogram>>> histograms_;
};

// Helpers for the exposition format (exposed for tests).
std::string FormatMetricValue(double value);  // "+Inf", "NaN", shortest round-trip decimal
std::string EscapeLabelValue(const std::string& value);  // \\, \", \n
std::string EscapeHelp(const std::string& help);          // \\, \n

// Reading the format back (a scraper's side, e.g. `tandem bench sweep` sampling the router):
// every sample of metric `name` in `text`, keyed by its label set as written ("" without labels,
// else e.g. `instance="decode-0"`). Comments, other metrics and lines that do not parse are
// skipped; a timestamp after the value is ignored.
std::map<std::string, double> ParseMetricSamples(const std::string& text, const std::string& name);

}  // namespace tandem
