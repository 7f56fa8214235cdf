// `tandem simulate`: FormatRunSummary and SimulateMain (cluster/simulator.h).

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cluster/simulator.h"
#include "common/base/flags.h"

namespace tandem {
namespace {

std::string Fmt(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

}  // namespace

std::string FormatRunSummary(const RunSummary& s, const Slo& slo) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "requests %lld  completed %lld  rejected %lld  failed %lld  duration %.2f s\n",
                static_cast<long long>(s.requests), static_cast<long long>(s.completed),
                static_cast<long long>(s.rejected), static_cast<long long>(s.failed), s.duration_s);
  out += line;
  std::snprintf(line, sizeof line, "throughput %.3f req/s  %.1f output tokens/s\n",
                s.throughput_rps, s.output_tokens_per_s);
  out += line;
  std::snprintf(line, sizeof line, "%-10s %10s %10s %10s\n", "latency", "p50", "p90", "p99");
  out += line;
  auto row = [&](const char* name, double a, double b, double c) {
    std::snprintf(line, sizeof line, "%-10s %10.4f %10.4f %10.4f\n", name, a, b, c);
    out += line;
  };
  row("ttft_s", s.ttft_p50, s.ttft_p90, s.ttft_p99);
  row("tpot_s", s.tpot_p50, s.tpot_p90, s.tpot_p99);
  row("e2e_s", s.e2e_p50, s.e2e_p90, s.e2e_p99);
  std::snprintf(line, sizeof line,
                "SLO ttft %.3f s, tpot %.3f s: attainment %.1f%% (ttft %.1f%%, tpot %.1f%%)\n",
                slo.ttft_s, slo.tpot_s, 100 * s.attainment, 100 * s.ttft_attainment,
                100 * s.tpot_attainment);
  out += line;
  return out;
}

