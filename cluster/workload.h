// Workloads and their scoring, shared by the load generator (`tandem bench`, perf/) and the
// cluster simulator (`tandem simulate`, `tandem plan`): both are driven by the same requests and
// score them the same way.
//
// A workload is a list of requests, each with an arrival time, a prompt length and an output
// length. Synthetic workloads are seeded (the same seed gives the same list, on every machine):
//
//   chatbot         ShareGPT-like: log-normal input (median ~ 0.1 * max_model_len) and output
//                   (median ~ 0.06 * max_model_len), clipped to the model's length budget: one
//                   turn, as vLLM's serving benchmark samples ShareGPT
//   chatbot-history ShareGPT as DistServe evaluated it: each prompt a conversation's history
//                   (median ~ 0.36 * max_model_len, up to the budget), outputs skewed short
//                   (median ~ 0.032 * max_model_len, a long tail)
//   code            HumanEval-like: short in (median ~ 0.04 * max_model_len), short out (~0.03)
//   summarization   LongBench-like: long in (median ~ 0.4 * max_model_len), short out (~0.03)
//
// Lengths scale with max_model_len (DistServe's distributions assume a 2k-4k context; a smaller
// model budget scales them down so the shapes stay the same). The exact parameters are in
// WorkloadShape and printed by `tandem bench --help`.
//
// Arrivals: Poisson at `rate` requests/s (exponential gaps), or all at t=0 when the generator
// runs in fixed-concurrency mode (the caller then ignores arrival_s).
//
// A trace is JSON Lines, one request per line:
//   {"prompt": "text" | "prompt_tokens": 123 | "prompt_tokens": [1, 2, 3],
//    "max_tokens": 64, "arrival_s": 0.25}
// "prompt" (text) keeps the text; the length is then unknown here (prompt_tokens = -1) until the
// router tokenizes it. Every error names the file, the line and the field.
//
// Scoring: TTFT = first token time - send time; TPOT = (e2e - TTFT) / (output_tokens - 1)
// (0 when there is one output token); a request meets the SLO when it completed without error,
// TTFT <= ttft_s and TPOT <= tpot_s (an objective <= 0 is not checked). A rejected or failed
// request counts as a miss. Attainment = met / all requests of the run.
//
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base/status.h"

namespace tandem {

// Log-normal length distribution, as a fraction of max_model_len: median and sigma (of ln).
struct LengthDistribution {
  double median_fraction = 0.1;
  double sigma = 0.8;
  int32_t min_tokens = 4;
};

struct WorkloadShape {
  std::string name;          // chatbot|chatbot-history|code|summarization
  LengthDistribution input;
  LengthDistribution output;
};

// "chatbot" | "chatbot-history" | "code" | "summarization"; InvalidArgument naming the value
// otherwise.
StatusOr<WorkloadShape> WorkloadShapeByName(std::string_view name);
std::vector<std::string> WorkloadNames();
// The same joined with '|', for help texts and messages: "chatbot|chatbot-history|...".
std::string WorkloadNameList();

struct WorkloadRequest {
  int64_t id = 0;             // 0, 1, 2, ... in arrival order
  double arrival_s = 0;       // since the start of the run
  int32_t prompt_tokens = 0;  // -1 when only text is known
  int32_t max_tokens = 0;     // output tokens asked for (ignore_eos: all are generated)
  std::string prompt_text;    // from a trace with "prompt"; else empty
  std::vector<int32_t> prompt_token_ids;  // from a trace with a list; else empty
};

struct WorkloadOptions {
  double rate = 1.0;          // requests/s (Poisson); <= 0: all arrive at t = 0
  int64_t num_requests = 100;
  uint64_t seed = 1;
  int32_t max_model_len = 4096;  // prompt + output <= this
};

// A seeded synthetic workload. Prompt + output never exceed max_model_len.
std::vector<WorkloadRequest> GenerateWorkload(const WorkloadShape& shape,
                                              const WorkloadOptions& options);

// Reads a JSON Lines trace (format above). InvalidArgument "trace.jsonl:12: max_tokens: ..." on
// the first bad line; NotFound when the file cannot be read.
StatusOr<std::vector<WorkloadRequest>> LoadTrace(const std::string& path);
// Writes requests as a trace LoadTrace reads back ("prompt_tokens" as a count unless ids/text).
std::string TraceToJsonl(const std::vector<WorkloadRequest>& requests);

// What happened to one request, measured (bench) or simulated (simulator).
struct RequestOutcome {
  int64_t id = 0;
  double arrival_s = 0;
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;  // generated
  bool ok = false;            // completed without error
  bool rejected = false;      // 429 from the router (admission control)
  std::string error;          // empty when ok
  double ttft_s = 0;
  double tpot_s = 0;
  double e2e_s = 0;
  // Where it ran: "colocated-1", "prefill-0 + decode-1"; empty = not known (a measured run: the
  // router does not say; the simulator fills it).
  std::string placed_on;
};

struct Slo {
  double ttft_s = 0;  // <= 0: not checked
  double tpot_s = 0;
};

// TPOT as defined above, from e2e, ttft and the number of output tokens.
double TpotSeconds(double e2e_s, double ttft_s, int32_t output_tokens);
bool MeetsSlo(const RequestOutcome& outcome, const Slo& slo);

// p in [0, 100], linear interpolation between order statistics; 0 for an empty input.
double Percentile(std::vector<double> values, double p);

struct RunSummary {
  int64_t requests = 0, completed = 0, rejected = 0, failed = 0;
  double duration_s = 0;          // first arrival to last completion
  double throughput_rps = 0;      // completed / duration
  double output_tokens_per_s = 0;
  double ttft_p50 = 0, ttft_p90 = 0, ttft_p99 = 0;  // over completed requests
  double tpot_p50 = 0, tpot_p90 = 0, tpot_p99 = 0;
  double e2e_p50 = 0, e2e_p90 = 0, e2e_p99 = 0;
  double attainment = 0;          // met / requests
  double ttft_attainment = 0;     // TTFT alone, same denominator
  double tpot_attainment = 0;
};

// `duration_s` is the wall time of the run as the caller measured it (<= 0: estimated from the
// outcomes as max(arrival + e2e) - min(arrival)).
RunSummary Summarize(const std::vector<RequestOutcome>& outcomes, const Slo& slo,
                     double duration_s = 0);

// JSON of a run, as `tandem bench`, `tandem bench sweep` and `tandem simulate` write it.
nlohmann::json SummaryToJson(const RunSummary& summary);
// `max_tokens` is beside `outcomes` (same size, or empty to leave the field out).
nlohmann::json OutcomesToJson(const std::vector<RequestOutcome>& outcomes,
                              const std::vector<int32_t>& max_tokens = {});
// Reads back what OutcomesToJson wrote (missing fields read as 0/false/empty).
std::vector<RequestOutcome> OutcomesFromJson(const nlohmann::json& requests);

}  // namespace tandem
