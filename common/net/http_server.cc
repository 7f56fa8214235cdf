#include "common/net/http_server.h"

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <deque>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/base/log.h"
#include "common/net/fd_budget.h"
#include "common/net/http_parse.h"

namespace tandem {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

// Bytes a client may pipeline while its previous request streams; beyond this we stop reading
// (and so stop noticing a disconnect until the next write fails).
constexpr size_t kMaxPipelinedBytes = 64 << 10;
// How long an error response may take to reach a client before the connection is dropped.
constexpr std::chrono::milliseconds kLingerTimeout{1000};

std::string ReasonPhrase(int status) {
  if (status == 499) return "Client Closed Request";
  beast::string_view reason = http::obsolete_reason(http::int_to_status(status));
  return std::string(reason.data(), reason.size());
}

std::string Chunk(std::string_view data) {
  std::ostringstream os;
  os << std::hex << data.size() << "\r\n" << data << "\r\n";
  return os.str();
}

}  // namespace

std::string HttpRequest::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

std::string SseEvent(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 8);
  out.append("data: ").append(payload).append("\n\n");
  return out;
}

std::string SseDone() { return "data: [DONE]\n\n"; }

struct HttpServerState {
  explicit HttpServerState(HttpServerOptions opts)
      : options(std::move(opts)), acceptor(net::make_strand(ioc)) {}

  HttpServerOptions options;
  net::io_context ioc;
  tcp::acceptor acceptor;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  // path -> method -> handler; immutable once started.
  std::map<std::string, std::map<std::string, HttpHandler>> routes;
  std::atomic<bool> stopping{false};
  // io threads joined: sessions start no more async operations (they would never complete).
  std::atomic<bool> stopped{false};
  // Accept handlers only (one accept in flight at a time): the last "accept failed" and "too
  // many connections" lines.
  std::chrono::steady_clock::time_point last_accept_error_log{}, last_refusal_log{};
  int max_connections = 0;  // options.max_connections lowered by MaxConnectionsForFds

  // The server's own error answer with `http_status` (see HttpErrorRenderer).
  HttpResponse Error(int http_status, const Status& status) const {
    HttpResponse response =
        render_error ? render_error(status)
                     : HttpResponse{http_status, "text/plain; charset=utf-8",
                                    status.message() + "\n", {}};
    response.status = http_status;
    return response;
  }

  HttpErrorRenderer render_error;  // immutable once started

  Mutex mutex;
  std::condition_variable_any cv;
  int in_flight TANDEM_GUARDED_BY(mutex) = 0;
  uint64_t next_session_id TANDEM_GUARDED_BY(mutex) = 0;
  std::unordered_map<uint64_t, std::weak_ptr<HttpSession>> sessions TANDEM_GUARDED_BY(mutex);
};

