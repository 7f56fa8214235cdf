#include "common/serving/instance_host.h"

#include <boost/asio/post.hpp>
#include <random>

#include "common/base/log.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
// How long Stop() waits for connections to flush their last frames and close.
constexpr auto kFlushTimeout = std::chrono::seconds(5);
// The engine thread's longest wait for the inbox: drivers have time-based work (hold and pull
// expiry) that must run without any message arriving.
constexpr auto kIdleWait = std::chrono::milliseconds(50);

uint64_t RandomId() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd() ^
         static_cast<uint64_t>(Clock::now().time_since_epoch().count());
}

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

InstanceHost::InstanceHost(HostOptions options)
    : options_(std::move(options)), instance_id_(RandomId()) {}

StatusOr<std::unique_ptr<InstanceHost>> InstanceHost::Create(HostOptions options) {
  std::unique_ptr<InstanceHost> host(new InstanceHost(std::move(options)));
  InstanceHost* h = host.get();
  TANDEM_ASSIGN_OR_RETURN(
      host->listener_,
      ControlListener::Listen(host->io_, h->options_.bind_host, h->options_.control_port,
                              h->options_.control_options, [h](std::shared_ptr<ControlConnection> c) {
                                h->Adopt(c, /*reply_hello=*/true);
                              }));
  if (h->options_.metrics_port != 0) {
    TANDEM_ASSIGN_OR_RETURN(
        host->http_,
        MetricsHttpServer::Start(
            h->options_.bind_host, h->options_.metrics_port,
            [h] { return h->options_.metrics ? h->options_.metrics->Render() : std::string(); },
            [h] { return h->accepting() ? Status() : Unavailable(h->name() + " is draining"); }));
  }
  return host;
}

InstanceHost::~InstanceHost() { Stop(); }

int InstanceHost::control_port() const { return listener_->port(); }

Hello InstanceHost::MakeHello() const {
  Hello h;
  h.role = options_.role;
  h.instance_id = instance_id_;
  h.name = options_.name;
  h.model = options_.model;
  const bool v6 = options_.advertise_host.find(':') != std::string::npos;
  h.control_address = (v6 ? "[" + options_.advertise_host + "]" : options_.advertise_host) + ":" +
                      std::to_string(control_port());
  h.kv_peer_info = options_.kv_peer_info;
  h.kv_block_size = options_.kv_block_size;
  h.kv_total_blocks = options_.kv_total_blocks;
  return h;
}

ConnId InstanceHost::Adopt(const std::shared_ptr<ControlConnection>& conn, bool reply_hello) {
  if (!connection_gate_.TryEnter()) {  // stopping: no new connections
    conn->Close();
    return 0;
  }
  const ConnId id = connections_.Add(conn);
  std::weak_ptr<ControlConnection> weak = conn;
  conn->Start(
      [this, id, weak, reply_hello](ControlMessage message) {
        if (auto* hello = std::get_if<Hello>(&message)) {
          // The session is open before the reply leaves: whatever the router sends after
          // hearing from us finds it open.
          if (hello->role == InstanceRole::kRouter) connections_.MarkRouter(id, hello->instance_id);
          if (auto c = weak.lock(); c && reply_hello) c->Send(MakeHello());
          TANDEM_LOG(kInfo) << "hello from " << InstanceRoleName(hello->role) << " '"
                            << hello->name << "'";
          return;
        }
        // Only the router places and cancels work: another member (a prefill or decode
        // instance: they hold the secret too) that tries is closed, and its message dropped.
        if ((std::holds_alternative<Submit>(message) || std::holds_alternative<Cancel>(message)) &&
            !connections_.SessionOf(id).has_value()) {
          TANDEM_LOG(kWarn) << "connection " << id << ": Submit or Cancel from a peer that is not "
                               "the router; closing it";
          if (auto c = weak.lock()) c->Close();
          return;
        }
        if (auto* transport = std::get_if<KvTransport>(&message);
            transport != nullptr && options_.on_kv_transport) {
          options_.on_kv_transport(*transport);
          return;
        }
        Post([this, id, m = std::move(message)]() mutable {
          driver_->OnMessage(id, std::move(m));
        });
      },
      [this, id](const Status& reason) {
        const std::optional<uint64_t> session = connections_.SessionOf(id);
        connections_.Remove(id);
        TANDEM_LOG(kDebug) << "connection " << id << " closed: " << reason.ToString();
        Post([this, id, session] { driver_->OnClosed(id, session); });
        connection_gate_.Leave();
      });
  return id;
}

