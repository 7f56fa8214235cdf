// A harness for integration tests that start real `tandem` instance processes and act as the
// router over the control plane: child processes killed at scope exit, a fake router that
// records what every connection received, a cluster config on free ports, and the engine-alone
// reference (`tandem generate`).
#pragma once

#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/net/control_channel.h"
#include "common/net/control_wire.h"
#include "tests/tandem_binary.h"
#include "tests/test_control.h"

namespace tandem::test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// A child process killed (SIGKILL) when it goes out of scope, whatever happened.
class Child {
 public:
  explicit Child(std::vector<std::string> args, const std::string& log_path) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      FILE* log = std::fopen(log_path.c_str(), "w");
      if (log != nullptr) {
        dup2(fileno(log), 1);
        dup2(fileno(log), 2);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Child() { Kill(); }
  pid_t pid() const { return pid_; }
  void Signal(int signal_number) { kill(pid_, signal_number); }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // SIGTERM, then the exit status (or -1 if it did not exit within `timeout`).
  int Terminate(std::chrono::milliseconds timeout) {
    kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
};

// GET http://127.0.0.1:port/path; the whole response (the server closes after it), or "".
inline std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    std::string request = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

// The value of the first sample of `name` (metric name with its labels, exactly as rendered) at
// http://127.0.0.1:port/metrics, or -1 when it is absent.
inline double MetricValue(int port, const std::string& name) {
  const std::string body = HttpGet(port, "/metrics");
  const size_t at = body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(body.substr(at + name.size() + 2));
}

inline std::string Run(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  REQUIRE(pclose(p) == 0);
  return out;
}

inline std::vector<int32_t> EngineAlone(const std::string& model, const std::vector<int32_t>& prompt,
                                 int max_tokens, bool ignore_eos = false) {
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  std::string out = Run(std::string(TandemBinary()) + " generate " +
                        (ignore_eos ? "--ignore-eos " : "") + "--model " + model +
                        " --prompt-ids " + ids + " --max-tokens " + std::to_string(max_tokens) +
                        " 2>/dev/null");
  size_t at = out.find("generated_ids:");
  REQUIRE(at != std::string::npos);
  std::istringstream line(out.substr(at + 14, out.find('\n', at) - at - 14));
  std::vector<int32_t> ids_out;
  int32_t v;
  while (line >> v) ids_out.push_back(v);
  return ids_out;
}

// What the "router" (this test) has received, from all its connections.
struct Inbox {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::string, std::vector<int32_t>> tokens;  // in arrival order, any connection
  // request -> connection index -> its tokens
  std::map<std::string, std::map<int, std::vector<int32_t>>> tokens_by_connection;
  std::map<std::string, std::vector<Finish>> finishes;

  // A disaggregated request's tokens as the router streams them: prefill's first token, then
  // decode's. They come over two connections, so their arrival order here is a race (the
  // router holds decode's back until prefill's has arrived). Call with `mutex` held.
  std::vector<int32_t> InRouterOrder(const std::string& id, int prefill_connection) {
    std::vector<int32_t> out = tokens_by_connection[id][prefill_connection];
    for (const auto& [connection, list] : tokens_by_connection[id])
      if (connection != prefill_connection) out.insert(out.end(), list.begin(), list.end());
    return out;
  }
  std::map<int, LoadReport> last_load;  // by connection index
  std::map<int, int> load_count;
  std::map<int, bool> closed;

  template <typename Pred>
  bool WaitFor(std::chrono::milliseconds timeout, Pred pred) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, timeout, [&] { return pred(); });
  }
};

class FakeRouter {
 public:
  FakeRouter() : work_(io_.get_executor()), thread_([this] { io_.run(); }) {}
  ~FakeRouter() {
    for (auto& c : conns_) c->Close();
    work_.reset();
    io_.stop();
    thread_.join();
  }

