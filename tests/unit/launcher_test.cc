// `tandem up`'s start-up checks, its config snapshot and its non-blocking health probe, as plain
// functions (cli_test drives the binary).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cluster/launcher.h"
#include "cluster/launcher_checks.h"
#include "cluster/launcher_probe.h"
#include "common/config/config.h"
#include "test_util.h"

using namespace tandem;

namespace {

ClusterConfig Parse(const std::string& yaml) {
  StatusOr<ClusterConfig> config = ParseConfig(yaml, "up.yaml");
  REQUIRE(config.ok());
  return *config;
}

std::string LayoutError(const std::string& yaml) {
  Status s = CheckClusterLayout(Parse(yaml));
  return s.ok() ? "" : s.message();
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A socket listening on 127.0.0.1 (an ephemeral port); closed with the object.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd, 8) == 0);
    socklen_t size = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &size);
    port = ntohs(addr.sin_port);
  }
  ~Listener() { ::close(fd); }
};

HttpProbe::Result Finish(HttpProbe& probe, std::chrono::seconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (probe.Poll() == HttpProbe::kPending && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return probe.result();
}

}  // namespace

TEST_CASE("launcher: a cluster without instances, or half a pair, is refused", "[launcher]") {
  CHECK(Has(LayoutError("prefill: {instances: 0}\ndecode: {instances: 0}\n"),
            "up.yaml: colocated.instances: the cluster has no instances"));
  CHECK(Has(LayoutError("decode:\n  instances: 0\n"),
            "up.yaml:2:14: decode.instances: is 0, so the prefill instances' requests"));
  CHECK(Has(LayoutError("prefill: {instances: 0}\n"), "prefill.instances: is 0"));
  CHECK(LayoutError("").empty());
  CHECK(LayoutError("prefill: {instances: 0}\ndecode: {instances: 0}\ncolocated: {instances: 2}\n")
            .empty());
}

TEST_CASE("launcher: NCCL needs prefill and decode on different GPUs of this machine",
          "[launcher]") {
  const std::string nccl = "transfer: {backend: nccl}\n";
  CHECK(Has(LayoutError(nccl + "prefill: {device: cuda}\ndecode: {device: cuda}\n"),
            "transfer.backend: nccl needs prefill and decode on different GPUs"));
  CHECK(Has(LayoutError(nccl + "prefill: {device: cuda, cuda_devices: [0]}\n"
                               "decode: {device: cuda, instances: 2, cuda_devices: [1, 0]}\n"),
            "decode.cuda_devices: GPU '0' is also a prefill instance's"));
  // Tensor parallelism: decode's ranks on GPUs 1 and 2, prefill's on 0.
  CHECK(LayoutError(nccl + "prefill: {device: cuda, cuda_devices: [0]}\n"
                           "decode: {device: cuda, tensor_parallel: 2, cuda_devices: [1, 2]}\n")
            .empty());
  // cuda_ipc shares a GPU between them.
  CHECK(LayoutError("transfer: {backend: cuda_ipc}\nprefill: {device: cuda}\n"
                    "decode: {device: cuda}\n")
            .empty());
}

TEST_CASE("launcher: instances sharing a GPU must leave room for each other's KV pools",
          "[launcher]") {
  const std::string ipc = "transfer: {backend: cuda_ipc}\n";
  // Both inherit the launcher's GPU: 2 x 0.6 of it.
  const std::string error = LayoutError(ipc + "kv_cache:\n  memory_fraction: 0.6\n"
                                              "prefill: {device: cuda}\ndecode: {device: cuda}\n");
  CHECK(Has(error, "up.yaml:3:20: kv_cache.memory_fraction: 0.6 for each of the 2 instances on "
                   "the launcher's GPU 0 (prefill-0, decode-0) adds up to 1.20 of its memory"));
  CHECK(Has(error, "lower it to 0.45 or less"));
  // The README's example: 0.4 each.
  CHECK(LayoutError(ipc + "kv_cache: {memory_fraction: 0.4}\n"
                          "prefill: {device: cuda}\ndecode: {device: cuda}\n")
            .empty());
  // GPUs of their own.
  CHECK(LayoutError(ipc + "kv_cache: {memory_fraction: 0.8}\n"
                          "prefill: {device: cuda, cuda_devices: [0]}\n"
                          "decode: {device: cuda, cuda_devices: [1]}\n")
            .empty());
  // Three decode instances over two GPUs: GPU 0 holds decode-0 and decode-2 beside prefill-0.
  CHECK(Has(LayoutError(ipc + "kv_cache: {memory_fraction: 0.35}\n"
                              "prefill: {device: cuda, cuda_devices: [0]}\n"
                              "decode: {device: cuda, instances: 3, cuda_devices: [0, 1]}\n"),
            "0.35 for each of the 3 instances on GPU 0 (prefill-0, decode-0, decode-2)"));
  // Pools sized in blocks are not a share of the GPU (start-up checks them against it).
  CHECK(LayoutError(ipc + "kv_cache: {memory_fraction: 0.6}\n"
                          "prefill: {device: cuda, kv_blocks: 1000}\ndecode: {device: cuda}\n")
            .empty());
  // CPU instances share the machine's memory: CheckKvMemory's part.
  CHECK(LayoutError("kv_cache: {memory_fraction: 0.6}\n").empty());
}

