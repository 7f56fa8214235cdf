#include "perf/bench.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "cluster/workload.h"
#include "common/base/flags.h"
#include "perf/bench_client.h"
#include "perf/bench_report.h"
#include "perf/sweep.h"

namespace tandem {
namespace {

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "tandem bench: %s (see tandem bench --help)\n", message.c_str());
  return kExitUsage;
}

std::string WorkloadHelp() {
  std::string out =
      "\nworkloads (log-normal lengths; median as a fraction of max_model_len, sigma of ln,\n"
      "minimum tokens; prompt + output <= max_model_len):\n";
  for (const std::string& name : WorkloadNames()) {
    StatusOr<WorkloadShape> shape = WorkloadShapeByName(name);
    if (!shape.ok()) continue;
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "  %-14s input median %.2f sigma %.2f min %d; output median %.2f sigma %.2f "
                  "min %d\n",
                  name.c_str(), shape->input.median_fraction, shape->input.sigma,
                  shape->input.min_tokens, shape->output.median_fraction, shape->output.sigma,
                  shape->output.min_tokens);
    out += buf;
  }
  out +=
      "\nEach request: POST /v1/completions, stream with usage, ignore_eos, temperature 0, the\n"
      "prompt as seeded token ids in [100, --max-token-id). TTFT = first text event, e2e = "
      "[DONE],\n"
      "output tokens from the final usage. `tandem bench sweep --help`: the goodput sweep.\n";
  return out;
}

// Poisson arrivals at `rate` for a trace (portable: exponential gaps from mt19937_64 bits).
void RedrawArrivals(std::vector<WorkloadRequest>* requests, double rate, uint64_t seed) {
  std::mt19937_64 engine(seed);
  double t = 0;
  for (WorkloadRequest& r : *requests) {
    double u = static_cast<double>(engine() >> 11) * 0x1.0p-53;
    if (u <= 0) u = 0x1.0p-54;
    t += -std::log(u) / rate;
    r.arrival_s = t;
  }
}

}  // namespace