  // Connects (retrying while the instance starts) and says Hello as the router, with `session`
  // as its session id (Hello.instance_id); returns the connection index.
  int Connect(int port, std::chrono::milliseconds timeout = 30s, uint64_t session = 0) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      auto conn = ConnectControl(io_, "127.0.0.1:" + std::to_string(port), 1.0, TestControlOptions());
      if (conn.ok()) {
        const int index = static_cast<int>(conns_.size());
        conns_.push_back(*conn);
        (*conn)->Start(
            [this, index](ControlMessage m) {
              std::lock_guard<std::mutex> lock(inbox.mutex);
              if (auto* t = std::get_if<Tokens>(&m)) {
                for (auto& r : t->tokens) {
                  inbox.tokens[t->request_id].push_back(r.token_id);
                  inbox.tokens_by_connection[t->request_id][index].push_back(r.token_id);
                }
              } else if (auto* f = std::get_if<Finish>(&m)) {
                inbox.finishes[f->request_id].push_back(*f);
              } else if (auto* l = std::get_if<LoadReport>(&m)) {
                inbox.last_load[index] = *l;
                ++inbox.load_count[index];
              } else if (auto* h = std::get_if<Hello>(&m)) {
                hellos_[index] = *h;
              }
              inbox.cv.notify_all();
            },
            [this, index](const Status&) {
              std::lock_guard<std::mutex> lock(inbox.mutex);
              inbox.closed[index] = true;
              inbox.cv.notify_all();
            });
        Hello hello;
        hello.role = InstanceRole::kRouter;
        hello.name = "test-router";
        hello.instance_id = session;
        (*conn)->Send(hello);
        // As the router does: place nothing through an instance before its Hello answers ours
        // (the instance opens the session before it replies). Otherwise a prefill's KvReady can
        // reach decode before this session exists there, and decode refuses the KV.
        inbox.WaitFor(10s, [&] { return hellos_.count(index) > 0 || inbox.closed[index]; });
        return index;
      }
      REQUIRE(Clock::now() < deadline);
      std::this_thread::sleep_for(100ms);
    }
  }
  void Send(int index, const ControlMessage& m) { REQUIRE(conns_[index]->Send(m)); }
  // Closes connection `index`: the router gives that session up.
  void Close(int index) { conns_[index]->Close(); }
  Hello hello(int index) {
    std::lock_guard<std::mutex> lock(inbox.mutex);
    return hellos_[index];
  }

  Inbox inbox;

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
  std::vector<std::shared_ptr<ControlConnection>> conns_;
  std::map<int, Hello> hellos_;
};

struct Cluster {
  fs::path dir;
  std::string model;
  std::string config;
  int prefill_port = FreePort();
  int decode_port = FreePort();
  int colocated_port = FreePort();
  int metrics_port = FreePort();
  int colocated_metrics_port = FreePort();
  int decode_kv_blocks = 32;  // from decode_extra

  // decode_extra: YAML lines for the decode section (after port). layerwise: transfer.layerwise.
  // extra: whole YAML sections appended at the end (control:, ...).
  explicit Cluster(const std::string& decode_extra =
                       // A small decode pool with a low watermark: a second request waits in
                       // the pull queue (prefill keeps holding its KV) while the first one runs.
                       "  kv_blocks: 12\n  kv_usage_watermark: 0.1\n",
                   bool layerwise = true, const std::string& extra = "") {
    if (size_t at = decode_extra.find("kv_blocks: "); at != std::string::npos)
      decode_kv_blocks = std::stoi(decode_extra.substr(at + 11));
    // The children take the cluster secret from the environment they inherit.
    setenv("TANDEM_CLUSTER_SECRET", kTestClusterSecret, 1);
    dir = fs::temp_directory_path() / ("tandem-instances-" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    model = (dir / "model").string();
    Run(std::string(TandemBinary()) + " make-model --preset tiny --out " + model +
        " >/dev/null 2>&1");
    config = (dir / "cluster.yaml").string();
    std::ofstream out(config);
    out << "model:\n  path: " << model << "\n  max_model_len: 512\n"
        << "prefill:\n  port: " << prefill_port << "\n  kv_blocks: 64\n  token_budget: 32\n"
        << "  metrics_port: " << metrics_port << "\n  kv_hold_timeout_s: 20\n"
        << "decode:\n  port: " << decode_port << "\n" << decode_extra
        // Six blocks for four concurrent requests: colocated must preempt to finish them.
        << "colocated:\n  port: " << colocated_port << "\n  kv_blocks: 6\n  token_budget: 24\n"
        << "  metrics_port: " << colocated_metrics_port << "\n"
        << "kv_cache:\n  block_size: 16\n"
        << "transfer:\n  backend: ucx\n  ucx_tls: tcp\n  timeout_s: 5\n"
        << "  layerwise: " << (layerwise ? "true" : "false") << "\n"
        << extra;
  }
  // TANDEM_KEEP_TEST_LOGS=1 keeps the directory (config, model, every child's log).
  ~Cluster() {
    if (getenv("TANDEM_KEEP_TEST_LOGS")) return;
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  // model.max_model_len is what the smallest pool of the instances that serve together holds
  // (16-token blocks), as the config requires: prefill and decode share one limit; colocated
  // (no instances in the file, started alone) has its own small pool.
  std::vector<std::string> Args(const std::string& role) const {
    int pool = role == "colocated" ? 6 : std::min(64, decode_kv_blocks);
    return {TandemBinary(), role, "--config", config, "--index", "0",
            "--model.max_model_len=" + std::to_string(std::min(pool * 16, 512))};
  }
  std::string Log(const std::string& role) const { return (dir / (role + ".log")).string(); }
};

inline std::vector<int32_t> Prompt(int length, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < length; ++i) p.push_back(1 + (i * 37 + salt * 101) % 250);
  return p;
}

inline Submit Greedy(const std::string& id, std::vector<int32_t> prompt, int max_tokens,
              const std::string& decode_address) {
  Submit s;
  s.request_id = id;
  s.prompt = std::move(prompt);
  s.sampling.temperature = 0;
  s.sampling.max_tokens = max_tokens;
  s.decode_address = decode_address;
  return s;
}

}  // namespace tandem::test
