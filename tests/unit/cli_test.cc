// Drives the real `tandem` binary: help, version, exit codes, config errors.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "common/base/flags.h"
#include "common/config/serving_config.h"
#include "test_util.h"
#include "tests/tandem_binary.h"

using namespace tandem;

namespace {
test::CommandResult Tandem(const std::string& args) {
  return test::RunCommand("timeout 60 " + std::string(test::TandemBinary()) + " " + args);
}
}  // namespace

TEST_CASE("cli: --help and --version exit 0", "[cli]") {
  test::CommandResult help = Tandem("--help");
  CHECK(help.exit_code == 0);
  CHECK(help.output.find("usage: tandem <command>") != std::string::npos);
  CHECK(help.output.find("make-model") != std::string::npos);
  test::CommandResult version = Tandem("--version");
  CHECK(version.exit_code == 0);
  CHECK(version.output.rfind("tandem ", 0) == 0);
  // What the binary and its libraries can do: the CUDA backend, and UCX's memory types.
  CHECK(version.output.find("\nCUDA backend: ") != std::string::npos);
  CHECK(version.output.find("\nUCX ") != std::string::npos);
  CHECK(version.output.find("memory types host") != std::string::npos);
}

TEST_CASE("cli: subcommand --help exits 0", "[cli]") {
  test::CommandResult help = Tandem("check-config --help");
  CHECK(help.exit_code == 0);
  CHECK(help.output.find("usage: tandem check-config") != std::string::npos);
}

TEST_CASE("cli: unknown commands and flags exit 2 with a message", "[cli]") {
  test::CommandResult no_args = Tandem("");
  CHECK(no_args.exit_code == 2);
  test::CommandResult command = Tandem("fly");
  CHECK(command.exit_code == 2);
  CHECK(command.output.find("unknown command 'fly'") != std::string::npos);
  test::CommandResult flag = Tandem("--frobnicate");
  CHECK(flag.exit_code == 2);
  CHECK(flag.output.find("unknown flag '--frobnicate'") != std::string::npos);
  test::CommandResult sub_flag = Tandem("check-config --nope x.yaml");
  CHECK(sub_flag.exit_code == 2);
  CHECK(sub_flag.output.find("unknown flag --nope") != std::string::npos);
}

TEST_CASE("cli: check-config reports file:line:field and exits 1", "[cli]") {
  test::TempDir dir;
  std::string bad = dir.Write("bad.yaml", "decode:\n  max_batch_size: -3\n");
  test::CommandResult result = Tandem("check-config " + bad);
  CHECK(result.exit_code == 1);
  CHECK(result.output.find(bad + ":2:19: decode.max_batch_size: must be an integer") !=
        std::string::npos);
  std::string good = dir.Write("good.yaml", "router:\n  port: 8123\n");
  test::CommandResult ok = Tandem("check-config " + good + " --decode.max_batch_size=12");
  CHECK(ok.exit_code == 0);
  CHECK(ok.output.find("port: 8123") != std::string::npos);
  CHECK(ok.output.find("max_batch_size: 12") != std::string::npos);
}

TEST_CASE("cli: up and check-config stop on a latency model the router cannot use", "[cli]") {
  test::TempDir dir;
  // Ports 0: nothing is bound before the check. `timeout` bounds the old behaviour (the
  // launcher restarting the router with back-off for ever).
  std::string config = dir.Write(
      "cluster.yaml",
      "router: {port: 0, latency_model: missing-lm.yaml}\nprefill: {port: 0}\n"
      "decode: {port: 0}\ncolocated: {instances: 0}\n");
  test::CommandResult result = Tandem("up " + config);
  CHECK(result.exit_code == 1);
  CHECK(result.output.find("router.latency_model") != std::string::npos);
  CHECK(result.output.find("missing-lm.yaml") != std::string::npos);
  // check-config says the same.
  test::CommandResult check = Tandem("check-config " + config);
  CHECK(check.exit_code == 1);
  CHECK(check.output.find("missing-lm.yaml") != std::string::npos);
}

TEST_CASE("flags: parsing of values, booleans, positionals and overrides", "[cli]") {
  FlagParser flags("t", "s");
  flags.AddInt("n", 3, "count");
  flags.AddDouble("rate", 1.5, "rate");
  flags.AddString("out", "", "dir");
  flags.AddBool("verbose", "talk");
  flags.AllowConfigOverrides();
  REQUIRE(flags.Parse({"--n=7", "--rate", "2.25", "pos", "--verbose", "--decode.threads=2",
                       "--out", "d"}).ok());
  CHECK(flags.GetInt("n") == 7);
  CHECK(flags.GetDouble("rate") == 2.25);
  CHECK(flags.GetString("out") == "d");
  CHECK(flags.GetBool("verbose"));
  CHECK(flags.positional() == std::vector<std::string>{"pos"});
  CHECK(flags.config_overrides() == std::vector<std::string>{"decode.threads=2"});
  FlagParser strict("t", "s");
  strict.AddInt("n", 3, "count");
  CHECK(strict.Parse({"--n=x"}).message() == "flag --n takes an integer, got 'x'");
  CHECK(strict.Parse({"--n"}).message() == "flag --n needs a value");
  CHECK(strict.Parse({"--decode.threads=2"}).message() == "unknown flag --decode.threads");
}

