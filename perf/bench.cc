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

// What the flags ask for, checked.
struct BenchOptions {
  bool help = false;  // --help: the help text is printed, nothing runs
  std::string help_text;
  std::string url_text;
  std::string workload, trace;  // exactly one is set
  bool rate_set = false;
  double rate = 0;
  long concurrency = 0;
  bool num_requests_set = false;
  long num_requests = 100;
  double duration_s = 0;
  double slo_ttft = 0, slo_tpot = 0;
  long max_model_len = 0;  // 0 = from /v1/models
  long seed = 1;
  std::string out;
  bool quiet = false;
  LoadOptions load;  // url, model, concurrency, timeouts, seed, token ids, progress
};

FlagParser BenchFlags() {
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
  return flags;
}

// InvalidArgument for a bad flag (the exit code is kExitUsage).
StatusOr<BenchOptions> ParseBenchArgs(const std::vector<std::string>& args) {
  FlagParser flags = BenchFlags();
  TANDEM_RETURN_IF_ERROR(flags.Parse(args));
  BenchOptions o;
  if (flags.help_requested()) {
    o.help = true;
    o.help_text = flags.Help() + WorkloadHelp();
    return o;
  }
  if (!flags.positional().empty())
    return InvalidArgument("unexpected argument '" + flags.positional()[0] + "'");
  o.url_text = flags.GetString("url");
  o.workload = flags.GetString("workload");
  o.trace = flags.GetString("trace");
  o.rate_set = flags.IsSet("rate");
  o.rate = flags.GetDouble("rate");
  o.duration_s = flags.GetDouble("duration-s");
  o.concurrency = flags.GetInt("concurrency");
  o.num_requests_set = flags.IsSet("num-requests");
  o.num_requests = flags.GetInt("num-requests");
  o.slo_ttft = flags.GetDouble("slo-ttft");
  o.slo_tpot = flags.GetDouble("slo-tpot");
  const double timeout = flags.GetDouble("request-timeout-s");
  o.max_model_len = flags.GetInt("max-model-len");
  const long max_token_id = flags.GetInt("max-token-id");
  o.seed = flags.GetInt("seed");
  o.out = flags.GetString("out");
  o.quiet = flags.GetBool("quiet");

  if (o.workload.empty() == o.trace.empty())
    return InvalidArgument("--workload: give exactly one of --workload and --trace");
  if (!o.workload.empty()) {
    if (StatusOr<WorkloadShape> shape = WorkloadShapeByName(o.workload); !shape.ok())
      return InvalidArgument("--workload: " + shape.status().message());
  }
  if (o.rate_set && !(o.rate > 0 && std::isfinite(o.rate)))
    return InvalidArgument("--rate: must be > 0 requests/s, got " + Num(o.rate));
  if (flags.IsSet("concurrency") && o.concurrency < 1)
    return InvalidArgument("--concurrency: must be >= 1, got " + std::to_string(o.concurrency));
  if (o.rate_set && flags.IsSet("concurrency"))
    return InvalidArgument("--rate: give only one of --rate and --concurrency");
  if (!o.rate_set && !flags.IsSet("concurrency") && o.trace.empty())
    return InvalidArgument("--rate: one of --rate and --concurrency is required");
  if (o.num_requests < 1)
    return InvalidArgument("--num-requests: must be >= 1, got " + std::to_string(o.num_requests));
  if (!(o.duration_s >= 0 && std::isfinite(o.duration_s)))
    return InvalidArgument("--duration-s: must be >= 0, got " + Num(o.duration_s));
  if (!flags.IsSet("slo-ttft") || !(o.slo_ttft >= 0))
    return InvalidArgument("--slo-ttft: required, seconds >= 0");
  if (!flags.IsSet("slo-tpot") || !(o.slo_tpot >= 0))
    return InvalidArgument("--slo-tpot: required, seconds >= 0");
  if (!(timeout > 0))
    return InvalidArgument("--request-timeout-s: must be > 0, got " + Num(timeout));
  if (o.max_model_len < 0 || o.max_model_len > (1 << 24))
    return InvalidArgument("--max-model-len: must be in [0, 16777216], got " +
                           std::to_string(o.max_model_len));
  if (max_token_id < 101 || max_token_id > (1L << 30))
    return InvalidArgument("--max-token-id: must be > 100, got " + std::to_string(max_token_id));
  if (o.seed < 0) return InvalidArgument("--seed: must be >= 0, got " + std::to_string(o.seed));
  StatusOr<ServerUrl> url = ParseServerUrl(o.url_text);
  if (!url.ok()) return InvalidArgument("--url: " + url.status().message());

  o.load.url = *url;
  o.load.model = flags.GetString("model");
  o.load.concurrency = static_cast<int>(o.concurrency);
  o.load.duration_s = o.duration_s;
  o.load.request_timeout_s = timeout;
  o.load.seed = static_cast<uint64_t>(o.seed);
  o.load.max_token_id = static_cast<int32_t>(max_token_id);
  o.load.progress = !o.quiet && ::isatty(STDERR_FILENO);
  return o;
}

// The model name and length budget: the flags', else what GET /v1/models says (else 4096).
// Unavailable when the server cannot say and --model is not given.
StatusOr<int32_t> ResolveModel(BenchOptions* o) {
  int32_t max_model_len = static_cast<int32_t>(o->max_model_len);
  if (!o->load.model.empty() && max_model_len != 0) return max_model_len;
  StatusOr<ServedModelInfo> info =
      FetchModelInfo(o->load.url, std::min(o->load.request_timeout_s, 30.0));
  if (!info.ok()) {
    if (o->load.model.empty()) return Unavailable(info.status().message() + " (or pass --model)");
  } else {
    if (o->load.model.empty()) o->load.model = info->name;
    if (max_model_len == 0) max_model_len = info->max_model_len;
  }
  if (max_model_len == 0) max_model_len = 4096;
  return max_model_len;
}

