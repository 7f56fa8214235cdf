// Real `tandem prefill`, `tandem decode` and `tandem colocated` processes, with this test acting
// as the router over the control plane: greedy tokens equal the engine alone (`tandem
// generate`), one Finish per request, LoadReports arrive, and kill -9 of the decode instance
// makes prefill free the KV it was holding.
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

namespace tandem {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int FreePort() {
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
std::string HttpGet(int port, const std::string& path) {
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

std::string Run(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  REQUIRE(pclose(p) == 0);
  return out;
}

std::vector<int32_t> EngineAlone(const std::string& model, const std::vector<int32_t>& prompt,
                                 int max_tokens, bool ignore_eos = false) {
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  std::string out = Run(std::string(TANDEM_BINARY) + " generate " +
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

  // Connects (retrying while the instance starts) and says Hello as the router; returns the
  // connection index.
  int Connect(int port, std::chrono::milliseconds timeout = 30s) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      auto conn = ConnectControl(io_, "127.0.0.1:" + std::to_string(port), 1.0);
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
        (*conn)->Send(hello);
        return index;
      }
      REQUIRE(Clock::now() < deadline);
      std::this_thread::sleep_for(100ms);
    }
  }
  void Send(int index, const ControlMessage& m) { REQUIRE(conns_[index]->Send(m)); }
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
  explicit Cluster(const std::string& decode_extra =
                       // A small decode pool with a low watermark: a second request waits in
                       // the pull queue (prefill keeps holding its KV) while the first one runs.
                       "  kv_blocks: 12\n  kv_usage_watermark: 0.1\n",
                   bool layerwise = true) {
    if (size_t at = decode_extra.find("kv_blocks: "); at != std::string::npos)
      decode_kv_blocks = std::stoi(decode_extra.substr(at + 11));
    dir = fs::temp_directory_path() / ("tandem-instances-" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    model = (dir / "model").string();
    Run(std::string(TANDEM_BINARY) + " make-model --preset tiny --out " + model + " >/dev/null 2>&1");
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
        << "  layerwise: " << (layerwise ? "true" : "false") << "\n";
  }
  ~Cluster() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  // Each instance's model.max_model_len is what its small pool holds (16-token blocks), as the
  // config requires: the requests here fit them all.
  std::vector<std::string> Args(const std::string& role) const {
    int pool = 64;
    if (role == "colocated") pool = 6;
    if (role == "decode") pool = decode_kv_blocks;
    return {TANDEM_BINARY, role, "--config", config, "--index", "0",
            "--model.max_model_len=" + std::to_string(std::min(pool * 16, 512))};
  }
  std::string Log(const std::string& role) const { return (dir / (role + ".log")).string(); }
};

std::vector<int32_t> Prompt(int length, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < length; ++i) p.push_back(1 + (i * 37 + salt * 101) % 250);
  return p;
}

Submit Greedy(const std::string& id, std::vector<int32_t> prompt, int max_tokens,
              const std::string& decode_address) {
  Submit s;
  s.request_id = id;
  s.prompt = std::move(prompt);
  s.sampling.temperature = 0;
  s.sampling.max_tokens = max_tokens;
  s.decode_address = decode_address;
  return s;
}

TEST_CASE("instances: prefill + decode stream the engine-alone tokens, decode kill frees prefill",
          "[instances]") {
  const bool layerwise = GENERATE(false, true);
  INFO("transfer.layerwise " << layerwise);
  Cluster cluster("  kv_blocks: 12\n  kv_usage_watermark: 0.1\n", layerwise);
  Child prefill(cluster.Args("prefill"), cluster.Log("prefill"));
  Child decode(cluster.Args("decode"), cluster.Log("decode"));
  FakeRouter router;
  const int p = router.Connect(cluster.prefill_port);
  const int d = router.Connect(cluster.decode_port);
  const std::string decode_address = "127.0.0.1:" + std::to_string(cluster.decode_port);
  Inbox& inbox = router.inbox;
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.load_count[p] > 2 && inbox.load_count[d] > 2; }));
  CHECK(router.hello(p).role == InstanceRole::kPrefill);
  CHECK_FALSE(router.hello(p).kv_peer_info.empty());
  CHECK(router.hello(d).role == InstanceRole::kDecode);
  CHECK(router.hello(p).model == "model");
  {
    std::string metrics = HttpGet(cluster.metrics_port, "/metrics");
    CHECK(metrics.find("HTTP/1.1 200") == 0);
    CHECK(metrics.find("tandem_num_requests_waiting{role=\"prefill\",model=\"model\"}") !=
          std::string::npos);
    CHECK(metrics.find("tandem_kv_cache_usage_ratio") != std::string::npos);
    CHECK(metrics.find("tandem_prefill_batch_seconds_bucket") != std::string::npos);
    CHECK(HttpGet(cluster.metrics_port, "/health").find("HTTP/1.1 200") == 0);
    CHECK(HttpGet(cluster.metrics_port, "/nope").find("HTTP/1.1 404") == 0);
  }

  const std::vector<int> lengths = {5, 16, 40, 70};  // 70 > token budget 32: chunked prefill
  const int max_tokens = 12;
  for (size_t i = 0; i < lengths.size(); ++i)
    router.Send(p, Greedy("r" + std::to_string(i), Prompt(lengths[i], i), max_tokens,
                          decode_address));
  REQUIRE(inbox.WaitFor(40s, [&] {
    for (size_t i = 0; i < lengths.size(); ++i)
      if (inbox.finishes["r" + std::to_string(i)].empty()) return false;
    return true;
  }));
  std::this_thread::sleep_for(300ms);  // a duplicate Finish would arrive by now
  for (size_t i = 0; i < lengths.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    std::vector<int32_t> expected = EngineAlone(cluster.model, Prompt(lengths[i], i), max_tokens);
    std::lock_guard<std::mutex> lock(inbox.mutex);
    INFO(id);
    CHECK(inbox.InRouterOrder(id, p) == expected);
    REQUIRE(inbox.finishes[id].size() == 1);
    CHECK(inbox.finishes[id][0].code == StatusCode::kOk);
    CHECK(inbox.finishes[id][0].completion_tokens == static_cast<int32_t>(expected.size()));
  }
  // A request that ends at its first token: prefill finishes it (layer-wise, after it has
  // announced the KV to decode, which pulls it and drops it without a Finish of its own).
  router.Send(p, Greedy("one", Prompt(30, 3), 1, decode_address));
  REQUIRE(inbox.WaitFor(20s, [&] { return !inbox.finishes["one"].empty(); }));
  std::this_thread::sleep_for(300ms);
  {
    std::lock_guard<std::mutex> lock(inbox.mutex);
    REQUIRE(inbox.finishes["one"].size() == 1);
    CHECK(inbox.finishes["one"][0].code == StatusCode::kOk);
    CHECK(inbox.finishes["one"][0].completion_tokens == 1);
    CHECK(inbox.tokens["one"].size() == 1);
  }
  // Every block is back on both sides.
  REQUIRE(inbox.WaitFor(5s, [&] {
    return inbox.last_load[p].free_kv_blocks == inbox.last_load[p].total_kv_blocks &&
           inbox.last_load[d].free_kv_blocks == inbox.last_load[d].total_kv_blocks;
  }));

  // kill -9 decode while prefill holds KV for it. To make "holds" deterministic, decode is
  // stopped (SIGSTOP) first: it accepts nothing more, so the KvReady for "held" waits in the
  // socket and prefill keeps the blocks until the connection dies.
  Submit a = Greedy("long-a", Prompt(20, 7), 150, decode_address);
  a.sampling.ignore_eos = true;
  router.Send(p, a);
  REQUIRE(inbox.WaitFor(20s, [&] { return inbox.tokens["long-a"].size() >= 2; }));
  decode.Signal(SIGSTOP);
  Submit b = Greedy("held", Prompt(40, 8), 20, decode_address);
  b.sampling.ignore_eos = true;
  router.Send(p, b);
  REQUIRE(inbox.WaitFor(20s, [&] {
    return inbox.tokens["held"].size() == 1 &&
           inbox.last_load[p].free_kv_blocks < inbox.last_load[p].total_kv_blocks;
  }));
  decode.Kill();
  REQUIRE(inbox.WaitFor(10s, [&] {
    return inbox.last_load[p].free_kv_blocks == inbox.last_load[p].total_kv_blocks &&
           inbox.last_load[p].waiting_requests == 0;
  }));

  // An unreachable decode instance: the request fails cleanly with Unavailable.
  router.Send(p, Greedy("orphan", Prompt(8, 9), 8, decode_address));
  REQUIRE(inbox.WaitFor(10s, [&] { return !inbox.finishes["orphan"].empty(); }));
  {
    std::lock_guard<std::mutex> lock(inbox.mutex);
    CHECK(inbox.finishes["orphan"][0].code == StatusCode::kUnavailable);
  }
  REQUIRE(inbox.WaitFor(5s, [&] {
    return inbox.last_load[p].free_kv_blocks == inbox.last_load[p].total_kv_blocks;
  }));
  // SIGTERM: prefill drains and exits 0.
  CHECK(prefill.Terminate(10s) == 0);
}

