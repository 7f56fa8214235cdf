// The router's request flow behind the HTTP server: validate, template, tokenize, admit,
// submit to a Backend, detokenize incrementally, apply stop strings, stream or collect the
// answer, count usage, and record metrics (role="router", model=<served name>).
//
// Routes (RegisterRoutes):
//   POST /v1/completions, POST /v1/chat/completions   OpenAI API (stream or not)
//   GET  /v1/models                                    the served model
//   GET  /health   200 while the process is up
//   GET  /ready    200 when Backend::Ready(), else 503
//   GET  /metrics  Prometheus text format 0.0.4
//
// API keys (RouterServiceOptions::api_keys, router/api_keys.h): when there are keys, /v1/* (and
// /metrics with metrics_require_api_key) answer only a request whose Authorization header carries
// one; any other gets OpenAI's 401 (router/errors.h) with `WWW-Authenticate: Bearer`, on the io
// thread, before its body is parsed, and counts in tandem_router_unauthorized_requests_total
// {reason="missing"|"invalid"}. /health and /ready stay open.
//
// Every accepted request ends in exactly one of: a complete answer, or an error the client
// sees (HTTP error, or an error event in the stream). A client that disconnects, a request
// timeout, or a stop-string match cancels the backend request (Backend::Cancel).
//
// Threads: the HTTP io threads only move bytes: a generate request's validation, chat template,
// tokenization, admission and Submit run on the service's own worker pool
// (RouterServiceOptions::worker_threads), so that a large prompt never delays another
// connection (/health included). Backend callbacks run on the backend's threads; per request
// state is guarded by its own mutex, and the backend is never called under it. A client that
// goes away at any point is noticed: before Submit its request is dropped, after Submit the
// backend request is cancelled (Backend::Cancel, always after the Submit).
#pragma once

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <functional>
#include <memory>
#include <string>

#include "common/base/metrics.h"
#include "common/net/http_server.h"
#include "router/api_keys.h"
#include "router/backend.h"
#include "router/openai_api.h"
#include "router/traffic_recorder.h"

namespace tandem {

struct RouterServiceOptions {
  int max_concurrent_requests = 1024;  // requests beyond this get 429 + Retry-After
  // Where metrics go; not owned. Null: the service owns a registry whose constant labels are
  // role="router" and model=<served name>. A registry given here should carry those labels.
  MetricsRegistry* metrics = nullptr;
  // Threads that template and tokenize requests and submit them (>= 1).
  int worker_threads = 2;
  // Keys a request must carry; null or empty: the API is open.
  std::shared_ptr<const ApiKeys> api_keys;
  // With keys: /metrics needs one too (router.metrics_require_api_key).
  bool metrics_require_api_key = false;
  // Not owned; null = not recorded. Every validated request's arrival and, when it completes,
  // its lengths (the replica recommendation's input, router/replica_advice.h).
  TrafficRecorder* traffic = nullptr;
  // Test hook: runs on the worker thread just before a request is templated and tokenized.
  std::function<void()> before_tokenize;
};

struct RouterShared;  // state shared with in-flight requests; defined in router_service.cc

class RouterService {
 public:
  // `backend` is not owned and must outlive the service and every request submitted to it (stop
  // the HTTP server, destroy the service (it joins its workers), then stop the backend; or stop
  // the backend first: Submit then fails cleanly). Requests in flight keep the model and metrics
  // alive on their own, so a late backend callback is harmless.
  RouterService(ServedModel model, Backend* backend, RouterServiceOptions options = {});
  ~RouterService();
  RouterService(const RouterService&) = delete;
  RouterService& operator=(const RouterService&) = delete;

  // Adds the routes above to `server`, and its error bodies (router/errors.h) for the errors the
  // server answers itself; call before server->Start(). The handlers post work to
  // the service's workers and hold the service's shared state, not the service.
  void RegisterRoutes(HttpServer* server);

  // Requests admitted and not yet finished.
  int running() const;
  MetricsRegistry& metrics();
  const ServedModel& model() const;

 private:
  std::shared_ptr<RouterShared> shared_;
  boost::asio::thread_pool workers_;  // last: joined first, while shared_ is alive
};

}  // namespace tandem
