// A minimal HTTP/1.1 endpoint for an instance: GET /metrics (Prometheus text) and GET /health.
// Boost.Beast on one thread of its own. Every connection gets one response and is closed;
// requests are bounded (8 KiB of headers, no body) and must arrive within 5 s.
//
// Threads: Start/Stop from one controlling thread; the callbacks run on the endpoint's thread
// and must be thread-safe with respect to the engine (MetricsRegistry::Render is).
#pragma once

#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/base/status.h"

namespace tandem {

class MetricsHttpServer {
 public:
  using TextFn = std::function<std::string()>;
  // Health: OK -> 200 "ok"; an error -> 503 with its message.
  using HealthFn = std::function<Status()>;

  // Binds host:port (0 = ephemeral) and starts serving. Unavailable when the port is taken.
  static StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, int port,
                                                            TextFn metrics, HealthFn health);
  ~MetricsHttpServer();  // Stop()
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }
  // Stops accepting, drops open connections and joins the thread. Idempotent.
  void Stop();

 private:
  struct Impl;
  MetricsHttpServer() = default;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace tandem
