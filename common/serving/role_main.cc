#include "common/serving/role_main.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include "common/base/flags.h"
#include "common/config/serving_config.h"
#include "common/base/log.h"

namespace tandem {

ControlOptions MakeControlOptions(const ControlSection& control, std::string secret) {
  ControlOptions options;
  options.secret = std::move(secret);
  options.handshake_timeout_s = control.handshake_timeout_s;
  options.max_connections = control.max_connections;
  return options;
}

namespace {

void ApplyLogging(const ClusterConfig& config) {
  if (auto level = ParseLogLevel(config.logging.level); level.ok()) SetLogLevel(*level);
  if (auto format = ParseLogFormat(config.logging.format); format.ok()) SetLogFormat(*format);
}

StatusOr<ClusterConfig> Load(const std::string& path, const std::vector<std::string>& overrides) {
  if (!path.empty()) return LoadServingConfig(path, overrides);
  TANDEM_ASSIGN_OR_RETURN(ClusterConfig config, ParseConfig("", "<defaults>", overrides));
  TANDEM_RETURN_IF_ERROR(ValidateForServing(config));
  return config;
}

// Raises the soft RLIMIT_NOFILE to the hard limit: a server holds a descriptor per connection,
// and a soft limit of 1024 (a common default) would let a connection flood take the descriptors
// that /health and KV transfers need (the control listener leaves room under whatever limit this
// leaves: MaxConnectionsForFds).
void RaiseFdLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const rlim_t from = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) {
    TANDEM_LOG(kDebug) << "RLIMIT_NOFILE raised from " << from << " to " << limit.rlim_cur;
  }
}

// The config file's bytes ("" when it cannot be read: a Kubernetes ConfigMap volume swaps its
// files by renaming a symlink, and a read in between may fail; the next poll sees the new file).
std::string ReadConfigText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Waits for signals until one asks to stop. A reloading role reloads the config on SIGHUP, and
// when the file's contents change (polled every router.config_watch_interval_s; 0 = SIGHUP
// only): a ConfigMap edit takes effect without a signal. A reload that fails keeps the old config
// and is logged once per version of the file.
void WaitForStop(const sigset_t& signals, RoleProcess& process, bool reloads,
                 const std::string& config_path, const std::vector<std::string>& overrides,
                 double watch_interval_s) {
  const bool watch = reloads && !config_path.empty() && watch_interval_s > 0;
  std::string seen = watch ? ReadConfigText(config_path) : "";
  for (;;) {
    int signal_number = 0;
    if (watch) {
      timespec timeout{};
      timeout.tv_sec = static_cast<time_t>(watch_interval_s);
      timeout.tv_nsec = static_cast<long>((watch_interval_s - timeout.tv_sec) * 1e9);
      signal_number = sigtimedwait(&signals, nullptr, &timeout);
      if (signal_number < 0) {
        if (errno != EAGAIN) continue;  // EINTR
        std::string text = ReadConfigText(config_path);
        if (text.empty() || text == seen) continue;
        seen = std::move(text);
        TANDEM_LOG(kInfo) << config_path << " changed: reloading";
        signal_number = SIGHUP;
      }
    } else if (sigwait(&signals, &signal_number) != 0) {
      continue;
    }
    if (signal_number != SIGHUP) {
      TANDEM_LOG(kInfo) << "signal " << signal_number << ": draining";
      return;
    }
    if (!reloads || config_path.empty()) {
      TANDEM_LOG(kInfo) << "SIGHUP ignored: this process runs the config it started with";
      continue;
    }
    if (watch) seen = ReadConfigText(config_path);
    StatusOr<ClusterConfig> reloaded = Load(config_path, overrides);
    Status applied = reloaded.ok() ? process.Reload(*reloaded) : reloaded.status();
    if (!applied.ok()) {
      TANDEM_LOG(kError) << "config reload failed, keeping the old one: " << applied.message();
      continue;
    }
    TANDEM_LOG(kInfo) << "config reloaded from " << config_path;
    ApplyLogging(*reloaded);
  }
}

}  // namespace