// One connection. Every member function below runs on the connection's strand, except the
// constructor and destructor.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(std::shared_ptr<HttpServerState> state, tcp::socket socket, uint64_t id)
      : state_(std::move(state)), id_(id), socket_(std::move(socket)),
        timer_(socket_.get_executor()) {}

  ~HttpSession() {
    MutexLock lock(&state_->mutex);
    state_->sessions.erase(id_);
    state_->cv.notify_all();
  }

  tcp::socket::executor_type executor() { return socket_.get_executor(); }

  // Posts `fn(session)` onto the strand; does nothing once the session is gone.
  template <typename Fn>
  static void PostTo(const std::shared_ptr<HttpSession>& session, Fn fn) {
    std::weak_ptr<HttpSession> weak = session;
    net::post(session->executor(), [weak, fn = std::move(fn)]() mutable {
      if (auto s = weak.lock()) fn(*s);
    });
  }

  void Start() { DoRead(); }

  // ---- from HttpExchange (already on the strand) ----
  void DoRespond(uint64_t seq, HttpResponse response) {
    if (!IsCurrent(seq) || streaming_) return;
    http::response<http::string_body> res;
    res.version(11);
    res.result(static_cast<unsigned>(response.status));
    res.reason(ReasonPhrase(response.status));
    res.set(http::field::server, "tandem");
    res.set(http::field::content_type, response.content_type);
    for (auto& [name, value] : response.headers) res.set(name, value);
    res.keep_alive(keep_alive_);
    res.body() = std::move(response.body);
    res.prepare_payload();
    std::ostringstream os;
    os << res;
    finish_pending_ = true;
    QueueWrite(os.str());
  }

  void DoStartStream(uint64_t seq, std::vector<std::pair<std::string, std::string>> headers) {
    if (!IsCurrent(seq) || streaming_) return;
    streaming_ = true;
    std::string head =
        "HTTP/1.1 200 OK\r\nServer: tandem\r\nContent-Type: text/event-stream\r\n"
        "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
    head += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    for (auto& [name, value] : headers) head += name + ": " + value + "\r\n";
    head += "\r\n";
    QueueWrite(std::move(head));
  }

  void DoWriteChunk(uint64_t seq, std::string data) {
    // An empty chunk would end the body.
    if (!IsCurrent(seq) || !streaming_ || data.empty()) return;
    QueueWrite(Chunk(data));
  }

  void DoEnd(uint64_t seq) {
    if (!IsCurrent(seq) || !streaming_) return;
    finish_pending_ = true;
    QueueWrite("0\r\n\r\n");
  }

  // The handler dropped its last handle without finishing.
  void DoDropped(uint64_t seq, bool was_streaming) {
    if (!IsCurrent(seq)) return;
    TANDEM_LOG(kError) << "HTTP handler for " << path_ << " dropped its exchange unanswered";
    if (was_streaming) {
      DoEnd(seq);
    } else {
      DoRespond(seq, state_->Error(500, Internal("the request was dropped without a response")));
    }
  }

  // ---- from the server ----
  void OnServerStopping() {
    if (!exchange_open_) Close();
  }
  void Close() {
    if (closed_) return;
    closed_ = true;
    AbortExchange();
    timer_.cancel();
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

 private:
  bool IsCurrent(uint64_t seq) const { return !closed_ && exchange_open_ && seq == seq_; }

  void ArmTimer(std::chrono::milliseconds timeout) {
    if (state_->stopped) return;
    uint64_t gen = ++timer_gen_;
    timer_.expires_after(timeout);
    timer_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
      if (ec || gen != self->timer_gen_ || self->closed_) return;
      self->OnTimeout();
    });
  }

  void OnTimeout() {
    if (!exchange_open_ || finish_pending_) {
      Close();  // idle keep-alive, slow upload, or a client that stopped reading
      return;
    }
    TANDEM_LOG(kWarn) << "HTTP request " << path_ << " timed out";
    bool was_streaming = streaming_;
    AbortExchange();  // cancels the work behind it
    HttpResponse error = state_->Error(504, DeadlineExceeded("the request timed out"));
    keep_alive_ = false;
    if (was_streaming) {
      QueueWrite(Chunk(SseEvent(error.body)));
      QueueWrite(Chunk(SseDone()));
      QueueWrite("0\r\n\r\n");
    } else {
      WriteRawError(error);
    }
    close_after_write_ = true;
    ArmTimer(kLingerTimeout);
  }

  // An error response outside any exchange (bad request, body too large, timeout); the
  // connection closes after it.
  void WriteRawError(const HttpResponse& error) {
    http::response<http::string_body> res;
    res.version(11);
    res.result(static_cast<unsigned>(error.status));
    res.reason(ReasonPhrase(error.status));
    res.set(http::field::server, "tandem");
    res.set(http::field::content_type, error.content_type);
    for (auto& [name, value] : error.headers) res.set(name, value);
    res.keep_alive(false);
    res.body() = error.body;
    res.prepare_payload();
    std::ostringstream os;
    os << res;
    close_after_write_ = true;
    QueueWrite(os.str());
  }

  void DoRead() {
    if (closed_) return;
    if (state_->stopping || state_->stopped) {
      Close();
      return;
    }
    parser_.emplace();
    ConfigureRequestParser(*parser_, state_->options.max_body_bytes);
    ArmTimer(state_->options.read_timeout);
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              self->OnHeader(ec);
                            });
  }

  bool HandleReadError(beast::error_code ec) {
    if (!ec) return false;
    if (closed_) return true;
    if (ec == http::error::body_limit) {
      WriteRawError(state_->Error(413, TooLarge("request body exceeds " +
                                                std::to_string(state_->options.max_body_bytes) +
                                                " bytes")));
      ArmTimer(kLingerTimeout);
    } else if (ec.category() == beast::error_code(http::error::end_of_stream).category() &&
               ec != http::error::end_of_stream && ec != http::error::partial_message) {
      WriteRawError(
          state_->Error(400, InvalidArgument("malformed HTTP request: " + ec.message())));
      ArmTimer(kLingerTimeout);
    } else {
      Close();  // eof, reset, timeout
    }
    return true;
  }

  void OnHeader(beast::error_code ec) {
    if (HandleReadError(ec)) return;
    auto& msg = parser_->get();
    if (beast::iequals(msg[http::field::expect], "100-continue")) {
      // curl waits a second for this before sending a large body.
      QueueWrite("HTTP/1.1 100 Continue\r\n\r\n");
    }
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec2, size_t) {
                       self->OnRead(ec2);
                     });
  }

  void OnRead(beast::error_code ec) {
    if (HandleReadError(ec)) return;
    http::request<http::string_body> msg = parser_->release();
    parser_.reset();
    keep_alive_ = msg.keep_alive() && state_->options.keep_alive && !state_->stopping;
    HttpRequest request = ToHttpRequest(std::move(msg));
    path_ = request.path;

    ++seq_;
    exchange_open_ = true;
    streaming_ = false;
    finish_pending_ = false;
    {
      MutexLock lock(&state_->mutex);
      ++state_->in_flight;
    }
    auto exchange = std::make_shared<HttpExchange>(shared_from_this(), std::move(request));
    exchange->seq_ = seq_;
    current_ = exchange;
    ArmTimer(state_->options.request_timeout);
    StartWatch();
    Dispatch(exchange);
  }

  void Dispatch(const std::shared_ptr<HttpExchange>& exchange) {
    const HttpRequest& request = exchange->request();
    auto path_it = state_->routes.find(request.path);
    if (path_it == state_->routes.end()) {
      exchange->Respond(state_->Error(404, NotFound("no route for " + request.path)));
      return;
    }
    auto method_it = path_it->second.find(request.method);
    if (method_it == path_it->second.end()) {
      HttpResponse error = state_->Error(
          405, InvalidArgument("method " + request.method + " not allowed on " + request.path));
      std::string allow;
      for (auto& [method, handler] : path_it->second) allow += (allow.empty() ? "" : ", ") + method;
      error.headers.emplace_back("Allow", allow);
      exchange->Respond(std::move(error));
      return;
    }
    try {
      method_it->second(exchange);
    } catch (const std::exception& e) {
      // Handlers must not throw; if one does, the client still gets an answer.
      TANDEM_LOG(kError) << "HTTP handler for " << request.path << " threw: " << e.what();
      exchange->Respond(state_->Error(500, Internal("internal error")));
    } catch (...) {
      TANDEM_LOG(kError) << "HTTP handler for " << request.path << " threw";
      exchange->Respond(state_->Error(500, Internal("internal error")));
    }
  }

  // While a request is handled, a read stays pending so that a client that goes away is
  // noticed at once (and its request cancelled), not at the next write.
  void StartWatch() {
    if (watching_ || closed_ || state_->stopped) return;
    watching_ = true;
    socket_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->OnWatch(ec, n);
                            });
  }

  void OnWatch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (closed_) return;
    if (!ec) {
      buffer_.commit(n);  // a pipelined request: kept for the next parse
      if (resume_read_) {
        resume_read_ = false;
        DoRead();
      } else if (exchange_open_ && buffer_.size() < kMaxPipelinedBytes) {
        StartWatch();
      }
      return;
    }
    if (ec == net::error::operation_aborted && resume_read_) {
      resume_read_ = false;
      DoRead();
      return;
    }
    Close();  // eof or reset: the client is gone; aborts the exchange
  }

  void QueueWrite(std::string data) {
    if (closed_ || state_->stopped) return;
    out_.push_back(std::move(data));
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    writing_ = true;
    net::async_write(socket_, net::buffer(out_.front()),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->OnWrite(ec);
                     });
  }

  void OnWrite(beast::error_code ec) {
    writing_ = false;
    if (closed_) return;
    if (ec) {
      Close();  // the client is gone
      return;
    }
    out_.pop_front();
    if (!out_.empty()) {
      WriteNext();
    } else if (close_after_write_) {
      // Lingering close: stop sending, then let the peer read the response before the socket
      // closes (closing with unread input would reset the connection and lose it).
      beast::error_code ignored;
      socket_.shutdown(tcp::socket::shutdown_send, ignored);
      if (!watching_) DrainUntilClosed();
    } else if (finish_pending_) {
      OnExchangeDone();
    }
  }

  void DrainUntilClosed() {
    if (closed_ || state_->stopped) return;
    watching_ = true;
    socket_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              self->watching_ = false;
                              if (ec) {
                                self->Close();
                              } else {
                                self->buffer_.consume(self->buffer_.size());
                                self->DrainUntilClosed();
                              }
                            });
  }

  void OnExchangeDone() {
    exchange_open_ = false;
    finish_pending_ = false;
    streaming_ = false;
    current_.reset();
    {
      MutexLock lock(&state_->mutex);
      --state_->in_flight;
      state_->cv.notify_all();
    }
    if (!keep_alive_ || state_->stopping) {
      Close();
    } else if (watching_) {
      resume_read_ = true;
      beast::error_code ignored;
      socket_.cancel(ignored);  // the watch completes, then DoRead
    } else {
      DoRead();
    }
  }

  void AbortExchange() {
    if (!exchange_open_) return;
    exchange_open_ = false;
    finish_pending_ = false;
    {
      MutexLock lock(&state_->mutex);
      --state_->in_flight;
      state_->cv.notify_all();
    }
    std::shared_ptr<HttpExchange> exchange = current_.lock();
    current_.reset();
    if (exchange) exchange->Abort();
  }

  std::shared_ptr<HttpServerState> state_;  // first: outlives the socket and timer
  uint64_t id_;
  tcp::socket socket_;  // its executor is this connection's strand
  net::steady_timer timer_;
  uint64_t timer_gen_ = 0;
  beast::flat_buffer buffer_;
  std::optional<HttpRequestParser> parser_;

  uint64_t seq_ = 0;             // the current exchange
  std::weak_ptr<HttpExchange> current_;
  std::string path_;
  bool exchange_open_ = false;   // counted in state_->in_flight
  bool streaming_ = false;
  bool finish_pending_ = false;  // the last bytes of the response are queued
  bool keep_alive_ = false;
  bool watching_ = false;
  bool resume_read_ = false;     // a watch read was cancelled to start the next request
  bool close_after_write_ = false;
  bool closed_ = false;
  bool writing_ = false;
  std::deque<std::string> out_;
};

