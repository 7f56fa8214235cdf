// Real `tandem prefill` and `tandem decode` processes under the faults that the instance host, the
// KV handoff and the KV intake must handle, with this test acting as the router: a request
// cancelled before its KV reached decode, router sessions given up or never opened, the
// heartbeat interval from the config, shared memory left behind by a killed instance, and KV
// transport messages its publisher cannot take.
#include <catch2/catch.hpp>

#include <sys/ipc.h>
#include <sys/shm.h>

#include "tests/integration/instance_harness.h"

namespace tandem {
namespace {

using namespace test;  // NOLINT: the harness is this file's vocabulary
using namespace std::chrono_literals;

std::string Label(const std::string& name, const std::string& role) {
  return name + "{role=\"" + role + "\",model=\"model\"}";
}

// Until every sample named in `targets` (metric with labels -> value) reads its value at
// http://127.0.0.1:port/metrics; false if that did not happen within `bound`.
bool MetricsReach(int port, const std::vector<std::pair<std::string, double>>& targets,
                  std::chrono::milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  for (;;) {
    bool all = true;
    for (const auto& [name, value] : targets) all = all && MetricValue(port, name) == value;
    if (all) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
}

// Both pools are whole again and nothing runs or waits anywhere.
bool AllFree(Inbox& inbox, int p, int d) {
  return inbox.last_load[p].free_kv_blocks == inbox.last_load[p].total_kv_blocks &&
         inbox.last_load[d].free_kv_blocks == inbox.last_load[d].total_kv_blocks &&
         inbox.last_load[d].running_requests == 0 && inbox.last_load[d].waiting_requests == 0;
}

TEST_CASE("instance faults: a request cancelled before its KV reached decode is never decoded",
          "[instances]") {
  const bool layerwise = GENERATE(false, true);
  INFO("transfer.layerwise " << layerwise);
  Cluster cluster("  kv_blocks: 32\n", layerwise);
  Child prefill(cluster.Args("prefill"), cluster.Log("prefill"));
  Child decode(cluster.Args("decode"), cluster.Log("decode"));
  FakeRouter router;
  const int p = router.Connect(cluster.prefill_port);
  const int d = router.Connect(cluster.decode_port);
  const std::string decode_address = "127.0.0.1:" + std::to_string(cluster.decode_port);
  Inbox& inbox = router.inbox;
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.load_count[p] > 1 && inbox.load_count[d] > 1; }));

  // The client reset right after sending: the router cancels on both instances. Decode hears of
  // the cancel before prefill's KvReady arrives (prefill's Cancel comes after its handoff).
  router.Send(d, Cancel{"gone"});
  Submit gone = Greedy("gone", Prompt(40, 11), 200, decode_address);
  gone.sampling.ignore_eos = true;
  router.Send(p, gone);
  REQUIRE(inbox.WaitFor(20s, [&] { return !inbox.tokens["gone"].empty(); }));
  router.Send(p, Cancel{"gone"});
  REQUIRE(inbox.WaitFor(10s, [&] { return AllFree(inbox, p, d); }));
  std::this_thread::sleep_for(500ms);  // decode tokens would have arrived by now
  {
    std::lock_guard<std::mutex> lock(inbox.mutex);
    CHECK(inbox.tokens["gone"].size() == 1);  // prefill's first token only
    CHECK(inbox.finishes["gone"].empty());    // the router already ended it
  }

  // Cancel while prefill holds the KV for a decode instance that does not read (stopped):
  // prefill frees its side at once; decode, resumed, does not run the request.
  decode.Signal(SIGSTOP);
  Submit held = Greedy("held", Prompt(40, 12), 200, decode_address);
  held.sampling.ignore_eos = true;
  router.Send(p, held);
  REQUIRE(inbox.WaitFor(20s, [&] {
    return inbox.tokens["held"].size() == 1 &&
           inbox.last_load[p].free_kv_blocks < inbox.last_load[p].total_kv_blocks;
  }));
  router.Send(p, Cancel{"held"});
  router.Send(d, Cancel{"held"});
  REQUIRE(inbox.WaitFor(5s, [&] {
    return inbox.last_load[p].free_kv_blocks == inbox.last_load[p].total_kv_blocks;
  }));
  decode.Signal(SIGCONT);
  std::this_thread::sleep_for(500ms);
  REQUIRE(inbox.WaitFor(10s, [&] { return AllFree(inbox, p, d); }));
  {
    // Resumed, decode reads the router's Cancel and prefill's KvReady from two connections in
    // either order: it refuses the KV, or drops the request within a step of taking it.
    std::lock_guard<std::mutex> lock(inbox.mutex);
    CHECK(inbox.tokens["held"].size() <= 3);
    for (const Finish& f : inbox.finishes["held"]) CHECK(f.code == StatusCode::kCancelled);
  }
  CHECK(decode.Terminate(10s) == 0);
  CHECK(prefill.Terminate(10s) == 0);
}

