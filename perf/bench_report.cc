#include "perf/bench_report.h"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>

namespace tandem {

StatusOr<std::vector<WorkloadRequest>> SyntheticRequests(const std::string& workload, double rate,
                                                         int64_t num_requests, double duration_s,
                                                         uint64_t seed, int32_t max_model_len) {
  TANDEM_ASSIGN_OR_RETURN(WorkloadShape shape, WorkloadShapeByName(workload));
  WorkloadOptions options;
  options.rate = rate;
  options.seed = seed;
  options.max_model_len = max_model_len;
  options.num_requests = num_requests;
  const bool by_duration = num_requests <= 0 && duration_s > 0;
  if (by_duration) {
    // Poisson: the count in D seconds is rate*D +- sqrt(rate*D); 8 sigma of slack, then cut.
    double expected = rate * duration_s;
    options.num_requests = rate > 0 ? static_cast<int64_t>(expected + 8 * std::sqrt(expected) + 16)
                                    : kMaxDurationRequests;
  }
  std::vector<WorkloadRequest> requests = GenerateWorkload(shape, options);
  if (by_duration && rate > 0) {
    while (!requests.empty() && requests.back().arrival_s > duration_s) requests.pop_back();
  }
  return requests;
}

std::string FormatSummaryTable(const RunSummary& s) {
  char buf[1024];
  std::string out;
  std::snprintf(buf, sizeof buf,
                "requests  completed  rejected  failed  duration_s     req/s  out_tok/s\n"
                "%8lld  %9lld  %8lld  %6lld  %10.2f  %8.3f  %9.1f\n\n",
                static_cast<long long>(s.requests), static_cast<long long>(s.completed),
                static_cast<long long>(s.rejected), static_cast<long long>(s.failed), s.duration_s,
                s.throughput_rps, s.output_tokens_per_s);
  out += buf;
  std::snprintf(buf, sizeof buf,
                "latency (s)       p50        p90        p99\n"
                "TTFT       %10.4f %10.4f %10.4f\n"
                "TPOT       %10.4f %10.4f %10.4f\n"
                "e2e        %10.4f %10.4f %10.4f\n\n",
                s.ttft_p50, s.ttft_p90, s.ttft_p99, s.tpot_p50, s.tpot_p90, s.tpot_p99, s.e2e_p50,
                s.e2e_p90, s.e2e_p99);
  out += buf;
  std::snprintf(buf, sizeof buf, "SLO attainment %.1f%%  (TTFT only %.1f%%, TPOT only %.1f%%)\n",
                100 * s.attainment, 100 * s.ttft_attainment, 100 * s.tpot_attainment);
  out += buf;
  return out;
}

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return Unavailable(path + ": cannot write");
  return Status::Ok();
}

std::string UtcTimestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace tandem
