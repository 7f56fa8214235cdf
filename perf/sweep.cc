#include "perf/sweep.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "common/base/flags.h"
#include "perf/sweep_internal.h"

// `tandem bench sweep` is parse (this file) -> run (sweep_run.cc) -> report (sweep_report.cc);
// perf/sweep_internal.h has the structs between them.

namespace tandem {
namespace sweep {
namespace {

namespace fs = std::filesystem;

// Removes every "--name V" / "--name=V" from args and returns the values in order (FlagParser
// keeps only the last value of a repeated flag).
StatusOr<std::vector<std::string>> TakeRepeated(std::vector<std::string>* args,
                                                const std::string& name) {
  std::vector<std::string> values, rest;
  const std::string flag = "--" + name;
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& arg = (*args)[i];
    if (arg == flag) {
      if (i + 1 >= args->size()) return InvalidArgument("flag " + flag + " needs a value");
      values.push_back((*args)[++i]);
    } else if (arg.rfind(flag + "=", 0) == 0) {
      values.push_back(arg.substr(flag.size() + 1));
    } else {
      rest.push_back(arg);
    }
  }
  *args = std::move(rest);
  return values;
}

std::vector<std::string> SplitComma(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

bool ParsePositive(const std::string& text, double* value) {
  char* end = nullptr;
  *value = std::strtod(text.c_str(), &end);
  return end != text.c_str() && *end == '\0' && std::isfinite(*value) && *value > 0;
}

bool SafeName(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

// The flags' FlagParser, with its help text.
FlagParser SweepFlags() {
  FlagParser flags(
      "tandem bench sweep --cluster NAME=CONFIG.yaml [--cluster ...] --workload W[,W2] "
      "--slo-ttft X --slo-tpot Y [flags]",
      "Starts each cluster (tandem up), raises the request rate until SLO attainment drops "
      "below the target, and reports goodput per cluster and per core, with plots.\n"
      "  --cluster NAME=CONFIG.yaml   a cluster to measure (repeat; the first is the baseline)\n"
      "  --cores-per NAME=K           cores of that cluster (default: sum of instances*threads)");
  flags.AddString("workload", "", "comma-separated workloads: " + WorkloadNameList());
  flags.AddDouble("slo-ttft", -1, "TTFT objective in seconds (0: not checked)");
  flags.AddDouble("slo-tpot", -1, "TPOT objective in seconds (0: not checked)");
  flags.AddString("rates", "0.25,0.5,1,2,4,8", "comma-separated request rates (req/s)");
  flags.AddInt("num-requests", 0, "requests per rate (default 100 unless --duration-s)");
  flags.AddDouble("duration-s", 0, "seconds of arrivals per rate instead of --num-requests");
  flags.AddDouble("target", 0.9, "SLO attainment target in (0, 1]");
  flags.AddInt("probe-down", 0,
               "when a cluster misses the target at the lowest rate, halve the rate up to this "
               "many times until it meets it (0: stop there, goodput 0)");
  flags.AddString("latency-model", "", "latency model YAML: simulate every run beside it");
  flags.AddString("out-dir", "sweep", "where the runs, sweep.json and the plots go");
  flags.AddString("binary", "/proc/self/exe", "the tandem binary that runs `up`");
  flags.AddInt("seed", 1, "workload seed (the same at every rate and for every cluster)");
  flags.AddDouble("slo-scale-rate", 0,
                  "rate of the SLO-scale plot (default: the highest rate every cluster ran)");
  flags.AddDouble("ready-timeout-s", 600, "wait at most this long for a cluster to be ready");
  flags.AddDouble("stop-timeout-s", 60, "SIGKILL a cluster that has not stopped after this");
  flags.AddDouble("request-timeout-s", 600, "per request, connect to the end of the stream");
  flags.AddInt("max-token-id", 1000, "synthetic prompt ids are below this (and >= 100)");
  flags.AddInt("max-model-len", 0,
               "scale of the workload lengths (cluster/workload.h); 0 = each config's "
               "model.max_model_len");
  return flags;
}

// --cluster NAME=CONFIG.yaml values and --cores-per NAME=K values (cores are filled in when the
// configs load).
Status ParseClusters(const std::vector<std::string>& cluster_flags,
                     const std::vector<std::string>& cores_flags, SweepOptions* options,
                     std::map<std::string, int>* cores_per) {
  if (cluster_flags.empty()) return InvalidArgument("--cluster: at least one NAME=CONFIG.yaml");
  for (const std::string& value : cluster_flags) {
    size_t eq = value.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == value.size())
      return InvalidArgument("--cluster: expected NAME=CONFIG.yaml, got '" + value + "'");
    ClusterSpec spec;
    spec.name = value.substr(0, eq);
    spec.config_path = fs::absolute(value.substr(eq + 1)).string();
    if (!SafeName(spec.name))
      return InvalidArgument("--cluster: NAME may hold letters, digits, '-', '_', '.', got '" +
                             spec.name + "'");
    for (const ClusterSpec& other : options->clusters)
      if (other.name == spec.name) return InvalidArgument("--cluster: '" + spec.name + "' twice");
    options->clusters.push_back(std::move(spec));
  }
  for (const std::string& value : cores_flags) {
    size_t eq = value.find('=');
    double k = 0;
    if (eq == std::string::npos || !ParsePositive(value.substr(eq + 1), &k) || k != std::floor(k))
      return InvalidArgument("--cores-per: expected NAME=K with K a positive integer, got '" +
                             value + "'");
    std::string name = value.substr(0, eq);
    if (std::none_of(options->clusters.begin(), options->clusters.end(),
                     [&](const ClusterSpec& c) { return c.name == name; }))
      return InvalidArgument("--cores-per: no --cluster named '" + name + "'");
    (*cores_per)[name] = static_cast<int>(k);
  }
  return Status::Ok();
}

// The workloads, rates, SLOs and the size of each run.
Status ParseLoad(const FlagParser& flags, SweepOptions* o) {
  o->workloads = SplitComma(flags.GetString("workload"));
  if (o->workloads.empty())
    return InvalidArgument("--workload: required (" + WorkloadNameList() + ")");
  for (const std::string& w : o->workloads)
    if (StatusOr<WorkloadShape> shape = WorkloadShapeByName(w); !shape.ok())
      return InvalidArgument("--workload: " + shape.status().message());
  for (const std::string& r : SplitComma(flags.GetString("rates"))) {
    double rate = 0;
    if (!ParsePositive(r, &rate))
      return InvalidArgument("--rates: each rate must be a number > 0, got '" + r + "'");
    o->rates.push_back(rate);
  }
  if (o->rates.empty()) return InvalidArgument("--rates: at least one rate");
  o->probe_down = flags.GetInt("probe-down");
  if (o->probe_down < 0 || o->probe_down > 10)
    return InvalidArgument("--probe-down must be in [0, 10]");
  std::sort(o->rates.begin(), o->rates.end());
  o->rates.erase(std::unique(o->rates.begin(), o->rates.end()), o->rates.end());
  o->slo_ttft = flags.GetDouble("slo-ttft");
  o->slo_tpot = flags.GetDouble("slo-tpot");
  if (!flags.IsSet("slo-ttft") || !(o->slo_ttft >= 0))
    return InvalidArgument("--slo-ttft: required, seconds >= 0");
  if (!flags.IsSet("slo-tpot") || !(o->slo_tpot >= 0))
    return InvalidArgument("--slo-tpot: required, seconds >= 0");
  o->target = flags.GetDouble("target");
  if (!(o->target > 0 && o->target <= 1))
    return InvalidArgument("--target: must be in (0, 1], got " + RateLabel(o->target));
  o->num_requests = flags.GetInt("num-requests");
  o->duration_s = flags.GetDouble("duration-s");
  if (o->num_requests < 0)
    return InvalidArgument("--num-requests: must be >= 1, got " + std::to_string(o->num_requests));
  if (!(o->duration_s >= 0 && std::isfinite(o->duration_s)))
    return InvalidArgument("--duration-s: must be >= 0, got " + RateLabel(o->duration_s));
  if (o->num_requests > 0 && o->duration_s > 0)
    return InvalidArgument("--num-requests: give only one of --num-requests and --duration-s");
  if (o->num_requests == 0 && o->duration_s == 0) o->num_requests = 100;
  o->seed = flags.GetInt("seed");
  if (o->seed < 0) return InvalidArgument("--seed: must be >= 0");
  return Status::Ok();
}

// Timeouts, token ids, lengths, the SLO-scale rate and the binary.
Status ParseLimits(const FlagParser& flags, SweepOptions* o) {
  o->ready_timeout_s = flags.GetDouble("ready-timeout-s");
  o->stop_timeout_s = flags.GetDouble("stop-timeout-s");
  o->request_timeout_s = flags.GetDouble("request-timeout-s");
  if (!(o->ready_timeout_s > 0)) return InvalidArgument("--ready-timeout-s: must be > 0");
  if (!(o->stop_timeout_s > 0)) return InvalidArgument("--stop-timeout-s: must be > 0");
  if (!(o->request_timeout_s > 0)) return InvalidArgument("--request-timeout-s: must be > 0");
  o->max_token_id = flags.GetInt("max-token-id");
  if (o->max_token_id < 101 || o->max_token_id > (1L << 30))
    return InvalidArgument("--max-token-id: must be > 100");
  o->workload_len = flags.GetInt("max-model-len");
  if (o->workload_len < 0 || o->workload_len > (1L << 24))
    return InvalidArgument("--max-model-len: must be >= 0");
  if (flags.IsSet("slo-scale-rate")) {
    const double rate = flags.GetDouble("slo-scale-rate");
    if (std::find(o->rates.begin(), o->rates.end(), rate) == o->rates.end())
      return InvalidArgument("--slo-scale-rate: must be one of --rates, got " + RateLabel(rate));
    o->slo_scale_rate = rate;
  }
  o->binary = flags.GetString("binary");
  if (o->binary == "/proc/self/exe") {
    std::error_code ec;
    fs::path self = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) o->binary = self.string();
  }
  if (::access(o->binary.c_str(), X_OK) != 0)
    return InvalidArgument("--binary: '" + o->binary + "' is not an executable");
  // "Not checked" (0) becomes an objective nothing misses (the config needs one).
  o->router_ttft = o->slo_ttft > 0 ? o->slo_ttft : 3600;
  o->router_tpot = o->slo_tpot > 0 ? o->slo_tpot : 3600;
  o->latency_model_path = flags.GetString("latency-model");
  o->out_dir = flags.GetString("out-dir");
  return Status::Ok();
}

// The configs and the latency model, all checked before anything starts; the output folder.
// FailedPrecondition naming every input that did not load, one per line.
Status LoadInputs(const std::map<std::string, int>& cores_per, SweepOptions* o) {
  std::string errors;
  auto fail = [&](const std::string& message) { errors += (errors.empty() ? "" : "\n") + message; };
  for (ClusterSpec& spec : o->clusters) {
    StatusOr<ClusterConfig> config = LoadConfig(spec.config_path);
    if (!config.ok()) {
      fail("--cluster " + spec.name + ": " + config.status().message());
      continue;
    }
    spec.config = *config;
    // The router admits and places by the sweep's SLOs (the simulator too), not the config's.
    spec.config.slo.ttft_s = o->router_ttft;
    spec.config.slo.tpot_s = o->router_tpot;
    spec.config.slo.classes.clear();
    if (o->workload_len > 0 && o->workload_len > spec.config.model.max_model_len)
      fail("--max-model-len " + std::to_string(o->workload_len) + " exceeds " + spec.name +
           "'s model.max_model_len " + std::to_string(spec.config.model.max_model_len));
    int cores = 0;
    for (const InstanceSection* s : {&config->prefill, &config->decode, &config->colocated})
      cores += s->instances * s->threads;
    auto it = cores_per.find(spec.name);
    spec.cores = it != cores_per.end() ? it->second : cores;
  }
  if (!errors.empty()) return FailedPrecondition(errors);
  if (!o->latency_model_path.empty()) {
    StatusOr<LatencyModelFile> loaded = LoadLatencyModel(o->latency_model_path);
    if (!loaded.ok()) return FailedPrecondition("--latency-model: " + loaded.status().message());
    o->latency_model = std::move(*loaded);
  }
  std::error_code ec;
  fs::create_directories(o->out_dir, ec);
  if (ec) return FailedPrecondition("--out-dir: cannot create " + o->out_dir + ": " + ec.message());
  // Every cluster runs with the sweep's SLOs (router admission and the goodput policy use
  // them) and, with --latency-model, with that model in its router: what is simulated is what
  // runs.
  o->cluster_overrides = {"--slo.ttft_s=" + FormatNumber(o->router_ttft),
                          "--slo.tpot_s=" + FormatNumber(o->router_tpot)};
  if (o->latency_model) {
    const std::string path = fs::absolute(o->latency_model_path).string();
    o->cluster_overrides.push_back("--router.latency_model=" + path);
    for (ClusterSpec& spec : o->clusters) spec.config.router.latency_model = path;  // simulated too
  }
  return Status::Ok();
}

}  // namespace

std::string SweepOptions::PathIn(const std::string& file) const {
  return (fs::path(out_dir) / file).string();
}

StatusOr<SweepOptions> ParseSweepArgs(const std::vector<std::string>& input_args) {
  std::vector<std::string> args = input_args;
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> cluster_flags, TakeRepeated(&args, "cluster"));
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> cores_flags, TakeRepeated(&args, "cores-per"));
  FlagParser flags = SweepFlags();
  if (Status s = flags.Parse(args); !s.ok()) return InvalidArgument(s.message());
  SweepOptions options;
  if (flags.help_requested()) {
    options.help = true;
    options.help_text = flags.Help();
    return options;
  }
  if (!flags.positional().empty())
    return InvalidArgument("unexpected argument '" + flags.positional()[0] + "'");
  std::map<std::string, int> cores_per;
  TANDEM_RETURN_IF_ERROR(ParseClusters(cluster_flags, cores_flags, &options, &cores_per));
  TANDEM_RETURN_IF_ERROR(ParseLoad(flags, &options));
  TANDEM_RETURN_IF_ERROR(ParseLimits(flags, &options));
  TANDEM_RETURN_IF_ERROR(LoadInputs(cores_per, &options));
  return options;
}

}  // namespace sweep