TEST_CASE("instance faults: router sessions decide which requests decode still runs",
          "[instances]") {
  const bool layerwise = GENERATE(false, true);
  INFO("transfer.layerwise " << layerwise);
  const int decode_metrics = FreePort();
  // Long generations (4000 tokens), so that a request still runs long after its session closed
  // unless decode drops it.
  Cluster cluster("  kv_blocks: 800\n  metrics_port: " + std::to_string(decode_metrics) + "\n",
                  layerwise);
  auto args = [&](const std::string& role) {
    std::vector<std::string> a = cluster.Args(role);
    a.push_back("--model.max_model_len=4096");
    a.push_back("--prefill.kv_blocks=256");
    return a;
  };
  Child prefill(args("prefill"), cluster.Log("prefill"));
  Child decode(args("decode"), cluster.Log("decode"));
  FakeRouter router;
  constexpr uint64_t kSession = 0x5e55;
  const int p = router.Connect(cluster.prefill_port, 30s, 0x1111);
  const int d = router.Connect(cluster.decode_port, 30s, kSession);
  const std::string decode_address = "127.0.0.1:" + std::to_string(cluster.decode_port);
  Inbox& inbox = router.inbox;
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.load_count[p] > 1 && inbox.load_count[d] > 1; }));

  // A session decode has never seen (or has seen closed): the KV is released, nothing decoded.
  Submit stale = Greedy("stale", Prompt(30, 13), 100, decode_address);
  stale.sampling.ignore_eos = true;
  stale.decode_session = kSession + 1;
  router.Send(p, stale);
  REQUIRE(inbox.WaitFor(20s, [&] { return !inbox.tokens["stale"].empty(); }));
  REQUIRE(inbox.WaitFor(10s, [&] { return AllFree(inbox, p, d); }));
  std::this_thread::sleep_for(500ms);
  {
    std::lock_guard<std::mutex> lock(inbox.mutex);
    CHECK(inbox.tokens["stale"].size() == 1);
    CHECK(inbox.finishes["stale"].empty());
  }

  // The open session's requests run, and stop at once when the router closes the session.
  for (int i = 0; i < 3; ++i) {
    Submit s = Greedy("live" + std::to_string(i), Prompt(20 + i, 14 + i), 4000, decode_address);
    s.sampling.ignore_eos = true;
    s.decode_session = kSession;
    router.Send(p, s);
  }
  REQUIRE(inbox.WaitFor(20s, [&] {
    for (int i = 0; i < 3; ++i)
      if (inbox.tokens["live" + std::to_string(i)].size() < 3) return false;
    return true;
  }));
  CHECK(MetricValue(decode_metrics, Label("tandem_num_requests_running", "decode")) > 0);
  // A newer router connection (another session) does not take the requests' tokens over.
  const int other = router.Connect(cluster.decode_port, 30s, kSession + 7);
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.load_count[other] > 1; }));
  size_t seen = 0;
  {
    std::lock_guard<std::mutex> lock(inbox.mutex);
    seen = inbox.tokens["live0"].size();
  }
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.tokens["live0"].size() > seen + 5; }));
  {
    std::lock_guard<std::mutex> lock(inbox.mutex);
    for (int i = 0; i < 3; ++i)
      CHECK(inbox.tokens_by_connection["live" + std::to_string(i)][other].empty());
  }
  router.Close(d);
  CHECK(MetricsReach(decode_metrics,
                     {{Label("tandem_num_requests_running", "decode"), 0},
                      {Label("tandem_kv_cache_usage_ratio", "decode"), 0}},
                     1s));
  {
    std::lock_guard<std::mutex> lock(inbox.mutex);
    for (int i = 0; i < 3; ++i) CHECK(inbox.tokens["live" + std::to_string(i)].size() < 4000);
  }
  REQUIRE(inbox.WaitFor(10s, [&] {
    return inbox.last_load[p].free_kv_blocks == inbox.last_load[p].total_kv_blocks;
  }));
  CHECK(decode.Terminate(10s) == 0);
  CHECK(prefill.Terminate(10s) == 0);
}