TEST_CASE("launcher: router.host must be an address this machine can listen on", "[launcher]") {
  CHECK(Has(LayoutError("router:\n  host: localhost\n"),
            "up.yaml:2:9: router.host: 'localhost' is not an IP address"));
  CHECK(Has(LayoutError("router: {host: 300.1.2.3}\n"), "router.host: '300.1.2.3' is not"));
  // TEST-NET-1: a valid address that is not this machine's.
  CHECK(Has(LayoutError("router: {host: 192.0.2.1}\n"), "router.host: cannot listen on '192.0.2.1'"));
  CHECK(LayoutError("router: {host: 0.0.0.0}\n").empty());
}

TEST_CASE("launcher: two fields or two instances on one port are refused", "[launcher]") {
  CHECK(Has(LayoutError("router: {port: 9000}\nprefill: {port: 9000}\n"),
            "up.yaml:2:17: prefill.port: prefill-0 would listen on port 9000, as the router "
            "(router.port) does"));
  // decode-1 lands on colocated-0's port.
  CHECK(Has(LayoutError("decode: {instances: 2, port: 9100}\ncolocated: {instances: 1, port: 9101}\n"),
            "colocated.port: colocated-0 would listen on port 9101, as decode-1 (decode.port) does"));
  CHECK(Has(LayoutError("prefill: {port: 9200, metrics_port: 9200}\n"),
            "prefill.metrics_port: prefill-0 (metrics) would listen on port 9200"));
  CHECK(Has(LayoutError("decode: {instances: 3, port: 65534}\n"),
            "decode-2 would listen on port 65536, outside [1, 65535]"));
  // Ports left at 0 are picked later.
  CHECK(LayoutError("router: {port: 0}\nprefill: {port: 0}\ndecode: {port: 0}\n").empty());
}

TEST_CASE("launcher: a port another process holds is refused with its field", "[launcher]") {
  Listener taken;
  const std::string yaml = "router:\n  port: " + std::to_string(taken.port) + "\n";
  Status s = CheckPortsFree(Parse(yaml));
  REQUIRE_FALSE(s.ok());
  CHECK(Has(s.message(), "up.yaml:2:9: router.port: the router cannot listen on 127.0.0.1:" +
                             std::to_string(taken.port)));
  CHECK(CheckPortsFree(Parse("router: {port: 0}\n")).ok());
}

TEST_CASE("launcher: the KV pools of all instances must fit the machine together", "[launcher]") {
  const KvLayout layout{2, 2, 64, 16};  // 32 KiB per block
  ClusterConfig config = Parse("prefill: {instances: 2, kv_blocks: 10000}\ndecode: {instances: 2}\n");
  // 2 x 10000 blocks = 625 MiB of prefill pools + 2 x 5% of the machine.
  CHECK(CheckKvMemory(config, layout, uint64_t{8} << 30).ok());
  Status s = CheckKvMemory(config, layout, uint64_t{700} << 20);
  REQUIRE_FALSE(s.ok());
  CHECK(Has(s.message(), "prefill.kv_blocks: the KV pools of the 4 instance(s) take"));
  // One pool below a request of max_model_len fails as KvPoolBlocks says.
  ClusterConfig tight = Parse("kv_cache: {memory_fraction: 0.0001}\n");
  CHECK(Has(CheckKvMemory(tight, layout, uint64_t{1} << 30).message(),
            "kv_cache.memory_fraction: the prefill KV pool holds"));
  // A colocated pool on a GPU does not count against the host's memory.
  ClusterConfig gpu = Parse(
      "prefill: {instances: 0}\ndecode: {instances: 0}\n"
      "colocated: {instances: 1, device: cuda, kv_blocks: 100000}\n");
  CHECK(CheckKvMemory(gpu, layout, uint64_t{700} << 20).ok());
  gpu.colocated.device = "cpu";
  CHECK_FALSE(CheckKvMemory(gpu, layout, uint64_t{700} << 20).ok());
}

TEST_CASE("launcher: the snapshot reads the same from any directory", "[launcher]") {
  ClusterConfig config = Parse(
      "model: {path: models/tiny}\nrouter: {latency_model: lm.yaml, api_keys_file: keys}\n");
  config.source = "/etc/tandem/up.yaml";
  ClusterConfig snapshot = SnapshotConfig(config);
  CHECK(snapshot.model.path == (std::filesystem::current_path() / "models/tiny").string());
  CHECK(snapshot.model.name == "tiny");
  CHECK(snapshot.router.latency_model == "/etc/tandem/lm.yaml");
  CHECK(snapshot.router.api_keys_file == "/etc/tandem/keys");
  StatusOr<ClusterConfig> again = ParseConfig(ConfigToYaml(snapshot), "snapshot.yaml");
  REQUIRE(again.ok());
  CHECK(again->model.path == snapshot.model.path);
}