namespace {

// What the flags ask for: the cluster, its latency model, the requests and the options.
struct SimulateCommand {
  bool help = false;  // --help: the help text is printed, nothing runs
  std::string help_text;
  ClusterConfig config;
  LatencyModelFile models;
  std::vector<WorkloadRequest> requests;
  std::string what;  // "trace FILE" or "WORKLOAD at R req/s"
  SimulationOptions options;
  std::string out;  // --out, empty = none
};

FlagParser SimulateFlags() {
  FlagParser flags(
      "tandem simulate --config CLUSTER.yaml --latency-model LM.yaml (--workload NAME --rate R "
      "--num-requests N --seed S | --trace FILE.jsonl) [--out FILE.json]",
      "Simulates the cluster (router placement, prefill/decode/colocated scheduling) on a "
      "workload with step times from a latency model; prints the run summary and writes "
      "per-request outcomes.");
  flags.AddString("config", "", "cluster YAML (absent: defaults)");
  flags.AddString("latency-model", "", "latency model YAML (tandem profile, cluster/gpu/*.yaml)");
  flags.AddString("workload", "chatbot", WorkloadNameList() + " (ignored with --trace)");
  flags.AddDouble("rate", 1.0, "requests/s, Poisson (<= 0: all at t = 0)");
  flags.AddInt("num-requests", 100, "requests to generate");
  flags.AddInt("seed", 1, "workload seed");
  flags.AddInt("max-model-len", 0, "length budget of generated requests (0: model.max_model_len)");
  flags.AddString("trace", "", "JSON Lines trace instead of a synthetic workload");
  flags.AddString("out", "", "write {\"summary\", \"requests\"} JSON here");
  flags.AddDouble("router-overhead-s", 0.0, "added to every TTFT");
  flags.AddDouble("load-report-interval-s", 0.1,
                  "instances report load this often (0: the router sees the exact state)");
  flags.AddBool("reports-at-once",
                "instances publish every change at once (default: after each step, from the "
                "state they knew when it began, as the servers' engine loops do)");
  flags.AddDouble("decode-time-scale", 1.0,
                  "decode runs at this multiple of the latency model's time, prefill as modelled "
                  "(a machine that decodes faster or slower than its profile; the router keeps "
                  "the unscaled model)");
  flags.AllowConfigOverrides();
  return flags;
}

// The trace, or the synthetic workload the flags describe. InvalidArgument for an unknown
// workload (a usage error).
Status LoadRequests(const FlagParser& flags, SimulateCommand* c) {
  if (!flags.GetString("trace").empty()) {
    TANDEM_ASSIGN_OR_RETURN(c->requests, LoadTrace(flags.GetString("trace")));
    c->what = "trace " + flags.GetString("trace");
    return Status::Ok();
  }
  StatusOr<WorkloadShape> shape = WorkloadShapeByName(flags.GetString("workload"));
  if (!shape.ok()) return InvalidArgument(shape.status().message());
  WorkloadOptions wo;
  wo.rate = flags.GetDouble("rate");
  wo.num_requests = flags.GetInt("num-requests");
  wo.seed = static_cast<uint64_t>(flags.GetInt("seed"));
  wo.max_model_len = flags.GetInt("max-model-len") > 0
                         ? static_cast<int32_t>(flags.GetInt("max-model-len"))
                         : c->config.model.max_model_len;
  c->requests = GenerateWorkload(*shape, wo);
  c->what = shape->name + " at " + Fmt("%g", wo.rate) + " req/s";
  return Status::Ok();
}

// InvalidArgument for a usage error (kExitUsage); any other error is a failure (kExitFailure).
StatusOr<SimulateCommand> ParseSimulateArgs(const std::vector<std::string>& args) {
  FlagParser flags = SimulateFlags();
  if (Status s = flags.Parse(args); !s.ok()) return InvalidArgument(s.message());
  if (!(flags.GetDouble("decode-time-scale") > 0))
    return InvalidArgument("--decode-time-scale must be > 0, got " +
                           Fmt("%g", flags.GetDouble("decode-time-scale")));
  SimulateCommand c;
  if (flags.help_requested()) {
    c.help = true;
    c.help_text = flags.Help();
    return c;
  }
  if (flags.GetString("latency-model").empty())
    return InvalidArgument("--latency-model is required");
  StatusOr<ClusterConfig> config =
      flags.IsSet("config") ? LoadConfig(flags.GetString("config"), flags.config_overrides())
                            : ParseConfig("", "<defaults>", flags.config_overrides());
  if (!config.ok()) return FailedPrecondition(config.status().message());
  c.config = std::move(*config);
  StatusOr<LatencyModelFile> models = LoadLatencyModel(flags.GetString("latency-model"));
  if (!models.ok()) return FailedPrecondition(models.status().message());
  c.models = std::move(*models);
  if (Status s = LoadRequests(flags, &c); !s.ok()) {
    if (s.code() == StatusCode::kInvalidArgument) return s;
    return FailedPrecondition(s.message());
  }
  c.options.router_overhead_s = flags.GetDouble("router-overhead-s");
  c.options.load_report_interval_s = flags.GetDouble("load-report-interval-s");
  c.options.reports_after_steps = !flags.GetBool("reports-at-once");
  c.options.decode_time_scale = flags.GetDouble("decode-time-scale");
  c.out = flags.GetString("out");
  return c;
}

// The summary table, and --out's {"summary", "requests"}.
Status ReportSimulation(const SimulateCommand& c, const SimulationResult& result, double wall_s) {
  Slo slo{c.config.slo.ttft_s, c.config.slo.tpot_s};
  RunSummary summary = Summarize(result.outcomes, slo);
  std::printf(
      "simulated %zu requests (%s) on %d prefill + %d decode + %d colocated instances "
      "in %.3f s\n",
      c.requests.size(), c.what.c_str(), c.config.prefill.instances, c.config.decode.instances,
      c.config.colocated.instances, wall_s);
  std::fputs(FormatRunSummary(summary, slo).c_str(), stdout);
  if (c.out.empty()) return Status::Ok();
  nlohmann::json j;
  j["summary"] = SummaryToJson(summary);
  j["summary"]["slo_ttft_s"] = slo.ttft_s;
  j["summary"]["slo_tpot_s"] = slo.tpot_s;
  j["requests"] = OutcomesToJson(result.outcomes);
  std::ofstream out(c.out);
  out << j.dump(1) << "\n";
  if (!out) return Internal("cannot write " + c.out);
  return Status::Ok();
}

}  // namespace

int SimulateMain(const std::vector<std::string>& args) {
  StatusOr<SimulateCommand> command = ParseSimulateArgs(args);
  if (!command.ok()) {
    std::fprintf(stderr, "tandem simulate: %s\n", command.status().message().c_str());
    return command.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
  }
  if (command->help) {
    std::fputs(command->help_text.c_str(), stdout);
    return kExitOk;
  }
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<SimulationResult> result =
      Simulate(command->config, command->models, command->requests, command->options);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!result.ok()) {
    std::fprintf(stderr, "tandem simulate: %s\n", result.status().message().c_str());
    return kExitFailure;
  }
  if (Status s = ReportSimulation(*command, *result, wall); !s.ok()) {
    std::fprintf(stderr, "tandem simulate: %s\n", s.message().c_str());
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace tandem