TEST_CASE("instance faults: a closed router session ends its requests on prefill and colocated",
          "[instances]") {
  Cluster cluster("  kv_blocks: 12\n", false);
  // Long prompts in small chunks keep prefill busy for seconds; long generations colocated.
  std::vector<std::string> prefill_args = cluster.Args("prefill");
  for (const char* flag : {"--model.max_model_len=4096", "--prefill.kv_blocks=4096",
                           "--prefill.token_budget=16", "--decode.kv_blocks=256"})
    prefill_args.push_back(flag);
  std::vector<std::string> colocated_args = cluster.Args("colocated");
  // A colocated cluster: no prefill or decode instances (their small pools are not checked).
  for (const char* flag : {"--model.max_model_len=4096", "--colocated.kv_blocks=800",
                           "--colocated.instances=1", "--prefill.instances=0",
                           "--decode.instances=0"})
    colocated_args.push_back(flag);
  Child prefill(prefill_args, cluster.Log("prefill"));
  Child colocated(colocated_args, cluster.Log("colocated"));
  FakeRouter router;
  const int p = router.Connect(cluster.prefill_port, 30s, 0x71);
  const int c = router.Connect(cluster.colocated_port, 30s, 0x72);
  Inbox& inbox = router.inbox;
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.load_count[p] > 1 && inbox.load_count[c] > 1; }));
  // Nobody listens at this decode address: the handoffs fail, after the prefill work.
  const std::string nowhere = "127.0.0.1:" + std::to_string(FreePort());
  for (int i = 0; i < 20; ++i)
    router.Send(p, Greedy("q" + std::to_string(i), Prompt(2000, 30 + i), 8, nowhere));
  for (int i = 0; i < 3; ++i) {
    Submit s = Greedy("c" + std::to_string(i), Prompt(20 + i, 50 + i), 4000, "");
    s.sampling.ignore_eos = true;
    router.Send(c, s);
  }
  REQUIRE(inbox.WaitFor(20s, [&] {
    return inbox.last_load[p].waiting_requests > 10 && inbox.tokens["c2"].size() >= 3;
  }));
  router.Close(p);
  router.Close(c);
  CHECK(MetricsReach(cluster.metrics_port,
                     {{Label("tandem_num_requests_waiting", "prefill"), 0},
                      {Label("tandem_kv_cache_usage_ratio", "prefill"), 0}},
                     1s));
  CHECK(MetricsReach(cluster.colocated_metrics_port,
                     {{Label("tandem_num_requests_running", "colocated"), 0},
                      {Label("tandem_num_requests_waiting", "colocated"), 0},
                      {Label("tandem_kv_cache_usage_ratio", "colocated"), 0}},
                     1s));
  CHECK(prefill.Terminate(10s) == 0);
  CHECK(colocated.Terminate(10s) == 0);
}

TEST_CASE("instance faults: a KV transport message prefill's publisher cannot take is refused",
          "[instances]") {
  // The message nccl's pullers send (KvTransport: a pull order); this prefill moves KV with ucx,
  // whose publisher takes none: it says so in its log and serves on.
  Cluster cluster("  kv_blocks: 12\n", false);
  Child prefill(cluster.Args("prefill"), cluster.Log("prefill"));
  FakeRouter router;
  const int p = router.Connect(cluster.prefill_port, 30s, 0x73);
  router.Send(p, KvTransport{"forged", std::string("not an order")});
  const std::string nowhere = "127.0.0.1:" + std::to_string(FreePort());
  router.Send(p, Greedy("after", Prompt(8, 3), 4, nowhere));
  Inbox& inbox = router.inbox;
  REQUIRE(inbox.WaitFor(20s, [&] { return !inbox.finishes["after"].empty(); }));
  CHECK(inbox.finishes["after"][0].code == StatusCode::kUnavailable);  // decode unreachable
  std::ifstream log(cluster.Log("prefill"));
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  INFO(text);
  CHECK(text.find("[req=forged]") != std::string::npos);
  CHECK(text.find("KV transport message refused: FailedPrecondition: transport 'ucx") !=
        std::string::npos);
  CHECK(text.find("takes no messages from its pullers") != std::string::npos);
  CHECK(prefill.Terminate(10s) == 0);
}