// ---- HttpExchange ----

HttpExchange::HttpExchange(std::shared_ptr<HttpSession> session, HttpRequest request)
    : session_(std::move(session)), request_(std::move(request)) {}

HttpExchange::~HttpExchange() {
  int phase = phase_.load();
  if (phase == kOpen || phase == kStreaming) {
    uint64_t seq = seq_;
    bool streaming = phase == kStreaming;
    HttpSession::PostTo(session_, [seq, streaming](HttpSession& s) { s.DoDropped(seq, streaming); });
  }
}

void HttpExchange::Respond(HttpResponse response) {
  int expected = kOpen;
  if (!phase_.compare_exchange_strong(expected, kDone)) return;
  uint64_t seq = seq_;
  HttpSession::PostTo(session_, [seq, r = std::move(response)](HttpSession& s) mutable {
    s.DoRespond(seq, std::move(r));
  });
}

bool HttpExchange::StartStream(std::vector<std::pair<std::string, std::string>> headers) {
  int expected = kOpen;
  if (!phase_.compare_exchange_strong(expected, kStreaming)) return false;
  uint64_t seq = seq_;
  HttpSession::PostTo(session_, [seq, h = std::move(headers)](HttpSession& s) mutable {
    s.DoStartStream(seq, std::move(h));
  });
  return true;
}

