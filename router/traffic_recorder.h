// What the router has been offered lately, for the replica recommendation
// (router/replica_advice.h): every request that passed validation (admitted or refused: the
// offered load, not the served one), and the lengths of those that finished.
//
// Bounded: at most `max_samples` arrivals and as many finished requests are kept (the oldest
// go first), so a window longer than max_samples / rate sees the newest max_samples only.
// Thread-safe; Record* are called on the router's worker and backend threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

namespace tandem {

struct TrafficSample {
  std::chrono::steady_clock::time_point arrival;
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;  // generated (finished) or asked for (max_tokens, not finished)
};

struct TrafficWindow {
  double window_s = 0;
  int64_t arrivals = 0;  // requests offered in the window
  // The length mix: the requests that finished in the window; when none has finished yet, the
  // arrivals' prompt lengths with their max_tokens.
  std::vector<TrafficSample> samples;
  double rate_rps() const { return window_s > 0 ? static_cast<double>(arrivals) / window_s : 0; }
};

class TrafficRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  explicit TrafficRecorder(size_t max_samples = 4096) : max_samples_(max_samples) {}

  void RecordArrival(Clock::time_point arrival, int32_t prompt_tokens, int32_t max_tokens);
  void RecordFinish(Clock::time_point arrival, int32_t prompt_tokens, int32_t output_tokens);

  // The last `window_s` seconds before `now`.
  TrafficWindow Window(Clock::time_point now, double window_s) const;

 private:
  struct Finished {
    Clock::time_point at;
    TrafficSample sample;
  };
  const size_t max_samples_;
  mutable std::mutex mutex_;
  std::deque<TrafficSample> arrivals_;  // in arrival order
  std::deque<Finished> finished_;       // in finish order
};

}  // namespace tandem