TEST_CASE("instance faults: load reports follow control.heartbeat_interval_s", "[instances]") {
  Cluster cluster("  kv_blocks: 12\n", false, "control:\n  heartbeat_interval_s: 0.5\n");
  Child prefill(cluster.Args("prefill"), cluster.Log("prefill"));
  FakeRouter router;
  const int p = router.Connect(cluster.prefill_port);
  Inbox& inbox = router.inbox;
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.load_count[p] >= 1; }));
  int before = 0;
  {
    std::lock_guard<std::mutex> lock(inbox.mutex);
    before = inbox.load_count[p];
  }
  std::this_thread::sleep_for(2100ms);
  std::lock_guard<std::mutex> lock(inbox.mutex);
  const int reports = inbox.load_count[p] - before;
  CHECK(reports >= 3);
  CHECK(reports <= 6);  // 0.5 s apart, not 0.1 s
}

// What a killed instance's pool may leave: a POSIX segment in /dev/shm that nobody has open,
// and a SysV segment whose creator died without removing it.
struct Leftovers {
  std::string file;
  int sysv_id = -1;

  Leftovers() {
    file = "/dev/shm/ucx_posix_tandem_test_" + std::to_string(getpid());
    std::ofstream(file) << std::string(4096, 'k');
    int ids[2];
    REQUIRE(pipe(ids) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      int id = shmget(IPC_PRIVATE, 1 << 20, IPC_CREAT | 0600);
      ssize_t n = write(ids[1], &id, sizeof(id));
      _exit(n == sizeof(id) ? 0 : 1);
    }
    REQUIRE(read(ids[0], &sysv_id, sizeof(sysv_id)) == sizeof(sysv_id));
    waitpid(child, nullptr, 0);
    close(ids[0]);
    close(ids[1]);
    REQUIRE(sysv_id >= 0);
  }
  ~Leftovers() {
    std::error_code ec;
    fs::remove(file, ec);
    shmctl(sysv_id, IPC_RMID, nullptr);
  }
  bool sysv_exists() const {
    struct shmid_ds ds {};
    return shmctl(sysv_id, IPC_STAT, &ds) == 0;
  }
};

// The SysV segments that process `pid` created and that still exist.
std::vector<std::string> SegmentsOf(pid_t pid) {
  std::vector<std::string> found;
  struct shm_info info {};
  const int max_index = shmctl(0, SHM_INFO, reinterpret_cast<struct shmid_ds*>(&info));
  for (int index = 0; index <= max_index; ++index) {
    struct shmid_ds ds {};
    const int id = shmctl(index, SHM_STAT, &ds);
    if (id >= 0 && ds.shm_cpid == pid) found.push_back("sysv " + std::to_string(id));
  }
  return found;
}

TEST_CASE("instance faults: shared memory of a killed instance is gone after the next start",
          "[instances]") {
  Leftovers leftovers;
  Cluster cluster("  kv_blocks: 12\n", false);  // transfer ucx: the pools are UCX-allocated
  auto wait_serving = [&] {
    FakeRouter router;
    const int p = router.Connect(cluster.prefill_port);
    REQUIRE(router.inbox.WaitFor(10s, [&] { return router.inbox.load_count[p] >= 1; }));
  };
  auto first = std::make_unique<Child>(cluster.Args("prefill"), cluster.Log("prefill"));
  wait_serving();
  CHECK_FALSE(fs::exists(leftovers.file));
  CHECK_FALSE(leftovers.sysv_exists());
  const pid_t dead = first->pid();
  first->Kill();  // SIGKILL: no clean exit
  Child second(cluster.Args("prefill"), cluster.Log("prefill-2"));
  wait_serving();
  CHECK(SegmentsOf(dead).empty());
  const pid_t clean = second.pid();
  CHECK(second.Terminate(10s) == 0);
  CHECK(SegmentsOf(clean).empty());
}

}  // namespace
}  // namespace tandem