bool HttpExchange::Write(std::string data) {
  if (phase_.load() != kStreaming) return false;
  uint64_t seq = seq_;
  HttpSession::PostTo(session_, [seq, d = std::move(data)](HttpSession& s) mutable {
    s.DoWriteChunk(seq, std::move(d));
  });
  return true;
}

void HttpExchange::End() {
  int expected = kStreaming;
  if (!phase_.compare_exchange_strong(expected, kDone)) return;
  uint64_t seq = seq_;
  HttpSession::PostTo(session_, [seq](HttpSession& s) { s.DoEnd(seq); });
}

void HttpExchange::SetOnAbort(std::function<void()> on_abort) {
  {
    MutexLock lock(&mutex_);
    if (phase_.load() != kAborted) {
      on_abort_ = std::move(on_abort);
      return;
    }
  }
  if (on_abort) on_abort();
}

void HttpExchange::Abort() {
  int phase = phase_.load();
  while (phase == kOpen || phase == kStreaming) {
    if (phase_.compare_exchange_weak(phase, kAborted)) break;
  }
  if (phase != kOpen && phase != kStreaming) return;  // already done or aborted
  std::function<void()> on_abort;
  {
    MutexLock lock(&mutex_);
    on_abort = std::move(on_abort_);
    on_abort_ = nullptr;
  }
  if (on_abort) on_abort();
}

