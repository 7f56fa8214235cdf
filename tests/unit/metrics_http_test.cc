// The instances' /metrics and /health endpoint on the shared HTTP server.
#include <catch2/catch.hpp>

#include <atomic>
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
  // A taken port is refused with Unavailable.
  auto clash = MetricsHttpServer::Start("127.0.0.1", port, [] { return std::string(); },
                                        [] { return Status::Ok(); });
  CHECK(clash.status().code() == StatusCode::kUnavailable);
  (*server)->Stop();
  (*server)->Stop();  // idempotent
}

}  // namespace
}  // namespace tandem
