#include "common/net/metrics_http.h"

#include <chrono>
#include <utility>

#include "common/net/http_server.h"

namespace tandem {

namespace {

constexpr auto kRequestTimeout = std::chrono::seconds(5);

}  // namespace

struct MetricsHttpServer::Impl {
  explicit Impl(HttpServerOptions options) : server(std::move(options)) {}
  HttpServer server;
};

StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& host,
                                                                      int port, TextFn metrics,
                                                                      HealthFn health) {
  if (port < 0 || port > 65535)
    return InvalidArgument("metrics endpoint: port " + std::to_string(port) + " out of range");
  HttpServerOptions options;
  options.host = host;
  options.port = static_cast<uint16_t>(port);
  options.io_threads = 1;
  options.max_body_bytes = 0;  // GET only
  options.keep_alive = false;  // one response per connection: simple scrapers read to EOF
  options.read_timeout = kRequestTimeout;
  options.request_timeout = kRequestTimeout;
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  server->impl_ = std::make_unique<Impl>(std::move(options));
  HttpServer& http = server->impl_->server;
  // Rendering reads the registry under its own lock and never blocks on the engine: cheap
  // enough for the io thread.
  http.AddRoute("GET", "/metrics", [metrics = std::move(metrics)](auto exchange) {
    exchange->Respond(
        HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", metrics(), {}});
  });
  http.AddRoute("GET", "/health", [health = std::move(health)](auto exchange) {
    Status s = health();
    exchange->Respond(s.ok() ? HttpResponse{200, "text/plain", "ok\n", {}}
                             : HttpResponse{503, "text/plain", s.ToString() + "\n", {}});
  });
  if (Status s = http.Start(); !s.ok()) return s.WithContext("metrics endpoint");
  server->port_ = http.port();
  return server;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (impl_) impl_->server.Stop(std::chrono::milliseconds(500));
}

}  // namespace tandem