// ---- HttpServer ----

namespace {

// Over max_connections: a short 503 (one non-blocking write into an empty send buffer, so a
// peer that never reads cannot stall the acceptor), then close.
void RefuseConnection(HttpServerState& state, tcp::socket socket) {
  const auto now = std::chrono::steady_clock::now();
  if (now - state.last_refusal_log > std::chrono::seconds(10)) {  // one line per burst
    state.last_refusal_log = now;
    TANDEM_LOG(kWarn) << "HTTP server on port " << state.acceptor.local_endpoint().port() << ": "
                      << state.max_connections << " connections open (max_connections): "
                      << "answering new ones 503";
  }
  static constexpr std::string_view kBusy =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
      "Content-Length: 21\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
      "too many connections\n";
  beast::error_code ec;
  socket.non_blocking(true, ec);
  if (!ec) socket.write_some(net::buffer(kBusy.data(), kBusy.size()), ec);
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
}

void DoAccept(const std::shared_ptr<HttpServerState>& state) {
  state->acceptor.async_accept(
      net::make_strand(state->ioc), [state](beast::error_code ec, tcp::socket socket) {
        if (ec) {
          if (ec == net::error::operation_aborted || !state->acceptor.is_open() ||
              state->stopping) {
            return;
          }
          // Out of file descriptors (or memory): the pending connection stays in the backlog,
          // so accepting again at once fails again at once, a busy loop that floods the log.
          const auto now = std::chrono::steady_clock::now();
          if (now - state->last_accept_error_log > std::chrono::seconds(10)) {
            state->last_accept_error_log = now;
            TANDEM_LOG(kWarn) << "accept failed: " << ec.message() << "; retrying every 100 ms";
          }
          auto retry = std::make_shared<net::steady_timer>(state->ioc);
          retry->expires_after(std::chrono::milliseconds(100));
          retry->async_wait([state, retry](beast::error_code) {
            if (!state->stopping && state->acceptor.is_open()) DoAccept(state);
          });
          return;
        }
        if (state->stopping) return;
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);  // SSE chunks are small
        size_t open = 0;
        {
          MutexLock lock(&state->mutex);
          open = state->sessions.size();
        }
        if (open >= static_cast<size_t>(state->max_connections)) {
          RefuseConnection(*state, std::move(socket));
          return DoAccept(state);
        }
        std::shared_ptr<HttpSession> session;
        {
          MutexLock lock(&state->mutex);
          uint64_t id = state->next_session_id++;
          session = std::make_shared<HttpSession>(state, std::move(socket), id);
          state->sessions[id] = session;
        }
        // A strong reference: until its first read is pending nothing else holds the session.
        net::post(session->executor(), [session] { session->Start(); });
        DoAccept(state);
      });
}