int RunRoleMain(const RoleSpec& spec, const std::vector<std::string>& args) {
  const std::string tool = "tandem " + spec.command;
  FlagParser flags(tool + (spec.instance ? " [--config FILE] [--index I]" : " --config FILE") +
                       " [--SECTION.KEY=VALUE ...]",
                   spec.description);
  flags.AddString("config", "", spec.instance ? "cluster YAML (absent: defaults)"
                                              : "cluster config file (YAML)");
  if (spec.instance) flags.AddInt("index", 0, "instance index: ports are SECTION.port + index");
  flags.AddDouble("drain-timeout-s", 30,
                  "on SIGTERM, wait at most this long for in-flight requests");
  flags.AllowConfigOverrides();
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", tool.c_str(), s.message().c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  const std::string config_path = flags.GetString("config");
  if (!spec.instance && (config_path.empty() || !flags.positional().empty())) {
    std::fprintf(stderr, "%s: expected --config FILE (and no positional arguments)\n",
                 tool.c_str());
    return kExitUsage;
  }
  StatusOr<ClusterConfig> config = Load(config_path, flags.config_overrides());
  if (!config.ok()) {
    std::fprintf(stderr, "%s: %s\n", tool.c_str(), config.status().message().c_str());
    return kExitFailure;
  }
  StatusOr<std::string> secret = LoadClusterSecret(*config);
  if (!secret.ok()) {
    std::fprintf(stderr, "%s: %s\n", tool.c_str(), secret.status().message().c_str());
    return kExitFailure;
  }
  RoleArgs role_args;
  std::string gpu;  // this instance's CUDA_VISIBLE_DEVICES from S.cuda_devices, if any
  role_args.control = MakeControlOptions(config->control, std::move(*secret));
  role_args.config = std::move(*config);
  if (spec.instance) {
    role_args.index = static_cast<int>(flags.GetInt("index"));
    SetLogRole(spec.command + "-" + std::to_string(role_args.index));
    // S.cuda_devices: this instance's GPU, before anything initialises CUDA.
    const ClusterConfig& c = role_args.config;
    const InstanceSection& section = spec.command == "prefill" ? c.prefill
                                     : spec.command == "decode" ? c.decode
                                                                : c.colocated;
    gpu = CudaVisibleDevicesFor(section, role_args.index);
    if (!gpu.empty()) ::setenv("CUDA_VISIBLE_DEVICES", gpu.c_str(), 1);
    // Several GPUs in one process with NCCL between them: a kernel's first launch under lazy
    // loading (CUDA's default) loads its module only once the GPU's queue drained, and a queue
    // that holds a collective waiting for another rank does not drain: both ranks hang. Load
    // every module when CUDA starts. The user's own setting wins.
    if (section.device == "cuda" && section.tensor_parallel > 1)
      ::setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  } else {
    SetLogRole(spec.command);
  }
  role_args.drain_timeout_s = flags.GetDouble("drain-timeout-s");
  if (role_args.drain_timeout_s < 0) {
    std::fprintf(stderr, "%s: --drain-timeout-s must be >= 0\n", tool.c_str());
    return kExitUsage;
  }
  ApplyLogging(role_args.config);
  if (!gpu.empty()) {
    TANDEM_LOG(kInfo) << "CUDA_VISIBLE_DEVICES=" << gpu << " (" << spec.command << ".cuda_devices)";
  }
  RaiseFdLimit();

  // Signals are taken by sigwait; blocked before any thread starts, so every thread inherits
  // the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  StatusOr<std::unique_ptr<RoleProcess>> process = spec.start(role_args);
  if (!process.ok()) {
    TANDEM_LOG(kError) << "cannot start: " << process.status().ToString();
    return kExitFailure;
  }
  WaitForStop(signals, **process, /*reloads=*/!spec.instance, config_path,
              flags.config_overrides(), role_args.config.router.config_watch_interval_s);
  (*process)->Stop();
  TANDEM_LOG(kInfo) << "stopped";
  return kExitOk;
}

}  // namespace tandem
