// The instances' /metrics and /health endpoint on the shared HTTP server.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>

#include "common/net/metrics_http.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

std::string Get(int port, const std::string& path, const std::string& method = "GET") {
  test::CommandResult r = test::RunCommand("curl -s -S --max-time 5 -X " + method +
                                           " -w ' %{http_code}' 'http://127.0.0.1:" +
                                           std::to_string(port) + path + "'");
  return r.output;
}

// One GET on a raw socket, read until the server closes (at most 5 s).
std::string ReadToEof(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    std::string request = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
    if (::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

TEST_CASE("metrics endpoint: /metrics, /health, 404 and 405 on the shared server", "[http]") {
  std::atomic<bool> healthy{true};
  auto server = MetricsHttpServer::Start(
      "127.0.0.1", 0, [] { return std::string("tandem_up 1\n"); },
      [&]() -> Status { return healthy ? Status::Ok() : Unavailable("draining"); });
  REQUIRE(server.ok());
  int port = (*server)->port();
  CHECK(port > 0);
  CHECK(Get(port, "/metrics") == "tandem_up 1\n 200");
  CHECK(Get(port, "/health") == "ok\n 200");
  healthy = false;
  std::string down = Get(port, "/health");
  CHECK(down.find("draining") != std::string::npos);
  CHECK(down.substr(down.size() - 3) == "503");
  std::string missing = Get(port, "/nothing");
  CHECK(missing.substr(missing.size() - 3) == "404");
  std::string post = Get(port, "/metrics", "POST");
  CHECK(post.substr(post.size() - 3) == "405");
  // One response per connection: a client that reads to EOF gets it at once.
  auto start = std::chrono::steady_clock::now();
  std::string raw = ReadToEof(port, "/metrics");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
  CHECK(raw.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(raw.find("Connection: close") != std::string::npos);
  CHECK(raw.find("tandem_up 1") != std::string::npos);
  // A taken port is refused with Unavailable.
  auto clash = MetricsHttpServer::Start("127.0.0.1", port, [] { return std::string(); },
                                        [] { return Status::Ok(); });
  CHECK(clash.status().code() == StatusCode::kUnavailable);
  (*server)->Stop();
  (*server)->Stop();  // idempotent
}

}  // namespace
}  // namespace tandem