int SweepMain(const std::vector<std::string>& args) {
  StatusOr<sweep::SweepOptions> options = sweep::ParseSweepArgs(args);
  if (!options.ok()) {
    const std::string& message = options.status().message();
    if (options.status().code() == StatusCode::kInvalidArgument) {
      std::fprintf(stderr, "tandem bench sweep: %s (see tandem bench sweep --help)\n",
                   message.c_str());
      return kExitUsage;
    }
    std::istringstream lines(message);
    for (std::string line; std::getline(lines, line);)
      std::fprintf(stderr, "tandem bench sweep: %s\n", line.c_str());
    return kExitFailure;
  }
  if (options->help) {
    std::fputs(options->help_text.c_str(), stdout);
    return kExitOk;
  }
  sweep::SweepResult result = sweep::RunSweep(*options);
  const bool reported = sweep::ReportSweep(*options, result);
  return result.all_ran && reported ? kExitOk : kExitFailure;
}

GoodputEstimate EstimateGoodput(const std::vector<double>& rates,
                                const std::vector<double>& attainments, double target) {
  GoodputEstimate e;
  const size_t n = std::min(rates.size(), attainments.size());
  e.lower_bound = n > 0;
  for (size_t i = 0; i < n; ++i) {
    if (attainments[i] >= target) {
      e.goodput = rates[i];
      e.crossing = rates[i];
      continue;
    }
    e.lower_bound = false;
    if (i > 0) {
      // Linear between the last passing point and this one.
      double a0 = attainments[i - 1], a1 = attainments[i];
      double r0 = rates[i - 1], r1 = rates[i];
      e.crossing = a0 > a1 ? r0 + (a0 - target) * (r1 - r0) / (a0 - a1) : r0;
    }
    break;
  }
  return e;
}
}  // namespace tandem
