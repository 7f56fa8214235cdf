#include "router/traffic_recorder.h"

#include <algorithm>

namespace tandem {

void TrafficRecorder::RecordArrival(Clock::time_point arrival, int32_t prompt_tokens,
                                    int32_t max_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  arrivals_.push_back(TrafficSample{arrival, prompt_tokens, max_tokens});
  if (arrivals_.size() > max_samples_) arrivals_.pop_front();
}

void TrafficRecorder::RecordFinish(Clock::time_point arrival, int32_t prompt_tokens,
                                   int32_t output_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  finished_.push_back(Finished{Clock::now(), TrafficSample{arrival, prompt_tokens, output_tokens}});
  if (finished_.size() > max_samples_) finished_.pop_front();
}

TrafficWindow TrafficRecorder::Window(Clock::time_point now, double window_s) const {
  const Clock::time_point since =
      now - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(window_s));
  TrafficWindow window;
  window.window_s = window_s;
  std::lock_guard<std::mutex> lock(mutex_);
  // Arrivals come in (almost) time order from several workers: scan, do not bisect.
  std::vector<TrafficSample> offered;
  for (const TrafficSample& s : arrivals_) {
    if (s.arrival <= since || s.arrival > now) continue;
    ++window.arrivals;
    offered.push_back(s);
  }
  for (const Finished& f : finished_) {
    if (f.at > since && f.at <= now) window.samples.push_back(f.sample);
  }
  if (window.samples.empty()) window.samples = std::move(offered);
  return window;
}

}  // namespace tandem
