#include "kvtransfer/ucx_transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "common/base/log.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint16_t kAmTransferResult = 1;
// Idle progress iterations before the thread sleeps on the worker's event fd: keeps latency low
// while traffic flows without burning a core when idle.
constexpr int kIdleSpins = 256;
// After a timed-out pull's gets are cancelled, how long they may take to come back before the
// peer counts as hung and its endpoint is force-closed.
constexpr auto kCancelGrace = std::chrono::milliseconds(200);

// ---- RAII for UCX handles -----------------------------------------------------------------

struct ContextDeleter {
  void operator()(ucp_context_h c) const { ucp_cleanup(c); }
};
using ContextPtr = std::unique_ptr<ucp_context, ContextDeleter>;

struct WorkerDeleter {
  void operator()(ucp_worker_h w) const { ucp_worker_destroy(w); }
};
using WorkerPtr = std::unique_ptr<ucp_worker, WorkerDeleter>;

struct ConfigDeleter {
  void operator()(ucp_config_t* c) const { ucp_config_release(c); }
};
using ConfigPtr = std::unique_ptr<ucp_config_t, ConfigDeleter>;

struct MemhDeleter {
  ucp_context_h context = nullptr;
  void operator()(ucp_mem_h m) const { ucp_mem_unmap(context, m); }
};
using MemhPtr = std::unique_ptr<ucp_mem, MemhDeleter>;

struct RkeyDeleter {
  void operator()(ucp_rkey_h r) const { ucp_rkey_destroy(r); }
};
using RkeyPtr = std::unique_ptr<ucp_rkey, RkeyDeleter>;

struct RkeyBufferDeleter {
  void operator()(void* b) const { ucp_rkey_buffer_release(b); }
};
struct AddressDeleter {
  ucp_worker_h worker = nullptr;
  void operator()(ucp_address_t* a) const { ucp_worker_release_address(worker, a); }
};

struct RequestDeleter {
  void operator()(void* r) const { ucp_request_free(r); }
};
using RequestPtr = std::unique_ptr<void, RequestDeleter>;

// Closes the endpoint (forcibly when it has peer error handling) and progresses the worker until the close completes; outstanding
// operations on it complete with an error before this returns. Progress thread only.
struct EndpointDeleter {
  ucp_worker_h worker = nullptr;
  bool force = true;  // FORCE is only defined for endpoints in UCP_ERR_HANDLING_MODE_PEER
  void operator()(ucp_ep_h ep) const {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &param);
    if (UCS_PTR_IS_PTR(req)) {
      auto give_up = Clock::now() + std::chrono::seconds(2);
      while (ucp_request_check_status(req) == UCS_INPROGRESS && Clock::now() < give_up) {
        ucp_worker_progress(worker);
      }
      ucp_request_free(req);
    }
  }
};
using EndpointPtr = std::unique_ptr<ucp_ep, EndpointDeleter>;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

Status UcxError(const std::string& what, ucs_status_t status) {
  return Internal("UCX " + what + ": " + ucs_status_string(status));
}

// A status for a get that completed with an error.
Status GetError(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CANCELED:  // the endpoint was closed under it
      return Unavailable(std::string("peer unavailable: ") + ucs_status_string(status));
    case UCS_ERR_TIMED_OUT:
      return DeadlineExceeded(std::string("UCX: ") + ucs_status_string(status));
    default:
      return Internal(std::string("UCX get failed: ") + ucs_status_string(status));
  }
}

uint64_t NewInstanceId() {
  std::random_device rd;
  uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
                (static_cast<uint64_t>(getpid()) << 16);
  return id == 0 ? 1 : id;
}

// ---- a ucp worker with its own progress thread ---------------------------------------------

// A ucp context, shared by a pool's memory and the worker that registered it (the memory handle
// must not outlive the context).
struct UcxContext {
  ContextPtr context;
  std::string tls;
};

StatusOr<std::shared_ptr<UcxContext>> CreateContext(const std::string& tls) {
  ucp_config_t* raw_config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &raw_config);
  if (st != UCS_OK) return UcxError("config read", st);
  ConfigPtr config(raw_config);
  if (!tls.empty()) {
    st = ucp_config_modify(config.get(), "TLS", tls.c_str());
    if (st != UCS_OK) return InvalidArgument("transfer.ucx_tls '" + tls + "': " +
                                             ucs_status_string(st));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucp_context_h context = nullptr;
  st = ucp_init(&params, config.get(), &context);
  if (st != UCS_OK) return UcxError("init (UCX_TLS=" + tls + ")", st);
  auto owned = std::make_shared<UcxContext>();
  owned->context.reset(context);
  owned->tls = tls;
  return owned;
}

