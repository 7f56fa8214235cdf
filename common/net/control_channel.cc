#include "common/net/control_channel.h"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <chrono>
#include <future>
#include <mutex>

#include "common/base/log.h"
#include "common/net/wire_codec.h"

namespace tandem {

namespace asio = boost::asio;
using asio::ip::tcp;

std::shared_ptr<ControlConnection> ControlConnection::Create(tcp::socket socket,
                                                             const ControlOptions& options,
                                                             bool dialer) {
  return std::shared_ptr<ControlConnection>(
      new ControlConnection(std::move(socket), options, dialer));
}

ControlConnection::ControlConnection(tcp::socket socket, const ControlOptions& options,
                                     bool dialer)
    : socket_(std::move(socket)),
      strand_(asio::make_strand(socket_.get_executor())),
      handshake_timer_(strand_),
      options_(options),
      dialer_(dialer) {
  // An empty secret would let anyone in: the loaders refuse it, so this is a bug.
  TANDEM_CHECK(!options_.secret.empty(), "control connection without a cluster secret");
  boost::system::error_code ec;
  tcp::endpoint remote = socket_.remote_endpoint(ec);
  peer_ = ec ? "?" : remote.address().to_string() + ":" + std::to_string(remote.port());
  socket_.set_option(tcp::no_delay(true), ec);  // tokens are small and latency-bound
}

void ControlConnection::Start(MessageHandler on_message, CloseHandler on_close) {
  on_message_ = std::move(on_message);
  on_close_ = std::move(on_close);
  asio::post(strand_, [self = shared_from_this()] { self->SendChallenge(); });
}

void ControlConnection::SendChallenge() {
  handshake_timer_.expires_after(std::chrono::milliseconds(
      static_cast<int64_t>(options_.handshake_timeout_s * 1000)));
  handshake_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || self->authenticated()) return;
    self->Fail(DeadlineExceeded("control peer " + self->peer_ +
                                " did not complete the handshake within " +
                                std::to_string(self->options_.handshake_timeout_s) + " s"));
  });
  own_nonce_ = NewAuthNonce();
  challenge_out_ = EncodeAuthChallenge(own_nonce_);
  asio::async_write(socket_, asio::buffer(challenge_out_),
                    asio::bind_executor(strand_, [self = shared_from_this()](
                                                     boost::system::error_code ec, size_t) {
                      if (ec) return self->Fail(Unavailable("control handshake with " +
                                                            self->peer_ + ": " + ec.message()));
                      self->ReadChallenge();
                    }));
}

void ControlConnection::ReadChallenge() {
  asio::async_read(socket_, asio::buffer(challenge_in_),
                   asio::bind_executor(strand_, [self = shared_from_this()](
                                                    boost::system::error_code ec, size_t) {
                     if (ec) return self->Fail(Unavailable("control handshake with " +
                                                           self->peer_ + ": " + ec.message()));
                     StatusOr<AuthNonce> nonce = DecodeAuthChallenge(self->challenge_in_);
                     if (!nonce.ok())
                       return self->Fail(PermissionDenied(self->peer_ + ": " +
                                                          nonce.status().message()));
                     self->peer_nonce_ = *nonce;
                     self->SendProof();
                   }));
}

void ControlConnection::SendProof() {
  const AuthNonce& dialer_nonce = dialer_ ? own_nonce_ : peer_nonce_;
  const AuthNonce& listener_nonce = dialer_ ? peer_nonce_ : own_nonce_;
  proof_out_ = MakeAuthProof(options_.secret, dialer_, dialer_nonce, listener_nonce);
  asio::async_write(socket_, asio::buffer(proof_out_),
                    asio::bind_executor(strand_, [self = shared_from_this()](
                                                     boost::system::error_code ec, size_t) {
                      if (ec) return self->Fail(Unavailable("control handshake with " +
                                                            self->peer_ + ": " + ec.message()));
                      self->CheckProof();
                    }));
}

void ControlConnection::CheckProof() {
  asio::async_read(
      socket_, asio::buffer(proof_in_),
      asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code ec,
                                                                size_t) {
        if (ec)
          return self->Fail(Unavailable("control handshake with " + self->peer_ + ": " +
                                        ec.message()));
        const bool peer_dialer = !self->dialer_;
        const AuthNonce& dialer_nonce = self->dialer_ ? self->own_nonce_ : self->peer_nonce_;
        const AuthNonce& listener_nonce = self->dialer_ ? self->peer_nonce_ : self->own_nonce_;
        if (!AuthProofMatches(self->options_.secret, peer_dialer, dialer_nonce, listener_nonce,
                              self->proof_in_))
          return self->Fail(PermissionDenied("control peer " + self->peer_ +
                                             " does not hold the cluster secret"));
        self->Authenticated();
      }));
}