template <typename Fn>
void ForEachSession(HttpServerState& state, Fn fn) {
  std::vector<std::shared_ptr<HttpSession>> live;
  {
    MutexLock lock(&state.mutex);
    for (auto& [id, weak] : state.sessions) {
      if (auto s = weak.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) HttpSession::PostTo(s, fn);
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options)
    : state_(std::make_shared<HttpServerState>(std::move(options))) {}

HttpServer::~HttpServer() { Stop(std::chrono::milliseconds(1000)); }

void HttpServer::SetErrorRenderer(HttpErrorRenderer render) {
  TANDEM_CHECK(!started_, "SetErrorRenderer after Start");
  state_->render_error = std::move(render);
}

void HttpServer::AddRoute(const std::string& method, const std::string& path,
                          HttpHandler handler) {
  TANDEM_CHECK(!started_, "AddRoute after Start");
  state_->routes[path][method] = std::move(handler);
}

Status HttpServer::Start() {
  if (started_) return FailedPrecondition("HTTP server already started");
  const HttpServerOptions& options = state_->options;
  if (options.io_threads < 1) return InvalidArgument("io_threads must be at least 1");
  beast::error_code ec;
  net::ip::address address = net::ip::make_address(options.host, ec);
  if (ec) return InvalidArgument("bad listen address '" + options.host + "': " + ec.message());
  tcp::endpoint endpoint(address, options.port);
  tcp::acceptor& acceptor = state_->acceptor;
  std::string where = options.host + ":" + std::to_string(options.port);
  acceptor.open(endpoint.protocol(), ec);
  if (ec) return Unavailable("cannot open a socket for " + where + ": " + ec.message());
  acceptor.set_option(net::socket_base::reuse_address(true), ec);
  acceptor.bind(endpoint, ec);
  if (ec) return Unavailable("cannot bind " + where + ": " + ec.message());
  acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return Unavailable("cannot listen on " + where + ": " + ec.message());
  port_ = acceptor.local_endpoint(ec).port();
  state_->max_connections = MaxConnectionsForFds(std::max(options.max_connections, 1));
  if (state_->max_connections < options.max_connections) {
    TANDEM_LOG(kWarn) << "HTTP server on " << where << ": max_connections "
                      << options.max_connections << " lowered to " << state_->max_connections
                      << " to leave file descriptors to the process (raise ulimit -n)";
  }
  started_ = true;
  state_->work.emplace(state_->ioc.get_executor());
  DoAccept(state_);
  for (int i = 0; i < options.io_threads; ++i) {
    threads_.emplace_back([state = state_] { state->ioc.run(); });
  }
  TANDEM_LOG(kInfo) << "HTTP server listening on " << options.host << ":" << port_;
  return Status::Ok();
}

int HttpServer::in_flight() const {
  MutexLock lock(&state_->mutex);
  return state_->in_flight;
}

void HttpServer::Stop(std::chrono::milliseconds drain_timeout) {
  if (!started_ || stopped_) return;
  stopped_ = true;
  HttpServerState& state = *state_;
  state.stopping = true;
  net::post(state.acceptor.get_executor(), [s = state_] {
    beast::error_code ignored;
    s->acceptor.close(ignored);
  });
  ForEachSession(state, [](HttpSession& s) { s.OnServerStopping(); });
  {
    std::unique_lock<Mutex> lock(state.mutex);
    int left = 0;
    if (!state.cv.wait_for(lock, drain_timeout, [&]() TANDEM_REQUIRES(state.mutex) {
          left = state.in_flight;
          return left == 0;
        })) {
      TANDEM_LOG(kWarn) << "HTTP server: " << left
                        << " requests still running after the drain; aborting them";
    }
  }
  ForEachSession(state, [](HttpSession& s) { s.Close(); });
  {
    // Closed sessions finish their pending operations and go away; a session kept alive by a
    // handler's exchange handle stays listed, hence the bound.
    std::unique_lock<Mutex> lock(state.mutex);
    state.cv.wait_for(lock, std::chrono::milliseconds(500),
                      [&]() TANDEM_REQUIRES(state.mutex) { return state.sessions.empty(); });
  }
  state.stopped = true;
  state.work.reset();
  state.ioc.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
  // Run what the stop left queued (completions of closed sockets) so that their handlers,
  // which hold sessions, are released here rather than leaked in the io_context.
  beast::error_code ignored;
  state.acceptor.close(ignored);
  state.ioc.restart();
  state.ioc.poll();
  TANDEM_LOG(kInfo) << "HTTP server stopped";
}

}  // namespace tandem
