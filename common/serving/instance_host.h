// The instance host: everything a prefill, decode or colocated server does that is not "which
// messages drive which engine". It owns
//   - the io threads (Boost.Asio) and the control listener on bind_host:control_port,
//   - the connection table (accepted and outbound connections, router sessions),
//   - the Hello exchange (answers every Hello, marks router sessions),
//   - the inbox and its one engine thread, which runs the InstanceDriver,
//   - the load-report timer: the driver's latest LoadReport goes to every router connection
//     every control.heartbeat_interval_s,
//   - GET /metrics and /health (common/net/metrics_http.h) on bind_host:metrics_port,
//   - drain behind two gates: Stop() closes the work gate (accepting() turns false: drivers
//     refuse new requests) and the connection gate (new connections are closed at once), runs the
//     engine until the driver is idle or drain_timeout_s passed, ends what is left, then asks
//     every connection to close once its write queue is flushed and waits for the connection
//     gate to empty (bounded). No sleeps.
//
// Threads: Create/Run/Stop from one controlling thread. Driver callbacks run on the engine
// thread, one at a time. Send, Post and accepting() may be called from any thread; Dial,
// RouterSession and SessionOf from the engine thread (they are thread-safe, but the ordering
// guarantees below hold there). A connection's messages reach the driver in the order they
// arrived, and its OnClosed after all of them. A router session that RouterSession() reports
// open was opened before any message the router sent after its Hello.
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/base/metrics.h"
#include "common/base/status.h"
#include "common/base/thread_annotations.h"
#include "common/config/config.h"
#include "common/net/connection_table.h"
#include "common/net/control_wire.h"
#include "common/net/metrics_http.h"
#include "common/serving/gate.h"

namespace tandem {

// What a server plugs into the host. Every method runs on the engine thread.
class InstanceDriver {
 public:
  virtual ~InstanceDriver() = default;
  // A message from connection `conn` (Hello is the host's and never comes here).
  virtual void OnMessage(ConnId conn, ControlMessage message) = 0;
  // Connection `conn` closed; `router_session` is set when it was a router's.
  virtual void OnClosed(ConnId conn, std::optional<uint64_t> router_session) = 0;
  // One round of work (expiry checks, admission, one forward pass). False when nothing was
  // done: the engine thread then waits for the inbox (bounded) instead of spinning.
  virtual bool Step() = 0;
  // Nothing is in flight: a draining host stops.
  virtual bool Idle() const = 0;
  // The drain ran out of time: end every request with `why` (afterwards every block is free).
  virtual void FailAll(const Status& why) = 0;
  // The numbers of the next LoadReport (the host fills in instance_id).
  virtual LoadReport Load() = 0;
};

struct HostOptions {
  std::string name;                  // "prefill-0": logs and Hello
  InstanceRole role = InstanceRole::kPrefill;
  std::string model;                 // served model name, for Hello
  std::string bind_host = "127.0.0.1";    // S.host: where it listens
  std::string advertise_host = "127.0.0.1";  // what peers dial (Hello.control_address)
  int control_port = 0;              // 0 = ephemeral
  int metrics_port = 0;              // 0 = no HTTP endpoint
  ControlSection control;            // heartbeat interval, connect timeout
  ControlOptions control_options;    // the cluster secret and connection bounds
  double drain_timeout_s = 30;
  int io_threads = 2;
  // For Hello: what peers need to know about this instance's KV.
  std::string kv_peer_info;
  int32_t kv_block_size = 0;
  int64_t kv_total_blocks = 0;
  MetricsRegistry* metrics = nullptr;  // rendered at /metrics; not owned; may be null
  // Takes KvTransport messages (a transport's own, decode -> prefill) on the connection's I/O
  // thread instead of the engine's inbox: they must not wait for a forward pass (nccl's pull
  // orders: the puller's receives are posted and their deadline runs). A connection's messages
  // keep their order. Thread-safe; null: they reach the driver as any message does.
  std::function<void(const KvTransport& message)> on_kv_transport;
};

class InstanceHost {
 public:
  // Binds the control listener and the metrics endpoint; nothing runs until Run().
  // Errors: InvalidArgument (bad host), Unavailable (port taken).
  static StatusOr<std::unique_ptr<InstanceHost>> Create(HostOptions options);
  ~InstanceHost();  // Stop()
  InstanceHost(const InstanceHost&) = delete;
  InstanceHost& operator=(const InstanceHost&) = delete;

  // Starts the io threads, the report timer and the engine thread running `driver` (not owned;
  // it must outlive Stop()).
  void Run(InstanceDriver* driver);
  // Drains (see the file comment) and joins every thread. Idempotent.
  void Stop();

  // Runs `task` on the engine thread (transport callbacks reach the engine this way). Tasks
  // posted after the engine thread ended are dropped. Any thread.
  void Post(std::function<void()> task);
  // Queues `message` on connection `conn`; false when it is gone. Any thread.
  bool Send(ConnId conn, const ControlMessage& message) { return connections_.Send(conn, message); }
  // The open connection of router session `session`, if any.
  std::optional<ConnId> RouterSession(uint64_t session) const {
    return connections_.RouterSession(session);
  }
  std::optional<uint64_t> SessionOf(ConnId conn) const { return connections_.SessionOf(conn); }
  // An outbound control connection to "host:port" (one per address, opened on first use with
  // Hello, within control.connect_timeout_s; blocks the engine thread that long at most).
  // Unavailable once Stop() has closed the connection gate.
  StatusOr<ConnId> Dial(const std::string& address);
  // False once Stop() began: new requests are refused.
  bool accepting() const { return !work_gate_.closed(); }

  const std::string& name() const { return options_.name; }
  uint64_t instance_id() const { return instance_id_; }
  int control_port() const;

 private:
  explicit InstanceHost(HostOptions options);
  Hello MakeHello() const;
  // Registers and starts reading a connection (accepted or dialed).
  ConnId Adopt(const std::shared_ptr<ControlConnection>& conn, bool reply_hello);  // 0: refused
  void ScheduleReport();
  void EngineLoop();
  void PublishLoad();

  const HostOptions options_;
  const uint64_t instance_id_;
  InstanceDriver* driver_ = nullptr;

  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::vector<std::thread> io_threads_;
  std::unique_ptr<ControlListener> listener_;
  std::unique_ptr<boost::asio::steady_timer> report_timer_;
  std::unique_ptr<MetricsHttpServer> http_;
  std::thread engine_thread_;

  ConnectionTable connections_;
  Gate work_gate_;        // closed by Stop(): drivers refuse new requests
  Gate connection_gate_;  // one entry per open connection

  Mutex inbox_mutex_;
  std::condition_variable_any inbox_cv_;
  std::deque<std::function<void()>> inbox_ TANDEM_GUARDED_BY(inbox_mutex_);
  bool engine_done_ TANDEM_GUARDED_BY(inbox_mutex_) = false;

  Mutex load_mutex_;
  LoadReport load_ TANDEM_GUARDED_BY(load_mutex_);

  std::atomic<bool> stopping_{false};
  std::chrono::steady_clock::time_point drain_deadline_;
  std::map<std::string, ConnId> dialed_;  // engine thread: outbound connections by address
  bool running_ = false;
  bool stopped_ = false;
};

}  // namespace tandem