class UcxWorker {
 public:
  static StatusOr<std::unique_ptr<UcxWorker>> Create(std::shared_ptr<UcxContext> context) {
    auto w = std::unique_ptr<UcxWorker>(new UcxWorker());
    w->context_ = std::move(context);
    ucs_status_t st = UCS_OK;
    ucp_worker_params_t wparams{};
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucp_worker_h worker = nullptr;
    st = ucp_worker_create(w->context_->context.get(), &wparams, &worker);
    if (st != UCS_OK) return UcxError("worker create", st);
    w->worker_.reset(worker);

    int worker_fd = -1;
    st = ucp_worker_get_efd(worker, &worker_fd);
    if (st != UCS_OK) return UcxError("worker event fd", st);
    w->event_fd_ = std::make_unique<Fd>(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    w->epoll_fd_ = std::make_unique<Fd>(epoll_create1(EPOLL_CLOEXEC));
    if (w->event_fd_->get() < 0 || w->epoll_fd_->get() < 0) return Internal("eventfd/epoll");
    for (int fd : {worker_fd, w->event_fd_->get()}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      if (epoll_ctl(w->epoll_fd_->get(), EPOLL_CTL_ADD, fd, &ev) != 0) return Internal("epoll_ctl");
    }
    return w;
  }

  ~UcxWorker() { TANDEM_CHECK(!thread_.joinable(), "UcxWorker destroyed without Stop()"); }

  ucp_context_h context() const { return context_->context.get(); }
  ucp_worker_h worker() const { return worker_.get(); }

  // `on_loop` runs on the thread after every round of progress (timeouts, deferred work).
  void Start(std::function<void()> on_loop) {
    on_loop_ = std::move(on_loop);
    thread_ = std::thread([this] { Loop(); });
  }

  // Runs `fn` on the progress thread. Any thread.
  void Post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      commands_.push_back(std::move(fn));
    }
    uint64_t one = 1;
    ssize_t n = write(event_fd_->get(), &one, sizeof(one));
    (void)n;  // EAGAIN means a wake-up is already pending
  }

  // Runs `last` on the progress thread after the commands posted before, then joins it.
  void Stop(std::function<void()> last) {
    if (!thread_.joinable()) return;
    Post([this, last = std::move(last)] {
      last();
      stop_ = true;
    });
    thread_.join();
  }

 private:
  UcxWorker() = default;

  void Loop() {
    int idle = 0;
    while (!stop_) {
      std::vector<std::function<void()>> commands;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        commands.swap(commands_);
      }
      for (auto& fn : commands) {
        fn();
        if (stop_) return;
      }
      unsigned progressed = 0;
      while (unsigned n = ucp_worker_progress(worker_.get())) progressed += n;
      on_loop_();
      if (progressed > 0 || !commands.empty()) {
        idle = 0;
        continue;
      }
      if (++idle < kIdleSpins) continue;
      idle = 0;
      if (ucp_worker_arm(worker_.get()) == UCS_ERR_BUSY) continue;
      epoll_event events[2];
      // Bounded so that timeouts are checked even when nothing happens.
      int n = epoll_wait(epoll_fd_->get(), events, 2, 5);
      for (int i = 0; i < n; ++i) {
        if (events[i].data.fd == event_fd_->get()) {
          uint64_t value;
          ssize_t r = read(event_fd_->get(), &value, sizeof(value));
          (void)r;
        }
      }
    }
  }

  std::shared_ptr<UcxContext> context_;  // destroyed last
  WorkerPtr worker_;
  std::unique_ptr<Fd> event_fd_;
  std::unique_ptr<Fd> epoll_fd_;
  std::mutex mutex_;
  std::vector<std::function<void()>> commands_;
  std::function<void()> on_loop_;
  bool stop_ = false;  // progress thread only
  std::thread thread_;
};

// Registers `*region`; when `allocate`, UCX allocates region->bytes itself (shared memory
// first, per UCX_ALLOC_PRIO) and *region gets the address.
StatusOr<MemhPtr> MapRegion(ucp_context_h context, MemoryRegion* region, bool allocate = false) {
  if ((!allocate && region->base == nullptr) || region->bytes == 0) {
    return InvalidArgument("kvtransfer: the memory region is empty");
  }
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = allocate ? nullptr : region->base;
  params.length = region->bytes;
  if (allocate) {
    params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    params.flags = UCP_MEM_MAP_ALLOCATE;
  }
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(context, &params, &memh);
  if (st != UCS_OK) return UcxError("mem_map of " + std::to_string(region->bytes) + " bytes", st);
  MemhPtr owned(memh, MemhDeleter{context});
  if (allocate) {
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
    st = ucp_mem_query(memh, &attr);
    if (st != UCS_OK) return UcxError("mem_query", st);
    region->base = attr.address;
  }
  return owned;
}

