// Framed control-plane connections over TCP (Boost.Asio), carrying common/net/control_wire.h
// messages between the router and the instances.
//
// Threads: every handler runs on the io_context's threads, serialised per connection (a
// strand). Send() may be called from any thread: it queues the frame and returns at once, so the
// engine thread never blocks on the network. A connection closes on the first malformed frame,
// on a read/write error, on Close(), or (CloseAfterFlush) once its write queue is empty; its
// close handler runs exactly once, with the reason.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/base/thread_annotations.h"
#include "common/net/control_wire.h"

namespace tandem {

class ControlConnection : public std::enable_shared_from_this<ControlConnection> {
 public:
  using MessageHandler = std::function<void(ControlMessage)>;
  using CloseHandler = std::function<void(const Status&)>;

  // Wraps a connected socket. Nothing is read until Start().
  static std::shared_ptr<ControlConnection> Create(boost::asio::ip::tcp::socket socket);

  // Starts the read loop. Handlers are kept until the connection closes.
  void Start(MessageHandler on_message, CloseHandler on_close);

  // Queues one message. Returns false (and drops it) when the connection is closed.
  bool Send(const ControlMessage& message);

  // Closes the socket; queued frames not yet written are dropped. Idempotent.
  void Close();

  // Closes the connection once every frame queued so far has been written (or a write failed);
  // later Send() calls are refused. How a stopping instance makes sure its last Tokens and
  // Finish frames leave before the socket closes. Idempotent.
  void CloseAfterFlush();

  bool closed() const;
  const std::string& peer() const { return peer_; }

 private:
  explicit ControlConnection(boost::asio::ip::tcp::socket socket);
  void ReadHeader();
  void ReadBody(size_t frame_bytes);
  void WriteNext();
  void Fail(const Status& reason);
  // Strand only: writing_ is false and the queue empty: Fail when CloseAfterFlush was asked.
  void MaybeCloseFlushed();

  boost::asio::ip::tcp::socket socket_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  std::string peer_;
  std::string read_buffer_;
  MessageHandler on_message_;
  CloseHandler on_close_;

  mutable Mutex mutex_;
  std::deque<std::string> write_queue_ TANDEM_GUARDED_BY(mutex_);
  bool writing_ TANDEM_GUARDED_BY(mutex_) = false;
  bool closed_ TANDEM_GUARDED_BY(mutex_) = false;
  bool close_after_flush_ TANDEM_GUARDED_BY(mutex_) = false;
};

// Accepts control connections on host:port (port 0 = an ephemeral port).
class ControlListener {
 public:
  using AcceptHandler = std::function<void(std::shared_ptr<ControlConnection>)>;

  // Binds and starts accepting; each new connection goes to on_accept (not yet started).
  static StatusOr<std::unique_ptr<ControlListener>> Listen(boost::asio::io_context& io,
                                                           const std::string& host, int port,
                                                           AcceptHandler on_accept);
  ~ControlListener();

  int port() const { return port_; }
  void Stop();

 private:
  ControlListener(boost::asio::io_context& io, AcceptHandler on_accept);
  void AcceptNext();

  boost::asio::ip::tcp::acceptor acceptor_;
  AcceptHandler on_accept_;
  int port_ = 0;
};

// Splits "host:port". InvalidArgument naming the address when malformed.
Status ParseHostPort(const std::string& address, std::string* host, int* port);

// Connects to "host:port", waiting at most timeout_s. Blocking: call it from a thread that is
// not running `io` (start-up code, the supervisor, tests). Unavailable when nobody listens,
// DeadlineExceeded on timeout.
StatusOr<std::shared_ptr<ControlConnection>> ConnectControl(boost::asio::io_context& io,
                                                           const std::string& address,
                                                           double timeout_s);

}  // namespace tandem
