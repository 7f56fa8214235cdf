// The UCX publisher: registers the pool once, offers published ranges for RMA gets, receives
// TransferResults as active messages and expires leases (kvtransfer/ucx_transport.h).
#include "kvtransfer/ucx_transport.h"

#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "common/base/log.h"
#include "kvtransfer/ucx_handles.h"
#include "kvtransfer/wire.h"

namespace tandem::ucx_detail {
namespace {

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

    // Registered even when results are not acted on: UCX (1.13) crashes on an active message
    // whose id has no handler, and any process that reaches the worker can send one.
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
      MutexLock lock(&mutex_);
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
    MutexLock lock(&mutex_);
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
      MutexLock lock(&mutex_);
      auto it = leases_.find(result.request_id);
      if (it == leases_.end()) return NotFound("request " + result.request_id + " not published");
      lease = std::move(it->second);
      leases_.erase(it);
    }
    lease.on_release(result.request_id, result.ToStatus());
    return Status();
  }

  size_t published_count() const override {
    MutexLock lock(&mutex_);
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
    // The servers release KV on the control plane's KvReleased (authenticated): their publishers
    // act on no message that arrives over UCX, where any process that reaches the worker could
    // send one.
    if (!self->options_.report_results) {
      TANDEM_LOG(kDebug) << "kvtransfer: ignoring a result message (results come by control)";
      return UCS_OK;
    }
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
      MutexLock lock(&mutex_);
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
  mutable Mutex mutex_;
  std::map<std::string, Lease> leases_ TANDEM_GUARDED_BY(mutex_);
  Clock::time_point next_lease_check_{};
};

}  // namespace

StatusOr<std::unique_ptr<KvPublisher>> CreatePublisherOnPool(std::shared_ptr<UcxPoolImpl> pool,
                                                             const UcxOptions& options) {
  return UcxPublisher::Create(std::move(pool), options);
}

}  // namespace tandem::ucx_detail