// The run's requests: the synthetic workload (InvalidArgument: a usage error) or the trace
// (FailedPrecondition when it does not load or holds none).
StatusOr<std::vector<WorkloadRequest>> MakeRequests(const BenchOptions& o, int32_t max_model_len) {
  std::vector<WorkloadRequest> requests;
  if (!o.workload.empty()) {
    const bool by_duration = o.duration_s > 0 && !o.num_requests_set;
    StatusOr<std::vector<WorkloadRequest>> made = SyntheticRequests(
        o.workload, o.load.concurrency > 0 ? 0 : o.rate, by_duration ? 0 : o.num_requests,
        o.duration_s, o.load.seed, max_model_len);
    if (!made.ok()) return InvalidArgument("--workload: " + made.status().message());
    requests = std::move(*made);
  } else {
    StatusOr<std::vector<WorkloadRequest>> loaded = LoadTrace(o.trace);
    if (!loaded.ok()) return FailedPrecondition("--trace: " + loaded.status().message());
    requests = std::move(*loaded);
    if (o.num_requests_set && static_cast<long>(requests.size()) > o.num_requests)
      requests.resize(static_cast<size_t>(o.num_requests));
    if (o.rate_set) RedrawArrivals(&requests, o.rate, o.load.seed);
  }
  if (requests.empty()) return FailedPrecondition("the workload has no requests");
  return requests;
}

void PrintRunHeader(const BenchOptions& o, size_t num_requests, int32_t max_model_len) {
  std::string mode = o.load.concurrency > 0 ? "concurrency " + std::to_string(o.load.concurrency)
                                            : (o.rate_set ? "rate " + Num(o.rate) + " req/s"
                                                          : std::string("trace arrivals"));
  std::string count = std::to_string(num_requests) + " requests";
  if (o.duration_s > 0) count = "up to " + count + " in " + Num(o.duration_s) + " s";
  std::printf("tandem bench: %s, %s, %s, model %s (max_model_len %d), %s\n",
              o.workload.empty() ? o.trace.c_str() : o.workload.c_str(), count.c_str(),
              mode.c_str(), o.load.model.c_str(), max_model_len, o.url_text.c_str());
  std::fflush(stdout);
}

// The table, the --out file and the exit code: 0 when some request completed.
int ReportBench(const BenchOptions& o, int32_t max_model_len, size_t num_requests,
                const std::string& started_at, const LoadResult& result) {
  Slo slo{o.slo_ttft, o.slo_tpot};
  RunSummary summary = Summarize(result.outcomes, slo, result.duration_s);
  if (!o.quiet) {
    std::printf("\n%s", FormatSummaryTable(summary).c_str());
    std::printf("SLO: TTFT <= %g s, TPOT <= %g s\n", o.slo_ttft, o.slo_tpot);
  }
  if (!o.out.empty()) {
    nlohmann::json config = {{"url", o.url_text},
                             {"model", o.load.model},
                             {"max_model_len", max_model_len},
                             {"workload", o.workload},
                             {"trace", o.trace},
                             {"seed", o.seed},
                             {"num_requests", num_requests},
                             {"rate", o.rate_set ? o.rate : 0.0},
                             {"concurrency", o.load.concurrency},
                             {"duration_s", o.duration_s},
                             {"slo_ttft_s", o.slo_ttft},
                             {"slo_tpot_s", o.slo_tpot},
                             {"request_timeout_s", o.load.request_timeout_s},
                             {"started_at", started_at}};
    nlohmann::json record = {{"config", config},
                             {"summary", SummaryToJson(summary)},
                             {"requests", OutcomesToJson(result.outcomes, result.max_tokens)}};
    if (Status s = WriteTextFile(o.out, record.dump(1) + "\n"); !s.ok()) {
      std::fprintf(stderr, "tandem bench: --out: %s\n", s.message().c_str());
      return kExitFailure;
    }
  }
  // Say why when nothing worked: the first error is usually the whole story.
  if (summary.completed == 0) {
    std::fprintf(stderr, "tandem bench: no request completed (first error: %s)\n",
                 result.outcomes.empty() ? "none sent" : result.outcomes[0].error.c_str());
    return kExitFailure;
  }
  return kExitOk;
}

int Fail(const Status& status) {
  std::fprintf(stderr, "tandem bench: %s\n", status.message().c_str());
  return kExitFailure;
}

}  // namespace

int BenchMain(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "sweep")
    return SweepMain(std::vector<std::string>(args.begin() + 1, args.end()));
  StatusOr<BenchOptions> options = ParseBenchArgs(args);
  if (!options.ok()) return UsageError(options.status().message());
  if (options->help) {
    std::fputs(options->help_text.c_str(), stdout);
    return kExitOk;
  }
  StatusOr<int32_t> max_model_len = ResolveModel(&*options);
  if (!max_model_len.ok()) return Fail(max_model_len.status());
  StatusOr<std::vector<WorkloadRequest>> requests = MakeRequests(*options, *max_model_len);
  if (!requests.ok()) {
    if (requests.status().code() == StatusCode::kInvalidArgument)
      return UsageError(requests.status().message());
    return Fail(requests.status());
  }
  if (!options->quiet) PrintRunHeader(*options, requests->size(), *max_model_len);
  const std::string started_at = UtcTimestamp();
  StatusOr<LoadResult> result = RunLoad(options->load, *requests);
  if (!result.ok()) return Fail(result.status());
  return ReportBench(*options, *max_model_len, requests->size(), started_at, *result);
}

}  // namespace tandem