void ControlConnection::Authenticated() {
  handshake_timer_.cancel();
  bool write = false;
  {
    MutexLock lock(&mutex_);
    if (closed_) return;
    authenticated_ = true;
    write = !write_queue_.empty() && !writing_;
    if (write) writing_ = true;
  }
  if (write) WriteNext();
  MaybeCloseFlushed();
  ReadHeader();
}

bool ControlConnection::authenticated() const {
  MutexLock lock(&mutex_);
  return authenticated_;
}

void ControlConnection::ReadHeader() {
  read_buffer_.resize(kFrameHeaderBytes);
  asio::async_read(socket_, asio::buffer(read_buffer_),
                   asio::bind_executor(strand_, [self = shared_from_this()](
                                                    boost::system::error_code ec, size_t) {
                     if (ec) return self->Fail(Unavailable("control connection to " + self->peer_ +
                                                           " closed: " + ec.message()));
                     StatusOr<size_t> size = ControlFrameBytes(ByteSpan(self->read_buffer_));
                     if (!size.ok()) return self->Fail(size.status());
                     self->ReadBody(*size);
                   }));
}

void ControlConnection::ReadBody(size_t frame_bytes) {
  read_buffer_.resize(frame_bytes);
  auto body = asio::buffer(read_buffer_.data() + kFrameHeaderBytes, frame_bytes - kFrameHeaderBytes);
  asio::async_read(socket_, body,
                   asio::bind_executor(strand_, [self = shared_from_this()](
                                                    boost::system::error_code ec, size_t) {
                     if (ec) return self->Fail(Unavailable("control connection to " + self->peer_ +
                                                           " closed: " + ec.message()));
                     StatusOr<ControlMessage> message = DecodeControl(ByteSpan(self->read_buffer_));
                     if (!message.ok())
                       return self->Fail(message.status().WithContext("from " + self->peer_));
                     if (self->on_message_) self->on_message_(std::move(message).value());
                     if (!self->closed()) self->ReadHeader();
                   }));
}

bool ControlConnection::Send(const ControlMessage& message) {
  std::string frame = EncodeControl(message);
  {
    MutexLock lock(&mutex_);
    if (closed_ || close_after_flush_) return false;
    if (queued_bytes_ + frame.size() > options_.max_queued_bytes) {
      asio::post(strand_, [self = shared_from_this()] {
        self->Fail(ResourceExhausted("control peer " + self->peer_ + " reads too slowly: over " +
                                     std::to_string(self->options_.max_queued_bytes) +
                                     " bytes queued"));
      });
      return false;
    }
    queued_bytes_ += frame.size();
    write_queue_.push_back(std::move(frame));
    // Before the handshake is done, frames wait in the queue: Authenticated() starts writing.
    if (writing_ || !authenticated_) return true;
    writing_ = true;
  }
  asio::post(strand_, [self = shared_from_this()] { self->WriteNext(); });
  return true;
}

void ControlConnection::WriteNext() {
  const std::string* front;
  {
    MutexLock lock(&mutex_);
    if (closed_ || write_queue_.empty()) {
      writing_ = false;
      front = nullptr;
    } else {
      front = &write_queue_.front();  // deque keeps element addresses stable on push_back
    }
  }
  if (front == nullptr) return MaybeCloseFlushed();
  asio::async_write(socket_, asio::buffer(*front),
                    asio::bind_executor(strand_, [self = shared_from_this()](
                                                     boost::system::error_code ec, size_t) {
                      if (ec) return self->Fail(Unavailable("write to " + self->peer_ +
                                                            " failed: " + ec.message()));
                      {
                        MutexLock lock(&self->mutex_);
                        if (!self->write_queue_.empty()) {
                          self->queued_bytes_ -= self->write_queue_.front().size();
                          self->write_queue_.pop_front();
                        }
                      }
                      self->WriteNext();
                    }));
}

void ControlConnection::Fail(const Status& reason) {
  CloseHandler on_close;
  {
    MutexLock lock(&mutex_);
    if (closed_) return;
    closed_ = true;
    write_queue_.clear();
    queued_bytes_ = 0;
    on_close = std::move(on_close_);
  }
  handshake_timer_.cancel();
  listener_slot_.reset();
  boost::system::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  on_message_ = nullptr;
  if (on_close) on_close(reason);
}

void ControlConnection::Close() {
  asio::post(strand_, [self = shared_from_this()] {
    self->Fail(Cancelled("control connection to " + self->peer_ + " closed locally"));
  });
}