class UcxPoolImpl final : public UcxPool {
 public:
  static StatusOr<std::shared_ptr<UcxPoolImpl>> Create(MemoryRegion region, bool allocate,
                                                       const std::string& tls) {
    TANDEM_ASSIGN_OR_RETURN(auto context, CreateContext(tls));
    auto pool = std::shared_ptr<UcxPoolImpl>(new UcxPoolImpl());
    pool->context_ = std::move(context);
    TANDEM_ASSIGN_OR_RETURN(pool->memh_, MapRegion(pool->context_->context.get(), &region,
                                                   allocate));
    pool->region_ = region;
    return pool;
  }
  ~UcxPoolImpl() override { memh_.reset(); }  // before the context goes

  MemoryRegion region() const override { return region_; }
  const std::string& tls() const override { return context_->tls; }
  const std::shared_ptr<UcxContext>& context() const { return context_; }
  ucp_mem_h memh() const { return memh_.get(); }

 private:
  UcxPoolImpl() = default;
  std::shared_ptr<UcxContext> context_;
  MemhPtr memh_;
  MemoryRegion region_;
};

// ---- publisher -----------------------------------------------------------------------------

class UcxPublisher final : public KvPublisher {
 public:
  static StatusOr<std::unique_ptr<KvPublisher>> Create(std::shared_ptr<UcxPoolImpl> pool,
                                                       const UcxOptions& options) {
    TANDEM_ASSIGN_OR_RETURN(auto worker, UcxWorker::Create(pool->context()));
    auto pub = std::unique_ptr<UcxPublisher>(new UcxPublisher(options));
    pub->worker_ = std::move(worker);
    pub->pool_ = std::move(pool);
    MemoryRegion region = pub->pool_->region();

    void* rkey_buffer = nullptr;
    size_t rkey_size = 0;
    ucs_status_t st =
        ucp_rkey_pack(pub->worker_->context(), pub->pool_->memh(), &rkey_buffer, &rkey_size);
    if (st != UCS_OK) return UcxError("rkey_pack", st);
    std::unique_ptr<void, RkeyBufferDeleter> rkey_owner(rkey_buffer);

    ucp_address_t* address = nullptr;
    size_t address_size = 0;
    st = ucp_worker_get_address(pub->worker_->worker(), &address, &address_size);
    if (st != UCS_OK) return UcxError("worker_get_address", st);
    std::unique_ptr<ucp_address_t, AddressDeleter> address_owner(
        address, AddressDeleter{pub->worker_->worker()});

    PeerInfo& info = pub->info_;
    info.instance_id = NewInstanceId();
    info.transport = "ucx";
    info.worker_address.assign(reinterpret_cast<const char*>(address), address_size);
    info.packed_rkey.assign(static_cast<const char*>(rkey_buffer), rkey_size);
    info.region_base = reinterpret_cast<uint64_t>(region.base);
    info.region_bytes = region.bytes;

    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = kAmTransferResult;
    am.cb = &UcxPublisher::OnResultMessage;
    am.arg = pub.get();
    st = ucp_worker_set_am_recv_handler(pub->worker_->worker(), &am);
    if (st != UCS_OK) return UcxError("set_am_recv_handler", st);

    UcxPublisher* raw = pub.get();
    pub->worker_->Start([raw] { raw->CheckLeases(); });
    return std::unique_ptr<KvPublisher>(std::move(pub));
  }