int BenchMain(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "sweep")
    return SweepMain(std::vector<std::string>(args.begin() + 1, args.end()));

  FlagParser flags(
      "tandem bench (--workload W | --trace FILE) (--rate R | --concurrency C) --slo-ttft X "
      "--slo-tpot Y [flags]\n       tandem bench sweep --help",
      "Load-tests an OpenAI-compatible server with streaming completions and scores the run "
      "against the SLOs.");
  flags.AddString("url", "http://127.0.0.1:8000", "the server (router) to load");
  flags.AddString("workload", "", "synthetic workload: " + WorkloadNameList());
  flags.AddString("trace", "", "JSON Lines trace instead of --workload (cluster/workload.h)");
  flags.AddInt("seed", 1, "workload seed (lengths, arrivals, prompt ids)");
  flags.AddInt("num-requests", 100, "requests in the run (a trace: the first N)");
  flags.AddDouble("rate", 0, "open loop: Poisson arrivals at R requests/s");
  flags.AddInt("concurrency", 0, "closed loop: C requests in flight");
  flags.AddDouble("duration-s", 0,
                  "send nothing after D seconds (without --num-requests: as many as fit)");
  flags.AddDouble("slo-ttft", -1, "TTFT objective in seconds (0: not checked)");
  flags.AddDouble("slo-tpot", -1, "TPOT objective in seconds (0: not checked)");
  flags.AddString("model", "", "the request's model field (default: from /v1/models)");
  flags.AddInt("max-model-len", 0,
               "length budget of the synthetic workload (default: from /v1/models, else 4096)");
  flags.AddInt("max-token-id", 1000, "synthetic prompt ids are below this (and >= 100)");
  flags.AddDouble("request-timeout-s", 600, "per request, connect to the end of the stream");
  flags.AddString("out", "", "write config, summary and per-request outcomes as JSON here");
  flags.AddBool("quiet", "no progress line and no table (errors only)");
  if (Status s = flags.Parse(args); !s.ok()) return UsageError(s.message());
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    std::fputs(WorkloadHelp().c_str(), stdout);
    return kExitOk;
  }
  if (!flags.positional().empty())
    return UsageError("unexpected argument '" + flags.positional()[0] + "'");

  const std::string workload = flags.GetString("workload"), trace = flags.GetString("trace");
  const double rate = flags.GetDouble("rate"), duration = flags.GetDouble("duration-s");
  const long concurrency = flags.GetInt("concurrency"), num_requests = flags.GetInt("num-requests");
  const double slo_ttft = flags.GetDouble("slo-ttft"), slo_tpot = flags.GetDouble("slo-tpot");
  const double timeout = flags.GetDouble("request-timeout-s");
  const long max_model_len_flag = flags.GetInt("max-model-len");
  const long max_token_id = flags.GetInt("max-token-id");
  const long seed = flags.GetInt("seed");

  if (workload.empty() == trace.empty())
    return UsageError("--workload: give exactly one of --workload and --trace");
  if (!workload.empty()) {
    if (StatusOr<WorkloadShape> shape = WorkloadShapeByName(workload); !shape.ok())
      return UsageError("--workload: " + shape.status().message());
  }
  if (flags.IsSet("rate") && !(rate > 0 && std::isfinite(rate)))
    return UsageError("--rate: must be > 0 requests/s, got " + Num(rate));
  if (flags.IsSet("concurrency") && concurrency < 1)
    return UsageError("--concurrency: must be >= 1, got " + std::to_string(concurrency));
  if (flags.IsSet("rate") && flags.IsSet("concurrency"))
    return UsageError("--rate: give only one of --rate and --concurrency");
  if (!flags.IsSet("rate") && !flags.IsSet("concurrency") && trace.empty())
    return UsageError("--rate: one of --rate and --concurrency is required");
  if (num_requests < 1)
    return UsageError("--num-requests: must be >= 1, got " + std::to_string(num_requests));
  if (!(duration >= 0 && std::isfinite(duration)))
    return UsageError("--duration-s: must be >= 0, got " + Num(duration));
  if (!flags.IsSet("slo-ttft") || !(slo_ttft >= 0))
    return UsageError("--slo-ttft: required, seconds >= 0");
  if (!flags.IsSet("slo-tpot") || !(slo_tpot >= 0))
    return UsageError("--slo-tpot: required, seconds >= 0");
  if (!(timeout > 0)) return UsageError("--request-timeout-s: must be > 0, got " + Num(timeout));
  if (max_model_len_flag < 0 || max_model_len_flag > (1 << 24))
    return UsageError("--max-model-len: must be in [0, 16777216], got " +
                      std::to_string(max_model_len_flag));
  if (max_token_id < 101 || max_token_id > (1L << 30))
    return UsageError("--max-token-id: must be > 100, got " + std::to_string(max_token_id));
  if (seed < 0) return UsageError("--seed: must be >= 0, got " + std::to_string(seed));
  StatusOr<ServerUrl> url = ParseServerUrl(flags.GetString("url"));
  if (!url.ok()) return UsageError("--url: " + url.status().message());

  LoadOptions options;
  options.url = *url;
  options.model = flags.GetString("model");
  options.concurrency = static_cast<int>(concurrency);
  options.duration_s = duration;
  options.request_timeout_s = timeout;
  options.seed = static_cast<uint64_t>(seed);
  options.max_token_id = static_cast<int32_t>(max_token_id);
  options.progress = !flags.GetBool("quiet") && ::isatty(STDERR_FILENO);

  int32_t max_model_len = static_cast<int32_t>(max_model_len_flag);
  if (options.model.empty() || max_model_len == 0) {
    StatusOr<ServedModelInfo> info = FetchModelInfo(options.url, std::min(timeout, 30.0));
    if (!info.ok()) {
      if (options.model.empty()) {
        std::fprintf(stderr, "tandem bench: %s (or pass --model)\n",
                     info.status().message().c_str());
        return kExitFailure;
      }
    } else {
      if (options.model.empty()) options.model = info->name;
      if (max_model_len == 0) max_model_len = info->max_model_len;
    }
    if (max_model_len == 0) max_model_len = 4096;
  }

  std::vector<WorkloadRequest> requests;
  if (!workload.empty()) {
    bool by_duration = duration > 0 && !flags.IsSet("num-requests");
    StatusOr<std::vector<WorkloadRequest>> made =
        SyntheticRequests(workload, options.concurrency > 0 ? 0 : rate,
                          by_duration ? 0 : num_requests, duration, options.seed, max_model_len);
    if (!made.ok()) return UsageError("--workload: " + made.status().message());
    requests = std::move(*made);
  } else {
    StatusOr<std::vector<WorkloadRequest>> loaded = LoadTrace(trace);
    if (!loaded.ok()) {
      std::fprintf(stderr, "tandem bench: --trace: %s\n", loaded.status().message().c_str());
      return kExitFailure;
    }
    requests = std::move(*loaded);
    if (flags.IsSet("num-requests") && static_cast<long>(requests.size()) > num_requests)
      requests.resize(static_cast<size_t>(num_requests));
    if (flags.IsSet("rate")) RedrawArrivals(&requests, rate, options.seed);
  }
  if (requests.empty()) {
    std::fprintf(stderr, "tandem bench: the workload has no requests\n");
    return kExitFailure;
  }

  const bool quiet = flags.GetBool("quiet");
  if (!quiet) {
    std::string mode = options.concurrency > 0
                           ? "concurrency " + std::to_string(options.concurrency)
                           : (flags.IsSet("rate") ? "rate " + Num(rate) + " req/s"
                                                  : std::string("trace arrivals"));
    std::string count = std::to_string(requests.size()) + " requests";
    if (duration > 0) count = "up to " + count + " in " + Num(duration) + " s";
    std::printf("tandem bench: %s, %s, %s, model %s (max_model_len %d), %s\n",
                workload.empty() ? trace.c_str() : workload.c_str(), count.c_str(), mode.c_str(),
                options.model.c_str(), max_model_len, flags.GetString("url").c_str());
    std::fflush(stdout);
  }
  const std::string started_at = UtcTimestamp();
  StatusOr<LoadResult> result = RunLoad(options, requests);
  if (!result.ok()) {
    std::fprintf(stderr, "tandem bench: %s\n", result.status().message().c_str());
    return kExitFailure;
  }
  Slo slo{slo_ttft, slo_tpot};
  RunSummary summary = Summarize(result->outcomes, slo, result->duration_s);
  if (!quiet) {
    std::printf("\n%s", FormatSummaryTable(summary).c_str());
    std::printf("SLO: TTFT <= %g s, TPOT <= %g s\n", slo_ttft, slo_tpot);
  }

  if (const std::string& out = flags.GetString("out"); !out.empty()) {
    nlohmann::json config = {{"url", flags.GetString("url")},
                             {"model", options.model},
                             {"max_model_len", max_model_len},
                             {"workload", workload},
                             {"trace", trace},
                             {"seed", seed},
                             {"num_requests", requests.size()},
                             {"rate", flags.IsSet("rate") ? rate : 0.0},
                             {"concurrency", options.concurrency},
                             {"duration_s", duration},
                             {"slo_ttft_s", slo_ttft},
                             {"slo_tpot_s", slo_tpot},
                             {"request_timeout_s", timeout},
                             {"started_at", started_at}};
    nlohmann::json record = {{"config", config},
                             {"summary", SummaryToJson(summary)},
                             {"requests", OutcomesToJson(result->outcomes, result->max_tokens)}};
    if (Status s = WriteTextFile(out, record.dump(1) + "\n"); !s.ok()) {
      std::fprintf(stderr, "tandem bench: --out: %s\n", s.message().c_str());
      return kExitFailure;
    }
  }
  // Say why when nothing worked: the first error is usually the whole story.
  if (summary.completed == 0) {
    std::fprintf(stderr, "tandem bench: no request completed (first error: %s)\n",
                 result->outcomes.empty() ? "none sent" : result->outcomes[0].error.c_str());
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace tandem
