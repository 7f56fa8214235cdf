// A small async HTTP/1.1 server (Boost.Beast on Boost.Asio), shared by the router's API and the
// instances' /metrics and /health endpoints (common/net/metrics_http.h): keep-alive, body-size
// limit (413), read and request timeouts, routing by method + path, whole responses or
// Server-Sent Event streams (chunked), and detection of a client that goes away while its
// request is in flight. It only moves bytes: handlers must not block or compute (post heavy
// work elsewhere and answer through the HttpExchange).
//
// Errors the server answers itself (unknown route 404, wrong method 405, malformed request 400,
// body too large 413, request timeout 504, max_connections open 503 (plain text, then close), a handler that threw or dropped its exchange 500) are
// rendered by the HttpErrorRenderer when one is set (the router sets its OpenAI error bodies,
// router/errors.h), else as text/plain with the status's message; the HTTP status is the one
// listed here either way.
//
// Threads: Start() runs `io_threads` Asio threads; each connection runs on its own strand, so
// a connection's handlers never run concurrently. Handlers are called on an io thread and must
// not block: they answer through the HttpExchange, now or later from any thread.
//
// Lifecycle: construct, AddRoute..., Start(), Stop(). Stop refuses new connections, closes idle
// ones, waits (bounded) for in-flight exchanges to finish, then aborts what is left (their abort
// callbacks run, so backends are cancelled) and joins the io threads. HttpExchange handles that
// outlive the server are safe to use; they do nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/base/thread_annotations.h"

namespace tandem {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0 = an ephemeral port; see HttpServer::port()
  int io_threads = 2;
  size_t max_body_bytes = 8 << 20;  // larger bodies get 413
  bool keep_alive = true;  // false: every response says Connection: close and the connection ends
  std::chrono::milliseconds read_timeout{30000};      // receiving one request; idle keep-alive
  std::chrono::milliseconds request_timeout{600000};  // handling one request, stream included
  // Connections open at once (lowered to leave file descriptors to the process, as the control
  // listener's cap is); beyond it a new connection gets 503 with Retry-After and is closed, so
  // a flood of idle or slow connections cannot take the descriptors and memory the rest need.
  int max_connections = 4096;
};

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // target without the query string
  std::string query;   // after '?', "" when none
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;

  // Header value or "" when absent; `name` lower-case.
  std::string Header(const std::string& name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

// "data: <payload>\n\n": one Server-Sent Event.
std::string SseEvent(std::string_view payload);
// "data: [DONE]\n\n": the OpenAI stream terminator.
std::string SseDone();

class HttpSession;  // one connection; defined in http_server.cc

// One request and its response. Handed to a handler as a shared_ptr; every method is
// thread-safe. The handler must answer exactly once: Respond(), or StartStream() + Write()* +
// End(). If the last handle is dropped without an answer the client gets a 500. After the
// client disconnects, the request times out, or the server aborts it, every method is a no-op
// (Write returns false) and the abort callback runs once.
class HttpExchange {
 public:
  HttpExchange(std::shared_ptr<HttpSession> session, HttpRequest request);
  ~HttpExchange();
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  const HttpRequest& request() const { return request_; }

  // The whole response. Ignored if the exchange already answered or was aborted.
  void Respond(HttpResponse response);
  // Sends 200 with Content-Type text/event-stream, chunked. Returns false if aborted/answered.
  bool StartStream(std::vector<std::pair<std::string, std::string>> headers = {});
  // Queues one chunk of the stream (usually SseEvent(...)). False once the exchange is aborted
  // or ended: stop producing.
  bool Write(std::string data);
  // Ends the stream (last chunk). The connection then serves the next request (keep-alive).
  void End();

  // Runs `on_abort` once if the exchange is aborted (client gone, request timeout, forced stop)
  // before it finished; runs it at once, in the calling thread, if it already was. The callback
  // runs on an io thread or the caller's: it must not block.
  void SetOnAbort(std::function<void()> on_abort);
  bool aborted() const { return phase_.load() == kAborted; }

 private:
  friend class HttpSession;
  enum Phase { kOpen = 0, kStreaming = 1, kDone = 2, kAborted = 3 };
  // Called on the session's strand.
  void Abort();

  std::shared_ptr<HttpSession> session_;
  HttpRequest request_;
  uint64_t seq_ = 0;  // the session's exchange number; set by the session
  std::atomic<int> phase_{kOpen};
  Mutex mutex_;
  std::function<void()> on_abort_ TANDEM_GUARDED_BY(mutex_);
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;
// Renders an error the server answers itself; its `status` field is replaced by the server's.
using HttpErrorRenderer = std::function<HttpResponse(const Status& status)>;

struct HttpServerState;  // shared by the server and its sessions; defined in http_server.cc

class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();  // Stop() with a short drain
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes `method` + exact `path` to `handler`. Before Start() only. Unknown paths get 404,
  // a known path with another method 405.
  void AddRoute(const std::string& method, const std::string& path, HttpHandler handler);
  // How the server's own errors look (see the top of this file). Before Start() only.
  void SetErrorRenderer(HttpErrorRenderer render);

  // Binds, listens and starts the io threads. Unavailable when the address cannot be bound;
  // FailedPrecondition when already started.
  Status Start();
  // The bound port (after a successful Start()).
  uint16_t port() const { return port_; }

  // Stops accepting, drains in-flight exchanges for up to `drain_timeout`, aborts the rest and
  // joins the io threads. Idempotent; call from any thread except an io thread.
  void Stop(std::chrono::milliseconds drain_timeout = std::chrono::milliseconds(5000));

  // Exchanges accepted and not yet finished (for tests and the drain).
  int in_flight() const;

 private:
  std::shared_ptr<HttpServerState> state_;
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace tandem
