// An exponentially weighted moving average: the first sample sets it, each later sample moves it
// `weight` of the way from its value toward the sample:
// value = (1 - weight) * value + weight * sample.
// The one implementation of the averages that instances report (LoadReport: step times,
// seconds per prompt token, batch and context of decode steps), that the simulator replays, and
// that the router keeps of what arrivals find on an instance.
//
// A plain value type: not thread-safe; its owner's thread adds samples and reads it.
#pragma once

namespace tandem {

// The weight of the averages an instance reports in its LoadReport. The servers and the
// simulator (cluster/simulator.h) use this one value, so that a simulated report is what the
// server would have sent.
inline constexpr double kLoadReportAverageWeight = 0.2;

class MovingAverage {
 public:
  // 0 < weight <= 1: how far one sample moves the average (1 = the latest sample only).
  explicit constexpr MovingAverage(double weight = kLoadReportAverageWeight) : weight_(weight) {}

  constexpr void Add(double sample) {
    value_ = seeded_ ? (1 - weight_) * value_ + weight_ * sample : sample;
    seeded_ = true;
  }

  // 0 until the first sample.
  constexpr double value() const { return value_; }
  constexpr bool has_value() const { return seeded_; }
  // Forgets every sample (a new incarnation of what is averaged).
  constexpr void Reset() {
    value_ = 0;
    seeded_ = false;
  }

 private:
  double weight_;
  double value_ = 0;
  bool seeded_ = false;
};

}  // namespace tandem
