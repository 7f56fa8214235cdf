// What `tandem bench` and `tandem bench sweep` share besides the HTTP client: the synthetic
// request lists, the summary table and the JSON records of a run.
//
// JSON records (also what the tests and the sweep's plots read):
//   summary   RunSummary's fields by name (requests, completed, ..., attainment)
//   requests  one object per request: RequestOutcome's fields by name plus "max_tokens"
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/workload.h"
#include "common/base/status.h"

namespace tandem {

// A synthetic workload for one run. rate > 0: Poisson arrivals; rate <= 0: all at t = 0
// (concurrency mode). num_requests <= 0 with duration_s > 0: enough requests to cover the
// duration (rate mode: those arriving within it; concurrency mode: kMaxDurationRequests).
// InvalidArgument naming the workload when it is unknown.
inline constexpr int64_t kMaxDurationRequests = 100000;
StatusOr<std::vector<WorkloadRequest>> SyntheticRequests(const std::string& workload, double rate,
                                                         int64_t num_requests, double duration_s,
                                                         uint64_t seed, int32_t max_model_len);

// The table printed after a run: counts, throughput, p50/p90/p99 and attainment.
std::string FormatSummaryTable(const RunSummary& summary);

// SummaryToJson / OutcomesToJson / OutcomesFromJson: cluster/workload.h.

// Writes `text` to `path` (replacing it). Unavailable naming the path on failure.
Status WriteTextFile(const std::string& path, const std::string& text);

// "2026-12-02T16:40:00Z", for the records.
std::string UtcTimestamp();

}  // namespace tandem