StatusOr<ConnId> InstanceHost::Dial(const std::string& address) {
  if (auto it = dialed_.find(address); it != dialed_.end()) {
    if (auto conn = connections_.Get(it->second); conn != nullptr && !conn->closed())
      return it->second;
    dialed_.erase(it);
  }
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<ControlConnection> conn,
                          ConnectControl(io_, address, options_.control.connect_timeout_s,
                                         options_.control_options));
  const ConnId id = Adopt(conn, /*reply_hello=*/false);
  if (id == 0 || !conn->Send(MakeHello())) return Unavailable(name() + " is stopping");
  dialed_[address] = id;
  return id;
}

void InstanceHost::Post(std::function<void()> task) {
  {
    MutexLock lock(&inbox_mutex_);
    if (engine_done_) return;
    inbox_.push_back(std::move(task));
  }
  inbox_cv_.notify_one();
}

void InstanceHost::ScheduleReport() {
  report_timer_->expires_after(Millis(options_.control.heartbeat_interval_s));
  report_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    LoadReport report;
    {
      MutexLock lock(&load_mutex_);
      report = load_;
    }
    for (const auto& router : connections_.Routers()) router->Send(report);
    ScheduleReport();
  });
}

void InstanceHost::PublishLoad() {
  LoadReport report = driver_->Load();
  report.instance_id = instance_id_;
  MutexLock lock(&load_mutex_);
  load_ = report;
}

void InstanceHost::Run(InstanceDriver* driver) {
  TANDEM_CHECK(!running_, "InstanceHost::Run called twice");
  running_ = true;
  driver_ = driver;
  PublishLoad();
  work_.emplace(io_.get_executor());
  report_timer_ = std::make_unique<boost::asio::steady_timer>(io_);
  ScheduleReport();
  for (int i = 0; i < options_.io_threads; ++i) io_threads_.emplace_back([this] { io_.run(); });
  engine_thread_ = std::thread([this] { EngineLoop(); });
  TANDEM_LOG(kInfo) << name() << " serving '" << options_.model << "' on " << options_.bind_host
                    << ":" << control_port();
}

void InstanceHost::EngineLoop() {
  std::deque<std::function<void()>> tasks;
  bool worked = false;
  for (;;) {
    {
      MutexLock lock(&inbox_mutex_);
      // Wait unless the last round did work: waiting for blocks or a pull must not spin.
      if (inbox_.empty() && !worked) inbox_cv_.wait_for(inbox_mutex_, kIdleWait);
      tasks.swap(inbox_);
    }
    for (auto& task : tasks) task();
    tasks.clear();
    if (stopping_ && (driver_->Idle() || Clock::now() >= drain_deadline_)) break;
    worked = driver_->Step();
    PublishLoad();
  }
  // Whatever the drain did not finish ends now, with an error the router can report.
  driver_->FailAll(Unavailable(name() + " shut down before the request finished"));
  PublishLoad();
  MutexLock lock(&inbox_mutex_);
  engine_done_ = true;
  inbox_.clear();
}

void InstanceHost::Stop() {
  if (stopped_) return;
  stopped_ = true;
  work_gate_.Close();
  if (running_) {
    drain_deadline_ = Clock::now() + Millis(options_.drain_timeout_s);
    stopping_ = true;
    inbox_cv_.notify_one();
    engine_thread_.join();
  }
  // The last Tokens and Finish frames leave before the sockets close; new connections are
  // closed as they come.
  connection_gate_.Close();
  connections_.CloseAllAfterFlush();
  if (!connection_gate_.Wait(Clock::now() + kFlushTimeout)) connections_.CloseAll();
  if (http_) http_->Stop();
  boost::asio::post(io_, [this] {
    if (report_timer_) report_timer_->cancel();
    listener_->Stop();
  });
  work_.reset();
  if (!connection_gate_.Wait(Clock::now() + kFlushTimeout)) {
    TANDEM_LOG(kWarn) << name() << ": connections still open after stop";
  }
  io_.stop();
  for (auto& t : io_threads_) t.join();
  io_threads_.clear();
}

}  // namespace tandem