  ~UcxPublisher() override {
    worker_->Stop([] {});
    std::map<std::string, Lease> leases;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      leases.swap(leases_);
    }
    for (auto& [id, lease] : leases) lease.on_release(id, Cancelled("publisher shut down"));
  }

  const PeerInfo& peer_info() const override { return info_; }

  StatusOr<KvDescriptor> Publish(const std::string& request_id, LayerRanges layers,
                                 ReleaseCallback on_release) override {
    TANDEM_RETURN_IF_ERROR(CheckRanges(layers, info_.region_bytes));
    TANDEM_ASSIGN_OR_RETURN(KvDescriptor d,
                            MakeDescriptor(info_.instance_id, request_id, std::move(layers)));
    std::lock_guard<std::mutex> lock(mutex_);
    if (leases_.count(request_id)) {
      return InvalidArgument("request " + request_id + " is already published");
    }
    leases_.emplace(request_id,
                    Lease{Clock::now() + options_.lease_timeout, std::move(on_release)});
    return d;
  }

  Status Release(const TransferResult& result) override {
    if (result.instance_id != info_.instance_id) {
      return InvalidArgument("result for another publisher instance");
    }
    Lease lease;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = leases_.find(result.request_id);
      if (it == leases_.end()) return NotFound("request " + result.request_id + " not published");
      lease = std::move(it->second);
      leases_.erase(it);
    }
    lease.on_release(result.request_id, result.ToStatus());
    return Status();
  }

  size_t published_count() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return leases_.size();
  }

 private:
  struct Lease {
    Clock::time_point deadline;
    ReleaseCallback on_release;
  };

  explicit UcxPublisher(const UcxOptions& options) : options_(options) {}

  static ucs_status_t OnResultMessage(void* arg, const void*, size_t, void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxPublisher*>(arg);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      TANDEM_LOG(kWarn) << "kvtransfer: ignoring a rendezvous result message";
      return UCS_OK;
    }
    auto result = DecodeTransferResult({static_cast<const uint8_t*>(data), length});
    if (!result.ok()) {
      TANDEM_LOG(kWarn) << "kvtransfer: bad result message: " << result.status().ToString();
      return UCS_OK;
    }
    Status s = self->Release(*result);
    // NotFound is expected: the owner may already have released the lease on the control
    // plane's KvReleased, which can arrive before this message.
    if (s.code() == StatusCode::kNotFound) {
      TANDEM_LOG(kDebug) << "kvtransfer: result message: " << s.ToString();
    } else if (!s.ok()) {
      TANDEM_LOG(kWarn) << "kvtransfer: result message: " << s.ToString();
    }
    return UCS_OK;
  }

  // Progress thread: releases leases nobody reported on.
  void CheckLeases() {
    auto now = Clock::now();
    if (now < next_lease_check_) return;
    next_lease_check_ = now + std::chrono::milliseconds(10);
    std::vector<std::pair<std::string, Lease>> expired;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = leases_.begin(); it != leases_.end();) {
        if (it->second.deadline <= now) {
          expired.emplace_back(it->first, std::move(it->second));
          it = leases_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& [id, lease] : expired) {
      TANDEM_LOG_REQ(kWarn, id) << "kvtransfer: no puller reported within the lease; releasing";
      lease.on_release(id, DeadlineExceeded("no pull result within the lease"));
    }
  }

  UcxOptions options_;
  std::shared_ptr<UcxPoolImpl> pool_;  // shares the worker's context
  std::unique_ptr<UcxWorker> worker_;
  PeerInfo info_;
  mutable std::mutex mutex_;
  std::map<std::string, Lease> leases_;
  Clock::time_point next_lease_check_{};
};

// ---- puller --------------------------------------------------------------------------------

class UcxPuller final : public KvPuller {
 public:
  static StatusOr<std::unique_ptr<KvPuller>> Create(std::shared_ptr<UcxPoolImpl> pool,
                                                    const UcxOptions& options) {
    TANDEM_ASSIGN_OR_RETURN(auto worker, UcxWorker::Create(pool->context()));
    auto puller = std::unique_ptr<UcxPuller>(new UcxPuller(pool->region(), options));
    puller->worker_ = std::move(worker);
    puller->pool_ = std::move(pool);
    UcxPuller* raw = puller.get();
    puller->worker_->Start([raw] { raw->AfterProgress(); });
    return std::unique_ptr<KvPuller>(std::move(puller));
  }

  ~UcxPuller() override {
    worker_->Stop([this] { Shutdown(); });
  }