TEST_CASE("instances: colocated streams the engine-alone tokens under preemption, kill -9",
          "[instances]") {
  // Both colocated policies: chunked prompts in decode steps, and prefill_first (whole prompts,
  // two of them longer than the 24-token budget, which then run alone).
  const std::string scheduling = GENERATE(as<std::string>{}, "chunked", "prefill_first");
  INFO("colocated.scheduling " << scheduling);
  Cluster cluster;
  std::vector<std::string> args = cluster.Args("colocated");
  args.push_back("--colocated.scheduling=" + scheduling);
  Child colocated(args, cluster.Log("colocated"));
  FakeRouter router;
  const int c = router.Connect(cluster.colocated_port);
  Inbox& inbox = router.inbox;
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.load_count[c] > 2; }));
  CHECK(router.hello(c).role == InstanceRole::kColocated);

  const std::vector<int> lengths = {20, 25, 9, 30};
  const int max_tokens = 30;  // each needs 3-4 of the 6 blocks: preemption is certain
  for (size_t i = 0; i < lengths.size(); ++i) {
    Submit s = Greedy("c" + std::to_string(i), Prompt(lengths[i], 20 + i), max_tokens, "");
    s.sampling.ignore_eos = true;
    router.Send(c, s);
  }
  REQUIRE(inbox.WaitFor(40s, [&] {
    for (size_t i = 0; i < lengths.size(); ++i)
      if (inbox.finishes["c" + std::to_string(i)].empty()) return false;
    return true;
  }));
  std::this_thread::sleep_for(300ms);
  for (size_t i = 0; i < lengths.size(); ++i) {
    const std::string id = "c" + std::to_string(i);
    std::vector<int32_t> expected;
    {
      // generate stops at eos unless asked not to; the requests ignore eos.
      std::string ids;
      for (int32_t t : Prompt(lengths[i], 20 + i)) ids += (ids.empty() ? "" : ",") + std::to_string(t);
      std::string out = Run(std::string(TANDEM_BINARY) + " generate --ignore-eos --model " +
                            cluster.model + " --prompt-ids " + ids + " --max-tokens " +
                            std::to_string(max_tokens) + " 2>/dev/null");
      size_t at = out.find("generated_ids:");
      REQUIRE(at != std::string::npos);
      std::istringstream line(out.substr(at + 14, out.find('\n', at) - at - 14));
      int32_t v;
      while (line >> v) expected.push_back(v);
    }
    std::lock_guard<std::mutex> lock(inbox.mutex);
    INFO(id);
    CHECK(inbox.tokens[id] == expected);
    REQUIRE(inbox.finishes[id].size() == 1);
    CHECK(inbox.finishes[id][0].finish_reason == "length");
  }
  REQUIRE(inbox.WaitFor(5s, [&] {
    return inbox.last_load[c].free_kv_blocks == inbox.last_load[c].total_kv_blocks;
  }));
  {
    // Six blocks for four requests of three blocks each: some were preempted and recomputed.
    std::string metrics = HttpGet(cluster.colocated_metrics_port, "/metrics");
    const std::string name = "tandem_preemptions_total{role=\"colocated\",model=\"model\"} ";
    size_t at = metrics.find(name);
    REQUIRE(at != std::string::npos);
    CHECK(std::stod(metrics.substr(at + name.size())) > 0);
  }
  // A submit to a prefill-only field is fine here; a cancelled request ends with one Finish.
  Submit longer = Greedy("cancel-me", Prompt(10, 3), 80, "");
  longer.sampling.ignore_eos = true;
  router.Send(c, longer);
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.tokens["cancel-me"].size() >= 2; }));
  router.Send(c, Cancel{"cancel-me"});
  REQUIRE(inbox.WaitFor(10s, [&] { return !inbox.finishes["cancel-me"].empty(); }));
  REQUIRE(inbox.WaitFor(5s, [&] {
    return inbox.last_load[c].free_kv_blocks == inbox.last_load[c].total_kv_blocks;
  }));

  // kill -9 mid-stream: the router sees the connection drop (its requests are its to fail).
  Submit s = Greedy("killed", Prompt(10, 4), 80, "");  // 90 tokens: all 6 blocks
  s.sampling.ignore_eos = true;
  router.Send(c, s);
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.tokens["killed"].size() >= 2; }));
  colocated.Kill();
  REQUIRE(inbox.WaitFor(5s, [&] { return inbox.closed[c]; }));
}

