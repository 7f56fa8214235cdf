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

int SimulateMain(const std::vector<std::string>& args) {
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
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "tandem simulate: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (!(flags.GetDouble("decode-time-scale") > 0)) {
    std::fprintf(stderr, "tandem simulate: --decode-time-scale must be > 0, got %g\n",
                 flags.GetDouble("decode-time-scale"));
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (flags.GetString("latency-model").empty()) {
    std::fprintf(stderr, "tandem simulate: --latency-model is required\n");
    return kExitUsage;
  }
  StatusOr<ClusterConfig> config =
      flags.IsSet("config") ? LoadConfig(flags.GetString("config"), flags.config_overrides())
                            : ParseConfig("", "<defaults>", flags.config_overrides());
  if (!config.ok()) {
    std::fprintf(stderr, "tandem simulate: %s\n", config.status().message().c_str());
    return kExitFailure;
  }
  StatusOr<LatencyModelFile> models = LoadLatencyModel(flags.GetString("latency-model"));
  if (!models.ok()) {
    std::fprintf(stderr, "tandem simulate: %s\n", models.status().message().c_str());
    return kExitFailure;
  }
  std::vector<WorkloadRequest> requests;
  std::string what;
  if (!flags.GetString("trace").empty()) {
    StatusOr<std::vector<WorkloadRequest>> trace = LoadTrace(flags.GetString("trace"));
    if (!trace.ok()) {
      std::fprintf(stderr, "tandem simulate: %s\n", trace.status().message().c_str());
      return kExitFailure;
    }
    requests = std::move(*trace);
    what = "trace " + flags.GetString("trace");
  } else {
    StatusOr<WorkloadShape> shape = WorkloadShapeByName(flags.GetString("workload"));
    if (!shape.ok()) {
      std::fprintf(stderr, "tandem simulate: %s\n", shape.status().message().c_str());
      return kExitUsage;
    }
    WorkloadOptions wo;
    wo.rate = flags.GetDouble("rate");
    wo.num_requests = flags.GetInt("num-requests");
    wo.seed = static_cast<uint64_t>(flags.GetInt("seed"));
    wo.max_model_len = flags.GetInt("max-model-len") > 0
                           ? static_cast<int32_t>(flags.GetInt("max-model-len"))
                           : config->model.max_model_len;
    requests = GenerateWorkload(*shape, wo);
    what = shape->name + " at " + Fmt("%g", wo.rate) + " req/s";
  }
  SimulationOptions options;
  options.router_overhead_s = flags.GetDouble("router-overhead-s");
  options.load_report_interval_s = flags.GetDouble("load-report-interval-s");
  options.reports_after_steps = !flags.GetBool("reports-at-once");
  options.decode_time_scale = flags.GetDouble("decode-time-scale");
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<SimulationResult> result = Simulate(*config, *models, requests, options);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!result.ok()) {
    std::fprintf(stderr, "tandem simulate: %s\n", result.status().message().c_str());
    return kExitFailure;
  }
  Slo slo{config->slo.ttft_s, config->slo.tpot_s};
  RunSummary summary = Summarize(result->outcomes, slo);
  std::printf(
      "simulated %zu requests (%s) on %d prefill + %d decode + %d colocated instances "
      "in %.3f s\n",
      requests.size(), what.c_str(), config->prefill.instances, config->decode.instances,
      config->colocated.instances, wall);
  std::fputs(FormatRunSummary(summary, slo).c_str(), stdout);
  if (!flags.GetString("out").empty()) {
    nlohmann::json j;
    j["summary"] = SummaryToJson(summary);
    j["summary"]["slo_ttft_s"] = slo.ttft_s;
    j["summary"]["slo_tpot_s"] = slo.tpot_s;
    j["requests"] = OutcomesToJson(result->outcomes);
    std::ofstream out(flags.GetString("out"));
    out << j.dump(1) << "\n";
    if (!out) {
      std::fprintf(stderr, "tandem simulate: cannot write %s\n", flags.GetString("out").c_str());
      return kExitFailure;
    }
  }
  return kExitOk;
}

}  // namespace tandem