  Status Connect(const PeerInfo& info) override {
    if (info.transport != "ucx") {
      return InvalidArgument("peer transport is '" + info.transport + "', not ucx");
    }
    if (info.worker_address.empty() || info.packed_rkey.empty()) {
      return InvalidArgument("peer info without a worker address or remote key");
    }
    auto done = std::make_shared<std::promise<Status>>();
    std::future<Status> result = done->get_future();
    worker_->Post([this, info, done] { done->set_value(ConnectOnThread(info)); });
    // Local work only (no network round trip); the bound is a guard against a stuck thread.
    if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      return DeadlineExceeded("kvtransfer: connect did not run on the progress thread");
    }
    return result.get();
  }

  Status Pull(const KvDescriptor& descriptor, LayerRanges local, PullCallbacks callbacks,
              uint32_t layers_available) override {
    if (!callbacks.on_done) return InvalidArgument("Pull needs an on_done callback");
    uint64_t remote_bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return FailedPrecondition("puller is stopping");
      auto it = peer_regions_.find(descriptor.instance_id);
      if (it == peer_regions_.end()) {
        return NotFound("publisher " + std::to_string(descriptor.instance_id) +
                        " is not connected (or failed)");
      }
      remote_bytes = it->second;
      if (active_.count(descriptor.request_id)) {
        return FailedPrecondition("request " + descriptor.request_id + " is already pulling");
      }
    }
    TANDEM_ASSIGN_OR_RETURN(auto pieces,
                            PlanCopies(descriptor.layers, remote_bytes, local, region_.bytes));
    auto pull = std::make_unique<PullState>();
    pull->owner = this;
    pull->request_id = descriptor.request_id;
    pull->instance_id = descriptor.instance_id;
    pull->callbacks = std::move(callbacks);
    pull->pieces = std::move(pieces);
    pull->ops.resize(pull->pieces.size());
    pull->layer_remaining.assign(descriptor.layers.size(), 0);
    for (const CopyPiece& p : pull->pieces) ++pull->layer_remaining[p.layer];
    pull->bytes = descriptor.total_bytes;
    pull->layers_available = layers_available;
    pull->start = Clock::now();
    pull->deadline = pull->start + options_.timeout;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!active_.insert(descriptor.request_id).second) {
        return FailedPrecondition("request " + descriptor.request_id + " is already pulling");
      }
    }
    metrics_.Started();
    worker_->Post([this, p = pull.release()] { StartPull(std::unique_ptr<PullState>(p)); });
    return Status();
  }

  Status SetLayersAvailable(const std::string& request_id, uint32_t layers) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!active_.count(request_id)) return NotFound("request " + request_id + " is not pulling");
    }
    worker_->Post([this, request_id, layers] { RaiseLayers(request_id, layers); });
    return Status();
  }

  size_t inflight_count() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return active_.size();
  }

 private:
  struct PullState;
  struct GetOp {
    PullState* pull = nullptr;
    uint32_t layer = 0;
    RequestPtr request;  // set while the get is in flight
  };
  struct PullState {
    UcxPuller* owner = nullptr;
    std::string request_id;
    uint64_t instance_id = 0;
    PullCallbacks callbacks;
    std::vector<CopyPiece> pieces;
    std::vector<GetOp> ops;  // one per piece, never resized after start (ops point here)
    std::vector<size_t> layer_remaining;
    uint32_t layers_reported = 0;
    uint32_t layers_available = kAllLayers;  // pieces of later layers wait
    size_t next = 0;         // next piece to issue
    size_t completed = 0;    // pieces landed
    size_t outstanding = 0;  // gets in flight
    uint64_t bytes = 0;
    Clock::time_point start, deadline, grace_deadline;
    // Layer-wise: since when every available piece has landed and no more were announced
    // (not in tandem_kv_transfer_seconds), and the total of such waits.
    std::optional<Clock::time_point> starved_since;
    Clock::duration starved{0};
    bool timed_out = false;
    bool finishing = false;
    std::optional<Status> error;
  };
  struct Peer {
    PeerInfo info;
    EndpointPtr ep;
    RkeyPtr rkey;
    bool failed = false;
    Status failure;
  };

  UcxPuller(MemoryRegion region, const UcxOptions& options)
      : region_(region), options_(options), metrics_(options.metrics) {}

  ucp_worker_h worker() const { return worker_->worker(); }

  // ---- progress thread from here on ----

  Status ConnectOnThread(const PeerInfo& info) {
    if (peers_.count(info.instance_id)) return Status();
    auto peer = std::make_unique<Peer>();
    peer->info = info;
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(peer->info.worker_address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &UcxPuller::OnEndpointError;
    params.err_handler.arg = peer.get();
    ucp_ep_h ep = nullptr;
    ucs_status_t st = ucp_ep_create(worker(), &params, &ep);
    bool peer_mode = st == UCS_OK;
    if (st == UCS_ERR_UNREACHABLE) {
      // UCX 1.13's shared-memory transports (posix, sysv) have no peer failure handler, so an
      // sm-only endpoint cannot use peer error handling; then only the timeout catches a dead
      // peer.
      params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      st = ucp_ep_create(worker(), &params, &ep);
      if (st == UCS_OK && !warned_no_peer_errors_) {
        warned_no_peer_errors_ = true;
        TANDEM_LOG(kWarn) << "kvtransfer: UCX_TLS=" << options_.tls
                          << " has no peer failure detection; dead peers are found by timeout";
      }
    }
    if (st != UCS_OK) {
      return Unavailable(std::string("UCX ep_create: ") + ucs_status_string(st));
    }
    peer->ep = EndpointPtr(ep, EndpointDeleter{worker(), peer_mode});
    ucp_rkey_h rkey = nullptr;
    st = ucp_ep_rkey_unpack(ep, peer->info.packed_rkey.data(), &rkey);
    if (st != UCS_OK) return InvalidArgument(std::string("UCX rkey_unpack: ") +
                                             ucs_status_string(st));
    peer->rkey.reset(rkey);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      peer_regions_[info.instance_id] = info.region_bytes;
    }
    peers_.emplace(info.instance_id, std::move(peer));
    TANDEM_LOG(kInfo) << "kvtransfer: connected to publisher " << info.instance_id;
    return Status();
  }

  static void OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
    // Runs inside ucp_worker_progress: only mark here, AfterProgress closes the endpoint.
    auto* peer = static_cast<Peer*>(arg);
    if (peer->failed) return;
    peer->failed = true;
    peer->failure = Unavailable(std::string("publisher ") + std::to_string(peer->info.instance_id) +
                                " failed: " + ucs_status_string(status));
  }

  void StartPull(std::unique_ptr<PullState> pull) {
    PullState* p = pull.get();
    pulls_.emplace(p, std::move(pull));
    auto it = peers_.find(p->instance_id);
    if (it == peers_.end() || it->second->failed) {
      p->error = Unavailable("publisher " + std::to_string(p->instance_id) + " is gone");
    } else {
      ReportLayers(p);
      ready_.push_back(p);
    }
    MaybeFinish(p);
    IssueGets();
  }

  // Raises a pull's available layers (progress thread); a pull waiting for them is ready again.
  // The timeout restarts: it bounds the wait for the publisher's next layer, not its compute.
  void RaiseLayers(const std::string& request_id, uint32_t layers) {
    for (auto& [p, owned] : pulls_) {
      if (p->request_id != request_id || p->finishing || p->timed_out) continue;
      if (layers <= p->layers_available) return;
      p->layers_available = layers;
      const auto now = Clock::now();
      p->deadline = now + options_.timeout;
      if (p->starved_since) {
        p->starved += now - *p->starved_since;
        p->starved_since.reset();
      }
      if (!p->error) {
        ReportLayers(p);
        ready_.push_back(p);
      }
      MaybeFinish(p);
      IssueGets();
      return;
    }
  }

  std::chrono::milliseconds LayerWait() const {
    return options_.layer_wait_timeout.count() > 0 ? options_.layer_wait_timeout
                                                   : options_.timeout;
  }

  bool Blocked(const PullState* p) const {
    return p->pieces[p->next].layer >= p->layers_available;
  }

  void IssueGets() {
    while (inflight_gets_ < options_.max_inflight_gets && !ready_.empty()) {
      PullState* p = ready_.front();
      if (p->error || p->next == p->pieces.size()) {
        ready_.pop_front();
        continue;
      }
      if (Blocked(p)) {  // RaiseLayers makes it ready again
        ready_.pop_front();
        if (p->outstanding == 0 && !p->starved_since) p->starved_since = Clock::now();
        continue;
      }
      Peer* peer = peers_.at(p->instance_id).get();
      size_t i = p->next++;
      const CopyPiece& piece = p->pieces[i];
      GetOp& op = p->ops[i];
      op.pull = p;
      op.layer = piece.layer;
      ucp_request_param_t param{};
      param.op_attr_mask =
          UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
      param.cb.send = &UcxPuller::OnGetDone;
      param.user_data = &op;
      param.memh = pool_->memh();
      ++p->outstanding;
      ++inflight_gets_;
      ucs_status_ptr_t req =
          ucp_get_nbx(peer->ep.get(), static_cast<char*>(region_.base) + piece.local_offset,
                      piece.length, peer->info.region_base + piece.remote_offset,
                      peer->rkey.get(), &param);
      if (req == nullptr) {
        Complete(&op, UCS_OK);
      } else if (UCS_PTR_IS_ERR(req)) {
        Complete(&op, UCS_PTR_STATUS(req));
      } else {
        op.request.reset(req);
      }
    }
  }

  static void OnGetDone(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<GetOp*>(user_data);
    // The request is freed here (UCX allows it in the callback); op.request owned it.
    TANDEM_CHECK(op->request.get() == request, "get completion for an unknown request");
    op->request.reset();
    op->pull->owner->Complete(op, status);
  }

  void Complete(GetOp* op, ucs_status_t status) {
    PullState* p = op->pull;
    --p->outstanding;
    --inflight_gets_;
    if (status == UCS_OK) {
      ++p->completed;
      --p->layer_remaining[op->layer];
      if (!p->error) ReportLayers(p);
      if (p->outstanding == 0 && p->next < p->pieces.size() && Blocked(p) && !p->starved_since)
        p->starved_since = Clock::now();
    } else if (!p->error) {
      p->error = p->timed_out && status == UCS_ERR_CANCELED
                     ? DeadlineExceeded("pull of " + p->request_id + " timed out")
                     : GetError(status);
    }
    MaybeFinish(p);
  }

  void ReportLayers(PullState* p) {
    while (p->layers_reported < p->layer_remaining.size() &&
           p->layers_reported < p->layers_available &&
           p->layer_remaining[p->layers_reported] == 0) {
      uint32_t layer = p->layers_reported++;
      if (p->callbacks.on_layer) p->callbacks.on_layer(layer);
    }
  }

  void MaybeFinish(PullState* p) {
    if (p->finishing || p->outstanding > 0) return;
    if (!p->error && p->completed < p->pieces.size()) return;
    p->finishing = true;
    finished_.push_back(p);
  }

  // Runs after every round of progress: failed peers, timeouts, new gets, finished pulls.
  void AfterProgress() {
    HandleFailedPeers();
    CheckTimeouts();
    IssueGets();
    ReapFinished();
  }

  void HandleFailedPeers() {
    for (auto it = peers_.begin(); it != peers_.end();) {
      Peer* peer = it->second.get();
      if (!peer->failed) {
        ++it;
        continue;
      }
      if (peer->failure.code() != StatusCode::kCancelled) {
        TANDEM_LOG(kWarn) << "kvtransfer: " << peer->failure.message() << "; dropping endpoint";
      }
      for (auto& [p, owned] : pulls_) {
        if (p->instance_id == peer->info.instance_id && !p->error) p->error = peer->failure;
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        peer_regions_.erase(peer->info.instance_id);
      }
      // Closing purges the gets still in flight; their callbacks may run in a later progress
      // round, so the peer (and its rkey) is retired until no pull is left.
      peer->ep.reset();
      retired_peers_.push_back(std::move(it->second));
      it = peers_.erase(it);
    }
    if (pulls_.empty()) retired_peers_.clear();
  }

  void CheckTimeouts() {
    auto now = Clock::now();
    if (now < next_timeout_check_) return;
    next_timeout_check_ = now + std::chrono::milliseconds(2);
    for (auto& [p, owned] : pulls_) {
      if (p->finishing) continue;
      // Moving bytes is bounded by `timeout` (from the start or the last raise); waiting, with
      // every available layer landed, for the publisher to announce the next one by
      // layer_wait_timeout.
      const auto limit = p->starved_since ? *p->starved_since + LayerWait() : p->deadline;
      if (!p->timed_out && now >= limit) {
        p->timed_out = true;
        p->grace_deadline = now + kCancelGrace;
        if (!p->error && p->starved_since) {
          p->error = DeadlineExceeded("pull of " + p->request_id + ": no layer announced within " +
                                      std::to_string(LayerWait().count()) + " ms (" +
                                      std::to_string(p->layers_available) + " of " +
                                      std::to_string(p->layer_remaining.size()) + " layers)");
        } else if (!p->error) {
          p->error = DeadlineExceeded("pull of " + p->request_id + " not done within " +
                                      std::to_string(options_.timeout.count()) + " ms (" +
                                      std::to_string(p->completed) + " of " +
                                      std::to_string(p->pieces.size()) + " pieces)");
        }
        for (size_t i = 0; i < p->next; ++i) {
          if (p->ops[i].request) ucp_request_cancel(worker(), p->ops[i].request.get());
        }
        MaybeFinish(p);
      } else if (p->timed_out && p->outstanding > 0 && now >= p->grace_deadline) {
        // RMA gets cannot always be cancelled: a peer that holds them is hung; drop it.
        auto it = peers_.find(p->instance_id);
        if (it != peers_.end() && !it->second->failed) {
          it->second->failed = true;
          it->second->failure = Unavailable("publisher " + std::to_string(p->instance_id) +
                                            " did not answer within the timeout");
        }
      }
    }
    HandleFailedPeers();
  }

  void ReapFinished() {
    while (!finished_.empty()) {
      PullState* p = finished_.front();
      finished_.pop_front();
      std::unique_ptr<PullState> owned = std::move(pulls_.at(p));
      pulls_.erase(p);
      std::erase(ready_, p);
      Status status = p->error ? *p->error : Status();
      const auto end = Clock::now();
      const auto starved = p->starved + (p->starved_since ? end - *p->starved_since
                                                           : Clock::duration{0});
      double seconds = std::chrono::duration<double>(end - p->start - starved).count();
      if (status.ok()) {
        metrics_.Succeeded(seconds, p->bytes);
      } else {
        metrics_.Failed(seconds, TransferMetrics::ReasonFor(status));
      }
      if (options_.report_results) SendResult(*p, status);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        active_.erase(p->request_id);
      }
      p->callbacks.on_done(p->request_id, status);
    }
    if (pulls_.empty()) retired_peers_.clear();
  }

  // Tells the publisher the outcome so that it frees its blocks (best effort: if the message is
  // lost the publisher's lease expires).
  void SendResult(const PullState& p, const Status& status) {
    auto it = peers_.find(p.instance_id);
    if (it == peers_.end() || it->second->failed) return;
    TransferResult result;
    result.instance_id = p.instance_id;
    result.request_id = p.request_id;
    result.code = status.code();
    result.message = status.message();
    result.bytes = status.ok() ? p.bytes : 0;
    auto* buffer = new std::string(Encode(result));
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = [](void* request, ucs_status_t, void* user_data) {
      delete static_cast<std::string*>(user_data);
      ucp_request_free(request);
    };
    param.user_data = buffer;
    ucs_status_ptr_t req = ucp_am_send_nbx(it->second->ep.get(), kAmTransferResult, nullptr, 0,
                                           buffer->data(), buffer->size(), &param);
    if (!UCS_PTR_IS_PTR(req)) {
      if (UCS_PTR_IS_ERR(req)) {
        TANDEM_LOG_REQ(kWarn, p.request_id) << "kvtransfer: result message not sent: "
                                            << ucs_status_string(UCS_PTR_STATUS(req));
      }
      delete buffer;
    }
  }

  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    // Commands posted before Stop have run; fail what is left and close every endpoint.
    for (auto& [p, owned] : pulls_) {
      if (!p->error) p->error = Cancelled("puller shut down");
      for (size_t i = 0; i < p->next; ++i) {
        if (p->ops[i].request) ucp_request_cancel(worker(), p->ops[i].request.get());
      }
      MaybeFinish(p);
    }
    for (auto& [id, peer] : peers_) {
      // A live peer gets a flushing close: force-closing an endpoint whose wireup is still
      // running trips an assertion in UCX 1.13 (ucp_request.c: "got REP message").
      if (!peer->failed) {
        peer->ep.get_deleter().force = false;
        peer->ep.reset();
      }
    }
    for (auto& [id, peer] : peers_) {
      peer->failed = true;
      peer->failure = Cancelled("puller shut down");
    }
    HandleFailedPeers();
    ReapFinished();
    // Purged gets may complete in later progress rounds: give them a bounded while.
    auto give_up = Clock::now() + std::chrono::seconds(2);
    while (!pulls_.empty() && Clock::now() < give_up) {
      ucp_worker_progress(worker());
      ReapFinished();
    }
    if (pulls_.empty()) retired_peers_.clear();
    if (!pulls_.empty()) {
      TANDEM_LOG(kError) << "kvtransfer: " << pulls_.size() << " pulls still had gets in flight";
      for (auto& [p, owned] : pulls_) owned.release();  // their ops may still be referenced
    }
  }

  MemoryRegion region_;
  UcxOptions options_;
  TransferMetrics metrics_;
  std::shared_ptr<UcxPoolImpl> pool_;  // shares the worker's context
  std::unique_ptr<UcxWorker> worker_;

  // Shared with caller threads.
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, uint64_t> peer_regions_;  // instance_id -> region bytes
  std::set<std::string> active_;                         // request ids being pulled
  bool stopping_ = false;

  // Progress thread only.
  std::map<uint64_t, std::unique_ptr<Peer>> peers_;
  std::vector<std::unique_ptr<Peer>> retired_peers_;  // closed, rkey kept until pulls drain
  std::map<PullState*, std::unique_ptr<PullState>> pulls_;
  std::deque<PullState*> ready_;
  std::deque<PullState*> finished_;
  size_t inflight_gets_ = 0;
  bool warned_no_peer_errors_ = false;
  Clock::time_point next_timeout_check_{};
};

}  // namespace

