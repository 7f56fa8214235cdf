// Internals of the UCX backend (kvtransfer/ucx_transport.h), shared by its publisher
// (ucx_publisher.cc) and puller (ucx_puller.cc): RAII for every UCX handle, the ucp context, a
// ucp worker with its own progress thread, region registration and the pool. Not for use outside
// kvtransfer/ucx_*.cc.
#pragma once

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/base/fd.h"
#include "common/base/log.h"
#include "common/base/status.h"
#include "common/base/thread_annotations.h"
#include "kvtransfer/ucx_transport.h"

namespace tandem::ucx_detail {

using Clock = std::chrono::steady_clock;
constexpr uint16_t kAmTransferResult = 1;  // read messages: kvtransfer/ucx_reads.h
// PeerInfo::transport of a publisher that offers RMA gets, or answers read messages.
inline constexpr char kUcxRmaTransport[] = "ucx";
inline constexpr char kUcxMessagesTransport[] = "ucx-am";
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

// Closes the endpoint (forcibly when it has peer error handling) and progresses the worker until
// the close completes; outstanding operations on it complete with an error before this returns.
// Progress thread only.
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

inline Status UcxError(const std::string& what, ucs_status_t status) {
  return Internal("UCX " + what + ": " + ucs_status_string(status));
}

// Sets one active-message handler per id on `worker`, all with `arg`. Every id either side sends
// needs one on both: UCX (1.13) crashes on an active message whose id has no handler, and any
// process that reaches a worker can send one.
inline Status SetAmHandlers(
    ucp_worker_h worker, void* arg,
    std::initializer_list<std::pair<uint16_t, ucp_am_recv_callback_t>> handlers) {
  for (const auto& [id, cb] : handlers) {
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = id;
    am.cb = cb;
    am.arg = arg;
    ucs_status_t st = ucp_worker_set_am_recv_handler(worker, &am);
    if (st != UCS_OK) return UcxError("set_am_recv_handler", st);
  }
  return Status();
}

// A status for a get that completed with an error.
inline Status GetError(ucs_status_t status) {
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

// ---- a ucp worker with its own progress thread ---------------------------------------------

// A ucp context, shared by a pool's memory and the worker that registered it (the memory handle
// must not outlive the context).
struct UcxContext {
  ContextPtr context;
  std::string tls;
  bool rma = false;  // has UCP_FEATURE_RMA (UcxReads::kRma); else it serves no remote access
};

// `net_devices`: UCX_NET_DEVICES ("lo", "eth0", ...): the network interfaces the worker's
// address offers peers; empty = every interface. `rma`: whether the context may do (and so
// serve) RMA.
inline StatusOr<std::shared_ptr<UcxContext>> CreateContext(const std::string& tls,
                                                          const std::string& net_devices,
                                                          bool rma) {
  ucp_config_t* raw_config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &raw_config);
  if (st != UCS_OK) return UcxError("config read", st);
  ConfigPtr config(raw_config);
  if (!tls.empty()) {
    st = ucp_config_modify(config.get(), "TLS", tls.c_str());
    if (st != UCS_OK) return InvalidArgument("transfer.ucx_tls '" + tls + "': " +
                                             ucs_status_string(st));
  }
  if (!net_devices.empty()) {
    st = ucp_config_modify(config.get(), "NET_DEVICES", net_devices.c_str());
    if (st != UCS_OK) return InvalidArgument("UCX_NET_DEVICES '" + net_devices + "': " +
                                             ucs_status_string(st));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | (rma ? UCP_FEATURE_RMA : 0);
  ucp_context_h context = nullptr;
  st = ucp_init(&params, config.get(), &context);
  if (st != UCS_OK) return UcxError("init (UCX_TLS=" + tls + ")", st);
  auto owned = std::make_shared<UcxContext>();
  owned->context.reset(context);
  owned->tls = tls;
  owned->rma = rma;
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
      MutexLock lock(&mutex_);
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
        MutexLock lock(&mutex_);
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
  Mutex mutex_;
  std::vector<std::function<void()>> commands_ TANDEM_GUARDED_BY(mutex_);
  std::function<void()> on_loop_;
  bool stop_ = false;  // progress thread only
  std::thread thread_;
};

// Registers `*region`; when `allocate`, UCX allocates region->bytes itself (shared memory
// first, per UCX_ALLOC_PRIO) and *region gets the address.
inline StatusOr<MemhPtr> MapRegion(ucp_context_h context, MemoryRegion* region,
                                   bool allocate = false,
                                   ucs_memory_type_t memory_type = UCS_MEMORY_TYPE_HOST) {
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
  if (memory_type != UCS_MEMORY_TYPE_HOST) {  // UCX would detect it; said, it need not guess
    params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.memory_type = memory_type;
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
  // `owner` (may be null) keeps memory allocated elsewhere alive as long as the pool.
  static StatusOr<std::shared_ptr<UcxPoolImpl>> Create(
      MemoryRegion region, bool allocate, const std::string& tls, const std::string& net_devices,
      bool rma, ucs_memory_type_t memory_type = UCS_MEMORY_TYPE_HOST,
      std::shared_ptr<void> owner = nullptr) {
    TANDEM_ASSIGN_OR_RETURN(auto context, CreateContext(tls, net_devices, rma));
    auto pool = std::shared_ptr<UcxPoolImpl>(new UcxPoolImpl());
    pool->context_ = std::move(context);
    TANDEM_ASSIGN_OR_RETURN(pool->memh_, MapRegion(pool->context_->context.get(), &region,
                                                   allocate, memory_type));
    pool->region_ = region;
    pool->owner_ = std::move(owner);
    return pool;
  }
  ~UcxPoolImpl() override { memh_.reset(); }  // before the context (and the memory) go

  MemoryRegion region() const override { return region_; }
  const std::string& tls() const override { return context_->tls; }
  const std::shared_ptr<UcxContext>& context() const { return context_; }
  bool rma() const { return context_->rma; }
  ucp_mem_h memh() const { return memh_.get(); }

 private:
  UcxPoolImpl() = default;
  std::shared_ptr<void> owner_;  // declared first: goes last
  std::shared_ptr<UcxContext> context_;
  MemhPtr memh_;
  MemoryRegion region_;
};

// Creates the publisher / puller on a pool (ucx_publisher.cc, ucx_puller.cc).
StatusOr<std::unique_ptr<KvPublisher>> CreatePublisherOnPool(std::shared_ptr<UcxPoolImpl> pool,
                                                             const UcxOptions& options);
StatusOr<std::unique_ptr<KvPuller>> CreatePullerOnPool(std::shared_ptr<UcxPoolImpl> pool,
                                                       const UcxOptions& options);

}  // namespace tandem::ucx_detail
