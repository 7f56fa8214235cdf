// Framed control-plane connections over TCP (Boost.Asio), carrying common/net/control_wire.h
// messages between the router and the instances.
//
// Membership: a connection first runs the handshake of common/net/control_auth.h. Until both
// sides have proved that they hold the cluster secret, nothing but the fixed-size handshake is
// read (no frame header, so no peer can make this side allocate a frame), nothing queued is
// written, and no handler runs; a peer that does not finish within handshake_timeout_s, or
// proves wrong, is closed. A listener holds at most max_connections at once; when full, a new
// connection displaces the oldest one that has not yet proved membership, so strangers that
// hold the listener full cannot lock members out.
//
// Threads: every handler runs on the io_context's threads, serialised per connection (a
// strand). Send() may be called from any thread: it queues the frame and returns at once, so the
// engine thread never blocks on the network. A connection closes on the first malformed frame,
// on a read/write error, on Close(), or (CloseAfterFlush) once its write queue is empty; its
// close handler runs exactly once, with the reason.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/base/thread_annotations.h"
#include "common/net/control_auth.h"
#include "common/net/control_wire.h"
#include "common/net/fd_budget.h"

namespace tandem {

// How control connections prove membership and bound what a peer can cost.
struct ControlOptions {
  std::string secret;  // the cluster secret (control.secret_file); must not be empty
  double handshake_timeout_s = 5;  // control.handshake_timeout_s
  // Frames queued and not yet written: beyond this the peer is not reading; the connection
  // fails rather than hold its memory.
  size_t max_queued_bytes = size_t{256} << 20;
  int max_connections = 1024;  // listener: connections open at once (control.max_connections)
};

class ControlConnection : public std::enable_shared_from_this<ControlConnection> {
 public:
  using MessageHandler = std::function<void(ControlMessage)>;
  using CloseHandler = std::function<void(const Status&)>;

  // Wraps a connected socket; `dialer`: this side connected (it matters to the handshake).
  // Nothing is read until Start().
  static std::shared_ptr<ControlConnection> Create(boost::asio::ip::tcp::socket socket,
                                                   const ControlOptions& options, bool dialer);

  // Runs the handshake, then the read loop. Handlers are kept until the connection closes;
  // on_message runs only once the peer has proved membership.
  void Start(MessageHandler on_message, CloseHandler on_close);

  // Queues one message (written once the handshake is done). Returns false (and drops it) when
  // the connection is closed, or fails it when the queue would exceed max_queued_bytes.
  bool Send(const ControlMessage& message);

  // Closes the socket; queued frames not yet written are dropped. Idempotent.
  void Close();

  // Closes the connection once every frame queued so far has been written (or a write failed);
  // later Send() calls are refused. How a stopping instance makes sure its last Tokens and
  // Finish frames leave before the socket closes. Idempotent.
  void CloseAfterFlush();

  bool closed() const;
  // The peer proved that it holds the cluster secret.
  bool authenticated() const;
  const std::string& peer() const { return peer_; }

 private:
  friend class ControlListener;
  ControlConnection(boost::asio::ip::tcp::socket socket, const ControlOptions& options,
                    bool dialer);
  // The handshake, in order: send our challenge, read theirs, send our proof, check theirs.
  void SendChallenge();
  void ReadChallenge();
  void SendProof();
  void CheckProof();
  void Authenticated();
  void ReadHeader();
  void ReadBody(size_t frame_bytes);
  void WriteNext();
  void Fail(const Status& reason);
  // Strand only: writing_ is false and the queue empty: Fail when CloseAfterFlush was asked.
  void MaybeCloseFlushed();

  boost::asio::ip::tcp::socket socket_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::steady_timer handshake_timer_;
  const ControlOptions options_;
  const bool dialer_;
  std::string peer_;
  // Strand only: the handshake's state.
  AuthNonce own_nonce_{}, peer_nonce_{};
  std::array<uint8_t, kAuthChallengeBytes> challenge_out_{}, challenge_in_{};
  AuthProof proof_out_{}, proof_in_{};
  std::shared_ptr<void> listener_slot_;  // released on close: the listener's connection count
  std::string read_buffer_;
  MessageHandler on_message_;
  CloseHandler on_close_;

  mutable Mutex mutex_;
  std::deque<std::string> write_queue_ TANDEM_GUARDED_BY(mutex_);
  size_t queued_bytes_ TANDEM_GUARDED_BY(mutex_) = 0;
  bool writing_ TANDEM_GUARDED_BY(mutex_) = false;
  bool authenticated_ TANDEM_GUARDED_BY(mutex_) = false;
  bool closed_ TANDEM_GUARDED_BY(mutex_) = false;
  bool close_after_flush_ TANDEM_GUARDED_BY(mutex_) = false;
};

// Accepts control connections on host:port (port 0 = an ephemeral port).
//
// Threads: accept handlers run on the io_context's threads, one at a time, and own the
// listener's state (a shared State), so one that completes after the listener is gone is
// harmless. Stop() (and the destructor) waits for a handler that is running and guarantees
// that on_accept is never called after it returns; on_accept must not call Stop().
class ControlListener {
 public:
  using AcceptHandler = std::function<void(std::shared_ptr<ControlConnection>)>;

  // Binds and starts accepting; each new connection goes to on_accept (not yet started). With
  // options.max_connections open, a new connection closes the oldest one still in its handshake
  // and takes its place; when every open one has authenticated, the new one is closed as it is
  // accepted. The cap is lowered to leave file descriptors to the rest of the process
  // (MaxConnectionsForFds): a flood must not take the descriptors its /health, KV transfers
  // and files need. An accept that fails (out of descriptors) is retried after a pause, not in
  // a busy loop.
  static StatusOr<std::unique_ptr<ControlListener>> Listen(boost::asio::io_context& io,
                                                           const std::string& host, int port,
                                                           const ControlOptions& options,
                                                           AcceptHandler on_accept);
  ~ControlListener();

  int port() const { return port_; }
  void Stop();

  struct State;  // defined in control_channel.cc

 private:
  explicit ControlListener(std::shared_ptr<State> state, int port)
      : state_(std::move(state)), port_(port) {}

  std::shared_ptr<State> state_;
  int port_ = 0;
};

// Splits "host:port". InvalidArgument naming the address when malformed.
Status ParseHostPort(const std::string& address, std::string* host, int* port);

// Connects to "host:port", waiting at most timeout_s. Blocking: call it from a thread that is
// not running `io` (start-up code, the supervisor, tests). Unavailable when nobody listens,
// DeadlineExceeded on timeout. The handshake runs after Start(): a peer outside the cluster
// shows as the connection closing (PermissionDenied), before any message.
StatusOr<std::shared_ptr<ControlConnection>> ConnectControl(boost::asio::io_context& io,
                                                           const std::string& address,
                                                           double timeout_s,
                                                           const ControlOptions& options);

}  // namespace tandem