void ControlConnection::CloseAfterFlush() {
  {
    MutexLock lock(&mutex_);
    if (closed_ || close_after_flush_) return;
    close_after_flush_ = true;
  }
  asio::post(strand_, [self = shared_from_this()] { self->MaybeCloseFlushed(); });
}

void ControlConnection::MaybeCloseFlushed() {
  {
    MutexLock lock(&mutex_);
    // Unauthenticated with frames queued: they leave after the handshake, or never.
    if (!close_after_flush_ || writing_ || !write_queue_.empty()) return;
  }
  Fail(Cancelled("control connection to " + peer_ + " closed after flushing"));
}

bool ControlConnection::closed() const {
  MutexLock lock(&mutex_);
  return closed_;
}

// The listener's state, shared by its accept handlers. `mutex` serialises the handlers with
// Stop(): a handler runs whole under it, and does nothing once `stopped` is set.
struct ControlListener::State {
  State(asio::io_context& io, const ControlOptions& o, AcceptHandler accept)
      : acceptor(io), retry_timer(io), options(o), on_accept(std::move(accept)) {}

  std::mutex mutex;
  bool stopped = false;
  tcp::acceptor acceptor;
  asio::steady_timer retry_timer;  // after a failed accept
  const ControlOptions options;
  const AcceptHandler on_accept;
  std::shared_ptr<std::atomic<int>> open = std::make_shared<std::atomic<int>>(0);
  std::chrono::steady_clock::time_point last_refusal_log{}, last_error_log{}, last_eviction_log{};
  // Accepted connections, oldest first, that had not authenticated when last looked at.
  std::deque<std::weak_ptr<ControlConnection>> unproven;

  // Members (not free functions) so that they may hand a connection its listener slot.
  static void AcceptNext(const std::shared_ptr<State>& state);  // under state->mutex
  static void OnAccepted(const std::shared_ptr<State>& state, boost::system::error_code ec,
                         tcp::socket socket);
  // Closes the oldest accepted connection that has not authenticated; false when there is none.
  static bool EvictOldestUnproven(State& s);
};

bool ControlListener::State::EvictOldestUnproven(State& s) {
  while (!s.unproven.empty()) {
    std::shared_ptr<ControlConnection> oldest = s.unproven.front().lock();
    s.unproven.pop_front();
    if (!oldest || oldest->closed() || oldest->authenticated()) continue;
    const auto now = std::chrono::steady_clock::now();
    if (now - s.last_eviction_log > std::chrono::seconds(10)) {  // one line per burst
      s.last_eviction_log = now;
      TANDEM_LOG(kWarn) << "control listener: " << s.options.max_connections
                        << " connections open (control.max_connections): closing the oldest "
                           "that has not authenticated (" << oldest->peer() << ") for a new one";
    }
    oldest->Close();
    return true;
  }
  return false;
}

void ControlListener::State::OnAccepted(const std::shared_ptr<State>& state,
                                        boost::system::error_code ec, tcp::socket socket) {
  std::lock_guard<std::mutex> lock(state->mutex);
  ControlListener::State& s = *state;
  if (s.stopped || ec == asio::error::operation_aborted || !s.acceptor.is_open()) return;
  if (ec) {
    // Out of file descriptors (or memory): the pending connection stays in the backlog, so
    // accepting again at once would fail again at once, a busy loop that floods the log.
    const auto now = std::chrono::steady_clock::now();
    if (now - s.last_error_log > std::chrono::seconds(10)) {  // one line per burst
      s.last_error_log = now;
      TANDEM_LOG(kWarn) << "control listener: accept failed: " << ec.message()
                        << "; retrying every 100 ms";
    }
    s.retry_timer.expires_after(std::chrono::milliseconds(100));
    s.retry_timer.async_wait([state](boost::system::error_code timer_ec) {
      if (timer_ec) return;
      std::lock_guard<std::mutex> retry_lock(state->mutex);
      if (!state->stopped) AcceptNext(state);
    });
    return;
  }
  // Closed connections free their slots on their own strand, a moment after an eviction: the
  // slack bounds how far the count may run ahead while evictions settle.
  const int hard_cap = s.options.max_connections + s.options.max_connections / 8 + 4;
  bool admit = s.open->load() < s.options.max_connections;
  if (!admit && s.open->load() < hard_cap) admit = EvictOldestUnproven(s);
  if (!admit) {
    // Every slot is a member's: refuse at once rather than hold sockets for strangers.
    const auto now = std::chrono::steady_clock::now();
    if (now - s.last_refusal_log > std::chrono::seconds(10)) {  // one line per burst
      s.last_refusal_log = now;
      TANDEM_LOG(kWarn) << "control listener: " << s.options.max_connections
                        << " connections open (control.max_connections): refusing new ones";
    }
    socket.close(ec);
  } else {
    auto connection = ControlConnection::Create(std::move(socket), s.options, /*dialer=*/false);
    s.open->fetch_add(1);
    connection->listener_slot_ =
        std::shared_ptr<void>(nullptr, [open = s.open](void*) { open->fetch_sub(1); });
    s.unproven.push_back(connection);
    if (s.unproven.size() > 2 * static_cast<size_t>(s.options.max_connections) + 16) {
      std::erase_if(s.unproven, [](const std::weak_ptr<ControlConnection>& weak) {
        auto c = weak.lock();
        return !c || c->closed() || c->authenticated();
      });
    }
    s.on_accept(std::move(connection));
  }
  AcceptNext(state);
}