TEST_CASE("launcher: the health probe ends on an answer, a refusal or silence", "[launcher]") {
  SECTION("a listener that never answers: failed after the timeout, without blocking") {
    Listener silent;
    HttpProbe probe;
    const auto start = std::chrono::steady_clock::now();
    probe.Start("127.0.0.1", silent.port, "/health", 0.3);
    CHECK(probe.Poll() == HttpProbe::kPending);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(100));
    CHECK(Finish(probe, std::chrono::seconds(5)) == HttpProbe::kFailed);
    CHECK(Has(probe.error(), "no answer within 0.3 s"));
    CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(300));
  }
  SECTION("nothing listens: failed") {
    int port = 0;
    { Listener gone; port = gone.port; }
    HttpProbe probe;
    probe.Start("127.0.0.1", port, "/health", 2);
    CHECK(Finish(probe, std::chrono::seconds(5)) == HttpProbe::kFailed);
  }
  SECTION("a 200 and a 503") {
    for (const std::string status : {"200 OK", "503 Service Unavailable"}) {
      Listener server;
      HttpProbe probe;
      probe.Start("127.0.0.1", server.port, "/ready", 5);
      std::thread answer([&] {
        int conn = ::accept(server.fd, nullptr, nullptr);
        char buffer[512];
        (void)::recv(conn, buffer, sizeof buffer, 0);
        const std::string reply = "HTTP/1.1 " + status + "\r\nContent-Length: 0\r\n\r\n";
        (void)::send(conn, reply.data(), reply.size(), MSG_NOSIGNAL);
        ::close(conn);
      });
      const HttpProbe::Result result = Finish(probe, std::chrono::seconds(5));
      answer.join();
      CHECK(result == (status[0] == '2' ? HttpProbe::kOk : HttpProbe::kFailed));
    }
  }
}

TEST_CASE("launcher: WhoListensOn tells which process holds a port", "[launcher]") {
  Listener mine;
  CHECK(WhoListensOn(::getpid(), mine.port) == PortHolder::kThisProcess);
  CHECK(WhoListensOn(::getppid(), mine.port) == PortHolder::kOtherProcess);
}

TEST_CASE("launcher: WhoListensOn cannot tell where /proc does not list the listener",
          "[launcher]") {
  // A /proc of its own: what a sandboxed kernel may show instead of Linux's tables.
  test::TempDir proc;
  auto write = [&](const std::string& path, const std::string& text) {
    std::filesystem::create_directories((proc.path() / path).parent_path());
    std::ofstream(proc.path() / path) << text;
  };
  const std::string header =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
      "timeout inode\n";
  // Port 8080 (1F90) listening (0A) with inode 4242; port 8081 (1F91) only connected (01).
  const std::string listening =
      "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        "
      "0 4242 1 0000000000000000 100 0 0 10 0\n"
      "   1: 0100007F:1F91 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        "
      "0 4343 1 0000000000000000 20 4 30 10 -1\n";
  const std::filesystem::path fd = proc.path() / "77" / "fd";

  SECTION("no socket tables") {
    std::filesystem::create_directories(fd);
    std::filesystem::create_symlink("socket:[4242]", fd / "3");
    CHECK(WhoListensOn(77, 8080, proc.path()) == PortHolder::kUnknown);
  }
  SECTION("tables that list no listener on the port") {
    write("net/tcp", header + listening);
    write("net/tcp6", header);
    std::filesystem::create_directories(fd);
    CHECK(WhoListensOn(77, 8081, proc.path()) == PortHolder::kUnknown);
    CHECK(WhoListensOn(77, 9000, proc.path()) == PortHolder::kUnknown);
  }
  SECTION("a listener, and the process's fds unreadable") {
    write("net/tcp", header + listening);
    CHECK(WhoListensOn(77, 8080, proc.path()) == PortHolder::kUnknown);
  }
  SECTION("a listener the process holds, or does not") {
    write("net/tcp6", header + listening);  // either table counts
    std::filesystem::create_directories(fd);
    std::filesystem::create_symlink("/dev/null", fd / "0");
    std::filesystem::create_symlink("socket:[4343]", fd / "3");
    CHECK(WhoListensOn(77, 8080, proc.path()) == PortHolder::kOtherProcess);
    std::filesystem::create_symlink("socket:[4242]", fd / "4");
    CHECK(WhoListensOn(77, 8080, proc.path()) == PortHolder::kThisProcess);
  }
}