StatusOr<std::shared_ptr<UcxPool>> AllocateUcxPool(size_t bytes, const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto pool,
                          UcxPoolImpl::Create({nullptr, bytes}, /*allocate=*/true, options.tls));
  MemoryRegion region = pool->region();
  std::memset(region.base, 0, region.bytes);  // the heap fallback of UCX_ALLOC_PRIO is not zeroed
  return std::shared_ptr<UcxPool>(std::move(pool));
}

namespace {
StatusOr<std::shared_ptr<UcxPoolImpl>> ImplOf(std::shared_ptr<UcxPool> pool) {
  if (pool == nullptr) return InvalidArgument("kvtransfer: no UCX pool");
  return std::static_pointer_cast<UcxPoolImpl>(std::move(pool));  // the only implementation
}
}  // namespace

StatusOr<std::unique_ptr<KvPublisher>> CreateUcxPublisher(MemoryRegion region,
                                                          const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto pool, UcxPoolImpl::Create(region, /*allocate=*/false, options.tls));
  return UcxPublisher::Create(std::move(pool), options);
}

StatusOr<std::unique_ptr<KvPublisher>> CreateUcxPublisher(std::shared_ptr<UcxPool> pool,
                                                          const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto impl, ImplOf(std::move(pool)));
  return UcxPublisher::Create(std::move(impl), options);
}

StatusOr<std::unique_ptr<KvPuller>> CreateUcxPuller(MemoryRegion region,
                                                    const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto pool, UcxPoolImpl::Create(region, /*allocate=*/false, options.tls));
  return UcxPuller::Create(std::move(pool), options);
}

StatusOr<std::unique_ptr<KvPuller>> CreateUcxPuller(std::shared_ptr<UcxPool> pool,
                                                    const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto impl, ImplOf(std::move(pool)));
  return UcxPuller::Create(std::move(impl), options);
}

}  // namespace tandem