void ControlListener::State::AcceptNext(const std::shared_ptr<State>& state) {
  state->acceptor.async_accept([state](boost::system::error_code ec, tcp::socket socket) {
    OnAccepted(state, ec, std::move(socket));
  });
}

ControlListener::~ControlListener() { Stop(); }

StatusOr<std::unique_ptr<ControlListener>> ControlListener::Listen(asio::io_context& io,
                                                                   const std::string& host,
                                                                   int port,
                                                                   const ControlOptions& options,
                                                                   AcceptHandler on_accept) {
  ControlOptions bounded = options;
  bounded.max_connections = MaxConnectionsForFds(options.max_connections);
  if (bounded.max_connections < options.max_connections) {
    TANDEM_LOG(kWarn) << "control listener: control.max_connections " << options.max_connections
                      << " lowered to " << bounded.max_connections
                      << " to leave file descriptors to the process (RLIMIT_NOFILE; raise it with "
                         "ulimit -n)";
  }
  auto state = std::make_shared<State>(io, bounded, std::move(on_accept));
  boost::system::error_code ec;
  asio::ip::address address = asio::ip::make_address(host, ec);
  if (ec) return InvalidArgument("control listener: bad host '" + host + "': " + ec.message());
  tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  tcp::acceptor& acceptor = state->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return Unavailable("control listener: cannot listen on " + host + ":" + std::to_string(port) +
                       ": " + ec.message());
  const int bound_port = acceptor.local_endpoint().port();
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    State::AcceptNext(state);
  }
  return std::unique_ptr<ControlListener>(new ControlListener(std::move(state), bound_port));
}

void ControlListener::Stop() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->stopped) return;
  state_->stopped = true;
  boost::system::error_code ec;
  state_->acceptor.close(ec);
  state_->retry_timer.cancel();
}

Status ParseHostPort(const std::string& address, std::string* host, int* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    return InvalidArgument("address '" + address + "' is not host:port");
  char* end = nullptr;
  long value = std::strtol(address.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || value <= 0 || value > 65535)
    return InvalidArgument("address '" + address + "' has a bad port");
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']')  // "[::1]:7000"
    *host = host->substr(1, host->size() - 2);
  *port = static_cast<int>(value);
  return Status::Ok();
}

StatusOr<std::shared_ptr<ControlConnection>> ConnectControl(asio::io_context& io,
                                                           const std::string& address,
                                                           double timeout_s,
                                                           const ControlOptions& options) {
  std::string host;
  int port = 0;
  TANDEM_RETURN_IF_ERROR(ParseHostPort(address, &host, &port));
  boost::system::error_code ec;
  asio::ip::address ip = asio::ip::make_address(host, ec);
  if (ec) return InvalidArgument("address '" + address + "': bad host: " + ec.message());
  auto socket = std::make_shared<tcp::socket>(io);
  auto done = std::make_shared<std::promise<boost::system::error_code>>();
  std::future<boost::system::error_code> result = done->get_future();
  socket->async_connect(tcp::endpoint(ip, static_cast<unsigned short>(port)),
                        [done](boost::system::error_code e) { done->set_value(e); });
  if (result.wait_for(std::chrono::duration<double>(timeout_s)) != std::future_status::ready) {
    asio::post(io, [socket] {
      boost::system::error_code ignored;
      socket->close(ignored);
    });
    result.wait();
    return DeadlineExceeded("connecting to " + address + " timed out after " +
                            std::to_string(timeout_s) + " s");
  }
  ec = result.get();
  if (ec) return Unavailable("cannot connect to " + address + ": " + ec.message());
  return ControlConnection::Create(std::move(*socket), options, /*dialer=*/true);
}

}  // namespace tandem
