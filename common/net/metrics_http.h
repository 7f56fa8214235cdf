// An instance's HTTP endpoint: GET /metrics (Prometheus text) and GET /health, on the shared
// HTTP server (common/net/http_server.h) with one io thread of its own. Every connection gets
// one response and is closed; requests are bounded (64 KiB of headers, no body) and must arrive
// and be answered within 5 s; other paths get 404, other methods 405 (text/plain).
//
// Threads: Start/Stop from one controlling thread; the callbacks run on the endpoint's thread,
// must not block, and must be thread-safe with respect to the engine (MetricsRegistry::Render
// is).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/base/status.h"

namespace tandem {

class MetricsHttpServer {
 public:
  using TextFn = std::function<std::string()>;
  // Health: OK -> 200 "ok"; an error -> 503 with its message.
  using HealthFn = std::function<Status()>;

  // Binds host:port (0 = ephemeral) and starts serving. Unavailable when the port is taken,
  // InvalidArgument for a bad host or port.
  static StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, int port,
                                                            TextFn metrics, HealthFn health);
  ~MetricsHttpServer();  // Stop()
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }
  // Stops accepting, lets answers in flight finish (bounded), closes the connections and joins
  // the thread. Idempotent.
  void Stop();

 private:
  struct Impl;
  MetricsHttpServer() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace tandem
