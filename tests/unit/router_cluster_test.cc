// The router's HTTP front end over the real ClusterBackend and fake instances (the control
// protocol over TCP): what a client's behaviour turns into on the control plane.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <thread>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "cluster/make_model_cli.h"
#include "common/net/control_channel.h"
#include "router/cluster_backend.h"
#include "tests/test_control.h"
#include "common/net/http_server.h"
#include "router/openai_api.h"
#include "router/router_service.h"
#include "tests/unit/fake_instance.h"
#include "tests/unit/io_thread.h"
#include "tests/unit/test_util.h"
#include "tests/unit/tiny_model.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using test::FakeInstance;
using test::WaitFor;


// Sends `request` on a new connection to 127.0.0.1:port and resets it at once (SO_LINGER 0:
// close sends RST, not FIN).
void SendAndReset(int port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, 0);
    REQUIRE(n > 0);
    sent += static_cast<size_t>(n);
  }
  linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  ::close(fd);
}

std::string StreamingRequest() {
  std::string body = json{{"model", "tiny"},
                          {"prompt", "hello there"},
                          {"stream", true},
                          {"ignore_eos", true},
                          {"max_tokens", 200}}
                         .dump();
  return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

TEST_CASE("router + cluster: a client that resets right after sending is cancelled everywhere",
          "[router]") {
  test::IoThread io;
  FakeInstance p(io.io, InstanceRole::kPrefill, 0), d(io.io, InstanceRole::kDecode, 0);
  ClusterConfig config;
  config.prefill.instances = 1;
  config.prefill.port = p.port();
  config.decode.instances = 1;
  config.decode.port = d.port();
  config.colocated.instances = 0;
  config.router.policy = "round_robin";
  config.source = "test";
  ClusterBackendOptions backend_options;
  backend_options.control = test::TestControlOptions();
  ClusterBackend backend(config, backend_options);
  REQUIRE(backend.Start().ok());
  REQUIRE(WaitFor([&] { return backend.Ready(); }));
  RouterService service(test::TinyServedModel(), &backend);
  HttpServerOptions options;
  options.port = 0;
  HttpServer server(options);
  service.RegisterRoutes(&server);
  REQUIRE(server.Start().ok());

  // Some resets land before the router has read the request (nothing is submitted), some
  // while it tokenizes, some after Submit: whatever reached an instance must be cancelled on
  // both, and the Cancel must follow the Submit.
  constexpr int kClients = 12;
  for (int i = 0; i < kClients; ++i) SendAndReset(server.port(), StreamingRequest());
  REQUIRE(WaitFor([&] { return service.running() == 0 && server.in_flight() == 0; }, 10s));
  // The last Submit may still be on its way: wait for the submits to settle.
  size_t settled = 0;
  WaitFor([&] {
    size_t now = p.submits().size();
    bool same = now == settled;
    settled = now;
    return same;
  }, 1000ms);
  std::vector<tandem::Submit> submitted = p.submits();
  INFO(submitted.size() << " of " << kClients << " requests reached the prefill instance");
  auto cancelled_everywhere = [&](const std::string& id) {
    std::vector<std::string> log = p.log();
    auto at = std::find(log.begin(), log.end(), "submit " + id);
    if (at == log.end() || std::find(at, log.end(), "cancel " + id) == log.end()) return false;
    std::vector<std::string> d_cancels = d.cancels();
    return std::find(d_cancels.begin(), d_cancels.end(), id) != d_cancels.end();
  };
  for (const tandem::Submit& s : submitted) {
    INFO("request " << s.request_id);
    CHECK(WaitFor([&] { return cancelled_everywhere(s.request_id); }, 3000ms));
  }
  server.Stop(1000ms);
  backend.Stop();
}

}  // namespace
}  // namespace tandem
