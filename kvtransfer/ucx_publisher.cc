// The UCX publisher: registers the pool once, offers published ranges for RMA gets or answers
// authenticated read messages for them (kvtransfer/ucx_reads.h), receives TransferResults as
// active messages and expires leases (kvtransfer/ucx_transport.h).
#include "kvtransfer/ucx_transport.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "common/base/log.h"
#include "kvtransfer/ucx_handles.h"
#include "kvtransfer/ucx_reads.h"
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

    PeerInfo& info = pub->info_;
    ucs_status_t st = UCS_OK;
    if (pub->pool_->rma()) {  // read messages need no key: nothing is readable by address
      void* rkey_buffer = nullptr;
      size_t rkey_size = 0;
      st = ucp_rkey_pack(pub->worker_->context(), pub->pool_->memh(), &rkey_buffer, &rkey_size);
      if (st != UCS_OK) return UcxError("rkey_pack", st);
      std::unique_ptr<void, RkeyBufferDeleter> rkey_owner(rkey_buffer);
      info.packed_rkey.assign(static_cast<const char*>(rkey_buffer), rkey_size);
    }

    ucp_address_t* address = nullptr;
    size_t address_size = 0;
    st = ucp_worker_get_address(pub->worker_->worker(), &address, &address_size);
    if (st != UCS_OK) return UcxError("worker_get_address", st);
    std::unique_ptr<ucp_address_t, AddressDeleter> address_owner(
        address, AddressDeleter{pub->worker_->worker()});

    info.instance_id = NewInstanceId();
    info.transport = pub->pool_->rma() ? kUcxRmaTransport : kUcxMessagesTransport;
    info.worker_address.assign(reinterpret_cast<const char*>(address), address_size);
    info.region_base = reinterpret_cast<uint64_t>(region.base);
    info.region_bytes = region.bytes;

    // The result handler is set even when results are not acted on (SetAmHandlers says why).
    TANDEM_RETURN_IF_ERROR(SetAmHandlers(pub->worker_->worker(), pub.get(),
                                         {{kAmTransferResult, &UcxPublisher::OnResultMessage},
                                          {kAmReadRequest, &UcxPublisher::OnReadRequest},
                                          {kAmReadReply, &UcxPublisher::OnStrayMessage}}));

    if (options.metrics != nullptr) {
      pub->refusals_ = &options.metrics->AddCounter(
          "tandem_kv_read_refusals_total",
          "KV read or result messages the publisher would not act on, by reason", {"reason"});
    }
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
    Lease lease{Clock::now() + options_.lease_timeout, std::move(on_release), {}, {}};
    if (!options_.secret.empty())
      lease.mac = MakeKvReadMac(options_.secret, info_.instance_id, request_id);
    for (const auto& layer : d.layers)
      for (const ByteRange& r : layer) lease.spans.emplace_back(r.offset, r.offset + r.length);
    // Coalesced: the puller may read adjacent ranges as one piece (PlanCopies merges them).
    std::sort(lease.spans.begin(), lease.spans.end());
    std::vector<std::pair<uint64_t, uint64_t>> merged;
    for (const auto& span : lease.spans) {
      if (!merged.empty() && span.first <= merged.back().second)
        merged.back().second = std::max(merged.back().second, span.second);
      else
        merged.push_back(span);
    }
    lease.spans = std::move(merged);
    MutexLock lock(&mutex_);
    if (leases_.count(request_id)) {
      return InvalidArgument("request " + request_id + " is already published");
    }
    leases_.emplace(request_id, std::move(lease));
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
    std::optional<KvReadMac> mac;  // what read and result messages must carry (with a secret)
    std::vector<std::pair<uint64_t, uint64_t>> spans;  // [begin, end) published, sorted, merged
  };

  // Whether [offset, offset + length) lies inside one published range of `lease`.
  static bool Covers(const Lease& lease, uint64_t offset, uint64_t length) {
    if (length == 0 || offset + length < offset) return false;
    auto it = std::upper_bound(lease.spans.begin(), lease.spans.end(),
                               std::pair<uint64_t, uint64_t>{offset, UINT64_MAX});
    if (it == lease.spans.begin()) return false;
    --it;
    return it->first <= offset && offset + length <= it->second;
  }

  // A refusal, counted by `reason` (malformed | mac | range) and logged at most once a second
  // (a stranger can send many).
  void Refuse(const char* reason, const std::string& why) {
    if (refusals_ != nullptr) refusals_->WithLabels({reason}).Inc();
    const auto now = Clock::now();
    ++refused_;
    if (now - last_refusal_log_ < std::chrono::seconds(1)) return;
    last_refusal_log_ = now;
    TANDEM_LOG(kWarn) << "kvtransfer: refused a read message (" << why << "; " << refused_
                      << " refused so far)";
  }

  // Progress thread (an AM handler): serves one authenticated read of a published range.
  static ucs_status_t OnReadRequest(void* arg, const void* header, size_t header_length, void*,
                                    size_t, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxPublisher*>(arg);
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == nullptr) {
      self->Refuse("malformed", "no reply endpoint");
      return UCS_OK;
    }
    auto request =
        DecodeReadRequest({static_cast<const uint8_t*>(header), header_length});
    if (!request.ok()) {
      self->Refuse("malformed", request.status().message());
      return UCS_OK;
    }
    StatusCode code = StatusCode::kOk;
    const char* refusal = nullptr;  // the metric's reason
    const char* what = "";           // the log's
    {
      MutexLock lock(&self->mutex_);
      auto it = self->leases_.find(request->request_id);
      if (request->instance_id != self->info_.instance_id || it == self->leases_.end()) {
        code = StatusCode::kNotFound;  // released, expired, or never published here
      } else if (!it->second.mac || !KvReadMacsEqual(*it->second.mac, request->mac)) {
        code = StatusCode::kPermissionDenied;
        refusal = "mac";
        what = "a read without the cluster secret's mac for ";
      } else if (!Covers(it->second, request->offset, request->length)) {
        code = StatusCode::kPermissionDenied;
        refusal = "range";
        what = "a read of a range that was not published for ";
      }
    }
    if (refusal != nullptr) self->Refuse(refusal, what + request->request_id);
    self->SendReply(param->reply_ep, request->token, code, request->offset,
                    code == StatusCode::kOk ? request->length : 0);
    return UCS_OK;
  }

  // The bytes (or a refusal) back to the reader. The header lives until the send completes; the
  // bytes are the published KV, held until the puller (which receives them before it reports)
  // says it is done.
  void SendReply(ucp_ep_h ep, uint64_t token, StatusCode code, uint64_t offset, uint64_t length) {
    auto* reply = new ReadReplyHeader{token, static_cast<uint32_t>(code), 0};
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = [](void* request, ucs_status_t, void* user_data) {
      delete static_cast<ReadReplyHeader*>(user_data);
      ucp_request_free(request);
    };
    param.user_data = reply;
    if (length > 0) {
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      param.memh = pool_->memh();
    }
    const char* data = static_cast<const char*>(pool_->region().base) + offset;
    ucs_status_ptr_t req = ucp_am_send_nbx(ep, kAmReadReply, reply, sizeof *reply,
                                           length > 0 ? data : nullptr, length, &param);
    if (!UCS_PTR_IS_PTR(req)) {
      if (UCS_PTR_IS_ERR(req)) {
        TANDEM_LOG(kDebug) << "kvtransfer: read reply not sent: "
                           << ucs_status_string(UCS_PTR_STATUS(req));
      }
      delete reply;
    }
  }

  // Read replies are for pullers: a publisher drops them.
  static ucs_status_t OnStrayMessage(void* arg, const void*, size_t, void*, size_t,
                                     const ucp_am_recv_param_t*) {
    static_cast<UcxPublisher*>(arg)->Refuse("malformed", "a read reply sent to a publisher");
    return UCS_OK;
  }

  explicit UcxPublisher(const UcxOptions& options) : options_(options) {}

  static ucs_status_t OnResultMessage(void* arg, const void* header, size_t header_length,
                                      void* data, size_t length,
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
    if (!self->options_.secret.empty()) {  // only the puller that could read it may release it
      MutexLock lock(&self->mutex_);
      auto it = self->leases_.find(result->request_id);
      if (it != self->leases_.end() &&
          (!it->second.mac ||
           !KvReadMacsEqual(*it->second.mac,
                            {static_cast<const uint8_t*>(header), header_length}))) {
        self->Refuse("mac", "a result message without the request's mac");
        return UCS_OK;
      }
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
  // Progress thread only: read and result messages refused, and when that was last logged.
  uint64_t refused_ = 0;
  Clock::time_point last_refusal_log_{};
  Family<Counter>* refusals_ = nullptr;  // tandem_kv_read_refusals_total, when metrics are on
};

}  // namespace

StatusOr<std::unique_ptr<KvPublisher>> CreatePublisherOnPool(std::shared_ptr<UcxPoolImpl> pool,
                                                             const UcxOptions& options) {
  return UcxPublisher::Create(std::move(pool), options);
}

}  // namespace tandem::ucx_detail