TEST_CASE("cli: check-config refuses what no server here runs, naming file:line:field", "[cli]") {
  test::TempDir dir;
  std::string gpu = dir.Write("gpu.yaml", "decode:\n  device: cuda\n  preemption: swap\n");
  test::CommandResult result = Tandem("check-config " + gpu);
  CHECK(result.exit_code == 1);
  // A CUDA build serves decode on cuda (start-up finds whether there is a GPU).
  CHECK((result.output.find(gpu + ":2:11: decode.device: cuda cannot be served by this build") !=
         std::string::npos) == !BuiltWithCuda());
  CHECK(result.output.find(gpu + ":3:15: decode.preemption: swap is not implemented") !=
        std::string::npos);
  std::string twice = dir.Write("twice.yaml", "router:\n  port: 1\n  port: 2\n");
  result = Tandem("check-config " + twice);
  CHECK(result.exit_code == 1);
  CHECK(result.output.find(twice + ":3:3: router.port: duplicate key (first at line 2)") !=
        std::string::npos);
}

namespace {

// An HTTP server on a free 127.0.0.1 port that answers every request "200 OK" (another
// cluster's router, as far as `tandem up` can tell), until destroyed.
class AnsweringServer {
 public:
  AnsweringServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
    socklen_t size = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &size);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        int conn = ::accept(fd_, nullptr, nullptr);
        if (conn < 0) return;  // closed by the destructor
        char buffer[1024];
        (void)::recv(conn, buffer, sizeof buffer, 0);
        const std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        (void)::send(conn, reply.data(), reply.size(), MSG_NOSIGNAL);
        ::close(conn);
      }
    });
  }
  ~AnsweringServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace

TEST_CASE("cli: up stops at start-up naming the field, instead of restarting for ever",
          "[cli]") {
  test::TempDir dir;
  // `timeout 60` bounds the old behaviour (restarting the child, or "ready" from another
  // process, until killed: exit code 124).
  const std::string base = "prefill: {port: 0}\ndecode: {port: 0}\n";
  SECTION("the router port is taken by a server that answers /ready") {
    AnsweringServer other;
    std::string config = dir.Write(
        "taken.yaml", base + "router:\n  port: " + std::to_string(other.port()) + "\n");
    test::CommandResult result = Tandem("up " + config);
    CHECK(result.exit_code == 1);
    CHECK(result.output.find("tandem: ready") == std::string::npos);
    CHECK(result.output.find(config + ":4:9: router.port: the router cannot listen on 127.0.0.1:" +
                             std::to_string(other.port())) != std::string::npos);
  }
  SECTION("no instances") {
    std::string config = dir.Write(
        "empty.yaml", "router: {port: 0}\nprefill: {instances: 0}\ndecode: {instances: 0}\n");
    test::CommandResult result = Tandem("up " + config);
    CHECK(result.exit_code == 1);
    CHECK(result.output.find("colocated.instances: the cluster has no instances") !=
          std::string::npos);
  }
  SECTION("colliding ports") {
    std::string config = dir.Write(
        "collide.yaml", "router: {port: 0}\nprefill: {port: 0, metrics_port: 0}\n"
                        "decode: {instances: 2, port: 24000, metrics_port: 24001}\n");
    test::CommandResult result = Tandem("up " + config);
    CHECK(result.exit_code == 1);
    CHECK(result.output.find(config + ":3:30: decode.port: decode-1 would listen on port 24001, "
                             "as decode-0 (metrics) (decode.metrics_port) does") !=
          std::string::npos);
  }
  SECTION("an unknown UCX transport") {
    std::string config =
        dir.Write("tls.yaml", base + "router: {port: 0}\ntransfer:\n  ucx_tls: tcp,infiniband\n");
    test::CommandResult result = Tandem("up " + config);
    CHECK(result.exit_code == 1);
    CHECK(result.output.find(config + ":5:12: transfer.ucx_tls: 'infiniband' is not a UCX "
                             "transport") != std::string::npos);
  }
  SECTION("a host that is not an address of this machine") {
    std::string config =
        dir.Write("host.yaml", base + "router: {port: 0, host: 'no-such-host.invalid'}\n");
    test::CommandResult result = Tandem("up " + config);
    CHECK(result.exit_code == 1);
    CHECK(result.output.find("router.host: 'no-such-host.invalid' is not an IP address") !=
          std::string::npos);
  }
  SECTION("a device no server here runs") {
    // cuda where this is the CUDA-off build (as CI's is), else a device no build serves.
    const std::string device = BuiltWithCuda() ? "tpu" : "cuda";
    std::string config =
        dir.Write("device.yaml", base + "router: {port: 0}\ncolocated: {device: " + device + "}\n");
    test::CommandResult result = Tandem("up " + config);
    CHECK(result.exit_code == 1);
    CHECK(result.output.find(config + ":4:21: colocated.device: " +
                             (BuiltWithCuda() ? "must be one of cpu|cuda, got 'tpu'"
                                              : "cuda cannot be served by this build: it has no "
                                                "CUDA backend")) != std::string::npos);
  }
}
