// HttpServer's connection cap (common/net/http_server.h, max_connections): idle connections that
// hold the server full get newcomers a 503, not a hang, and the server recovers when they go.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "common/net/http_server.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

// A connected socket to 127.0.0.1:port (-1 on failure); reads time out after 5 s.
int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends GET /health on a new connection and returns everything read until the server closes.
std::string Get(int port) {
  int fd = Connect(port);
  if (fd < 0) return "";
  const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  (void)::write(fd, request.data(), request.size());
  std::string out;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

TEST_CASE("HTTP server: beyond max_connections a newcomer gets 503 and the server recovers",
          "[http]") {
  HttpServerOptions options;
  options.max_connections = 8;
  HttpServer server(options);
  server.AddRoute("GET", "/health", [](std::shared_ptr<HttpExchange> exchange) {
    exchange->Respond({200, "text/plain", "ok\n", {}});
  });
  REQUIRE(server.Start().ok());
  const int port = server.port();
  REQUIRE(Get(port).find("200 OK") != std::string::npos);

  // Eight idle connections that never send a request hold every slot.
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(Connect(port));
    REQUIRE(idle.back() >= 0);
  }
  std::string refused;
  for (int attempt = 0; attempt < 50; ++attempt) {  // until the server has seen all eight
    refused = Get(port);
    if (refused.find("503") != std::string::npos) break;
    std::this_thread::sleep_for(20ms);
  }
  CHECK(refused.find("HTTP/1.1 503 Service Unavailable") == 0);
  CHECK(refused.find("Retry-After: 1") != std::string::npos);
  CHECK(refused.find("too many connections") != std::string::npos);

  for (int fd : idle) ::close(fd);
  bool served = false;
  for (int attempt = 0; attempt < 100 && !served; ++attempt) {
    std::this_thread::sleep_for(20ms);
    served = Get(port).find("200 OK") != std::string::npos;
  }
  CHECK(served);
  server.Stop(1s);
}

}  // namespace
}  // namespace tandem