TEST_CASE("instances: decode preempts and recomputes when its pool runs out, tokens unchanged",
          "[instances]") {
  // Eight decode blocks (16 tokens each) for four requests that grow to five or six blocks
  // each: any two that overlap run the pool out. (With 30 output tokens, three or four blocks
  // each, a CI run under load once staggered them so that no step ran out.)
  const bool layerwise = GENERATE(false, true);
  INFO("transfer.layerwise " << layerwise);
  const int decode_metrics_port = FreePort();
  Cluster cluster("  kv_blocks: 8\n  kv_usage_watermark: 1.0\n  metrics_port: " +
                      std::to_string(decode_metrics_port) + "\n",
                  layerwise);
  Child prefill(cluster.Args("prefill"), cluster.Log("prefill"));
  Child decode(cluster.Args("decode"), cluster.Log("decode"));
  FakeRouter router;
  const int p = router.Connect(cluster.prefill_port);
  const int d = router.Connect(cluster.decode_port);
  const std::string decode_address = "127.0.0.1:" + std::to_string(cluster.decode_port);
  Inbox& inbox = router.inbox;
  const std::vector<int> lengths = {18, 22, 12, 26};
  const int max_tokens = 60;
  for (size_t i = 0; i < lengths.size(); ++i) {
    Submit s = Greedy("d" + std::to_string(i), Prompt(lengths[i], 40 + i), max_tokens,
                      decode_address);
    s.sampling.ignore_eos = true;
    router.Send(p, s);
  }
  REQUIRE(inbox.WaitFor(40s, [&] {
    for (size_t i = 0; i < lengths.size(); ++i)
      if (inbox.finishes["d" + std::to_string(i)].empty()) return false;
    return true;
  }));
  std::this_thread::sleep_for(300ms);
  for (size_t i = 0; i < lengths.size(); ++i) {
    const std::string id = "d" + std::to_string(i);
    std::vector<int32_t> expected =
        EngineAlone(cluster.model, Prompt(lengths[i], 40 + i), max_tokens, /*ignore_eos=*/true);
    std::lock_guard<std::mutex> lock(inbox.mutex);
    INFO(id);
    CHECK(inbox.InRouterOrder(id, p) == expected);
    REQUIRE(inbox.finishes[id].size() == 1);
    CHECK(inbox.finishes[id][0].finish_reason == "length");
    CHECK(inbox.finishes[id][0].completion_tokens == max_tokens);
  }
  REQUIRE(inbox.WaitFor(5s, [&] {
    return inbox.last_load[p].free_kv_blocks == inbox.last_load[p].total_kv_blocks &&
           inbox.last_load[d].free_kv_blocks == inbox.last_load[d].total_kv_blocks;
  }));
  {
    std::string metrics = HttpGet(decode_metrics_port, "/metrics");
    const std::string name = "tandem_preemptions_total{role=\"decode\",model=\"model\"} ";
    size_t at = metrics.find(name);
    REQUIRE(at != std::string::npos);
    CHECK(std::stod(metrics.substr(at + name.size())) > 0);
    CHECK(metrics.find("tandem_kv_transfer_bytes_total") != std::string::npos);
    CHECK(metrics.find("tandem_decode_step_seconds_bucket") != std::string::npos);
    // One handoff wait per request, layer-wise or not.
    CHECK(metrics.find("tandem_kv_handoff_wait_seconds_count{role=\"decode\",model=\"model\"} " +
                       std::to_string(lengths.size())) != std::string::npos);
  }
  // SIGTERM mid-stream: decode drains (the request completes), then exits 0.
  Submit last = Greedy("drained", Prompt(10, 5), 60, decode_address);
  last.sampling.ignore_eos = true;
  router.Send(p, last);
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.tokens["drained"].size() >= 2; }));
  CHECK(decode.Terminate(10s) == 0);
  {
    std::lock_guard<std::mutex> lock(inbox.mutex);
    REQUIRE(inbox.finishes["drained"].size() == 1);
    CHECK(inbox.finishes["drained"][0].finish_reason == "length");
    CHECK(inbox.tokens["drained"].size() == 60);
  }
  CHECK(prefill.Terminate(10s) == 0);
}

}  // namespace
}  // namespace tandem
