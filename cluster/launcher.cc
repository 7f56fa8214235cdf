#include "cluster/launcher.h"

#include <arpa/inet.h>
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

#include "common/base/flags.h"
#include "common/base/log.h"
#include "common/model/model_store.h"
#include "router/cluster_backend.h"

namespace tandem {

const char kServeConfigYaml[] =
    "# tandem serve: the embedded default cluster\n"
    "model:\n"
    "  preset: medium\n"
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

// GET http://127.0.0.1:port/ready; true on 200.
bool RouterReady(const std::string& host, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host == "0.0.0.0" ? "127.0.0.1" : host.c_str(), &addr.sin_addr) != 1)
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ready = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    std::string request = "GET /ready HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buffer[64] = {};
      ssize_t n = ::recv(fd, buffer, sizeof buffer - 1, 0);
      ready = n > 12 && std::strncmp(buffer + 8, " 200", 4) == 0;
    }
  }
  ::close(fd);
  return ready;
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
  const std::pair<const char*, const InstanceSection*> sections[] = {
      {"prefill", &config.prefill}, {"decode", &config.decode}, {"colocated", &config.colocated}};
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

int RunCluster(const LaunchOptions& options) {
  SetLogRole("launcher");
  StatusOr<ClusterConfig> config = LoadConfig(options.config_path, options.overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return kExitFailure;
  }
  if (auto level = ParseLogLevel(config->logging.level); level.ok()) SetLogLevel(*level);
  if (auto format = ParseLogFormat(config->logging.format); format.ok()) SetLogFormat(*format);
  StatusOr<std::vector<std::string>> picked = PickPorts(*config);
  if (!picked.ok()) {
    TANDEM_LOG(kError) << picked.status().message();
    return kExitFailure;
  }
  std::vector<std::string> overrides = options.overrides;
  overrides.insert(overrides.end(), picked->begin(), picked->end());
  config = LoadConfig(options.config_path, overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return kExitFailure;
  }
  // The router refuses to start on a latency model it cannot read or that lacks an instance's
  // shape; say so now rather than restart it with back-off for ever.
  if (StatusOr<RouterLatencyModels> models = LoadRouterLatencyModels(*config); !models.ok()) {
    std::fprintf(stderr, "%s\n", models.status().message().c_str());
    return kExitFailure;
  }

  // Make (or find) the model once, before the children race for it.
  TANDEM_LOG(kInfo) << "preparing the model ("
                    << (config->model.path.empty() ? "built-in preset " + config->model.preset +
                                                         ", made on first use and cached"
                                                   : config->model.path)
                    << ")";
  StatusOr<std::string> model_dir = ResolveModelDir(config->model);
  if (!model_dir.ok()) {
    TANDEM_LOG(kError) << "model: " << model_dir.status().message();
    return kExitFailure;
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  ::sigprocmask(SIG_BLOCK, &signals, nullptr);

  const std::string binary = options.binary.empty() ? SelfExe() : options.binary;
  std::vector<std::string> common_args = {"--config", options.config_path};
  for (const std::string& o : overrides) common_args.push_back("--" + o);
  std::vector<Child> children;
  const std::pair<const char*, const InstanceSection*> sections[] = {
      {"prefill", &config->prefill}, {"decode", &config->decode}, {"colocated", &config->colocated}};
  for (auto& [name, s] : sections) {
    for (int i = 0; i < s->instances; ++i) {
      Child c;
      c.name = std::string(name) + "-" + std::to_string(i);
      c.argv = {binary, name};
      c.argv.insert(c.argv.end(), common_args.begin(), common_args.end());
      c.argv.push_back("--index");
      c.argv.push_back(std::to_string(i));
      children.push_back(std::move(c));
    }
  }
  Child router;
  router.name = "router";
  router.is_router = true;
  router.argv = {binary, "router"};
  router.argv.insert(router.argv.end(), common_args.begin(), common_args.end());
  children.push_back(std::move(router));

  const pid_t self = ::getpid();
  auto start = [&](Child& c) {
    c.pid = Spawn(binary, c.argv, self);
    c.started = Clock::now();
    if (c.pid < 0) {
      TANDEM_LOG(kError) << "cannot start " << c.name << ": " << std::strerror(errno);
      c.restart_at = Clock::now() + std::chrono::seconds(1);
    }
  };
  for (Child& c : children) start(c);
  const std::string url =
      "http://" + config->router.host + ":" + std::to_string(config->router.port);
  TANDEM_LOG(kInfo) << "started " << children.size() - 1 << " instance(s) and the router ("
                    << url << "); waiting for it to be ready";

  bool announced = false;
  Clock::time_point next_probe = Clock::now();
  for (;;) {
    timespec wait{0, 100 * 1000 * 1000};
    siginfo_t info;
    int sig = ::sigtimedwait(&signals, &info, &wait);
    if (sig == SIGINT || sig == SIGTERM) {
      TANDEM_LOG(kInfo) << "signal " << sig << ": stopping the cluster";
      break;
    }
    if (sig == SIGHUP) {
      for (Child& c : children)
        if (c.is_router && c.pid > 0) ::kill(c.pid, SIGHUP);
      TANDEM_LOG(kInfo) << "SIGHUP passed on to the router (config reload)";
    }
    Clock::time_point now = Clock::now();
    for (Child& c : children) {
      int status = 0;
      if (c.pid > 0 && ::waitpid(c.pid, &status, WNOHANG) == c.pid) {
        double ran = std::chrono::duration<double>(now - c.started).count();
        if (ran > 60) c.backoff_s = 1;
        TANDEM_LOG(kWarn) << c.name << " " << DescribeExit(status) << " after " << ran
                          << " s; restarting in " << c.backoff_s << " s";
        c.pid = -1;
        c.restart_at = now + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(c.backoff_s));
        c.backoff_s = std::min(c.backoff_s * 2, 30.0);
      }
      if (c.pid <= 0 && now >= c.restart_at) {
        ++c.restarts;
        TANDEM_LOG(kInfo) << "restarting " << c.name << " (restart " << c.restarts << ")";
        start(c);
      }
    }
    if (!announced && now >= next_probe) {
      next_probe = now + std::chrono::milliseconds(250);
      if (RouterReady(config->router.host, config->router.port)) {
        announced = true;
        std::printf("tandem: ready at %s (model %s)\n", url.c_str(),
                    ServedModelName(config->model).c_str());
        std::fflush(stdout);
      }
    }
  }

  std::vector<size_t> routers, instances;
  for (size_t i = 0; i < children.size(); ++i)
    (children[i].is_router ? routers : instances).push_back(i);
  StopStage(children, routers, options.stop_timeout_s);
  StopStage(children, instances, options.stop_timeout_s);
  TANDEM_LOG(kInfo) << "cluster stopped";
  return kExitOk;
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
                   "Starts the default local cluster: the medium built-in model, 1 router on "
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
