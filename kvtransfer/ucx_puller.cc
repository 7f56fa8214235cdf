// The UCX puller: connects to publishers, issues RMA gets (or authenticated read messages,
// kvtransfer/ucx_reads.h) layer by layer within the in-flight bound, times pulls out, drops dead
// or hung peers (kvtransfer/ucx_transport.h).
#include "kvtransfer/ucx_transport.h"

#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <unordered_map>

#include "common/base/log.h"
#include "kvtransfer/ucx_handles.h"
#include "kvtransfer/ucx_reads.h"
#include "kvtransfer/wire.h"

namespace tandem::ucx_detail {
namespace {

// ---- puller --------------------------------------------------------------------------------

class UcxPuller final : public KvPuller {
 public:
  static StatusOr<std::unique_ptr<KvPuller>> Create(std::shared_ptr<UcxPoolImpl> pool,
                                                    const UcxOptions& options) {
    TANDEM_ASSIGN_OR_RETURN(auto worker, UcxWorker::Create(pool->context()));
    auto puller = std::unique_ptr<UcxPuller>(new UcxPuller(pool->region(), options));
    puller->worker_ = std::move(worker);
    puller->pool_ = std::move(pool);
    // Only read replies are acted on; the other ids get a handler that drops them.
    TANDEM_RETURN_IF_ERROR(SetAmHandlers(puller->worker_->worker(), puller.get(),
                                         {{kAmReadReply, &UcxPuller::OnReadReply},
                                          {kAmReadRequest, &UcxPuller::OnStrayMessage},
                                          {kAmTransferResult, &UcxPuller::OnStrayMessage}}));
    UcxPuller* raw = puller.get();
    puller->worker_->Start([raw] { raw->AfterProgress(); });
    return std::unique_ptr<KvPuller>(std::move(puller));
  }

  ~UcxPuller() override {
    worker_->Stop([this] { Shutdown(); });
  }

  Status Connect(const PeerInfo& info) override {
    const std::string want = rma() ? kUcxRmaTransport : kUcxMessagesTransport;
    if (info.transport != want) {
      return InvalidArgument("publisher transport is '" + info.transport + "', this puller's is '" +
                             want + "' (set the same transfer.ucx_tls on both sides)");
    }
    if (info.worker_address.empty() || (rma() && info.packed_rkey.empty())) {
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
      MutexLock lock(&mutex_);
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
      MutexLock lock(&mutex_);
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
      MutexLock lock(&mutex_);
      if (!active_.count(request_id)) return NotFound("request " + request_id + " is not pulling");
    }
    worker_->Post([this, request_id, layers] { RaiseLayers(request_id, layers); });
    return Status();
  }

  size_t inflight_count() const override {
    MutexLock lock(&mutex_);
    return active_.size();
  }

 private:
  struct PullState;
  // One piece's get, or (read messages) its request, reply and receive, in flight.
  struct GetOp {
    PullState* pull = nullptr;
    size_t piece = 0;
    uint32_t layer = 0;
    RequestPtr request;  // set while the get (or the reply's rendezvous receive) is in flight
    // UCX may run the completion callback inside the call that starts the operation and still
    // return the request (seen for a rendezvous receive from a publisher that stopped
    // answering): the callback then finds no request yet and leaves the status here.
    bool completed_early = false;
    ucs_status_t early_status = UCS_OK;
    uint64_t token = 0;  // read messages: set while the reply is awaited (in awaiting_)
    void* reply = nullptr;  // read messages: a rendezvous reply not yet received (in replies_)
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
    KvReadMac mac{};  // read messages: proves to the publisher that we hold the secret
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
  bool rma() const { return pool_->rma(); }

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
    if (rma()) {
      ucp_rkey_h rkey = nullptr;
      st = ucp_ep_rkey_unpack(ep, peer->info.packed_rkey.data(), &rkey);
      if (st != UCS_OK) return InvalidArgument(std::string("UCX rkey_unpack: ") +
                                               ucs_status_string(st));
      peer->rkey.reset(rkey);
    }
    {
      MutexLock lock(&mutex_);
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
    if (!rma()) p->mac = MakeKvReadMac(options_.secret, p->instance_id, p->request_id);
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
      op.piece = i;
      op.layer = piece.layer;
      if (!rma()) {
        SendReadRequest(peer, &op);
        continue;
      }
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
      Adopt(&op, req);
    }
  }

  // What a started get or receive returned: done now (NULL), failed, completed early (see
  // GetOp::completed_early; the request is ours to free), or in flight.
  void Adopt(GetOp* op, ucs_status_ptr_t req) {
    if (req == nullptr) {
      Complete(op, UCS_OK);
    } else if (UCS_PTR_IS_ERR(req)) {
      Complete(op, UCS_PTR_STATUS(req));
    } else if (op->completed_early) {
      op->completed_early = false;
      ucp_request_free(req);
      Complete(op, op->early_status);
    } else {
      op->request.reset(req);
    }
  }

  // A get's or receive's completion callback: true when the caller must Complete `op` now,
  // false when it completed inside the call that started it (Adopt finishes it).
  static bool TakeCompletion(GetOp* op, void* request, ucs_status_t status) {
    if (!op->request) {
      op->completed_early = true;
      op->early_status = status;
      return false;
    }
    TANDEM_CHECK(op->request.get() == request, "completion for an unknown request");
    op->request.reset();  // frees it (UCX allows that in the callback)
    return true;
  }

  // Read messages: asks the publisher for one piece; the reply comes to OnReadReply.
  void SendReadRequest(Peer* peer, GetOp* op) {
    PullState* p = op->pull;
    const CopyPiece& piece = p->pieces[op->piece];
    ++p->outstanding;
    ++inflight_gets_;
    do {
      op->token = token_rng_();
    } while (op->token == 0 || awaiting_.count(op->token));
    awaiting_.emplace(op->token, op);
    auto* message = new std::string(EncodeReadRequest(
        {op->token, p->instance_id, piece.remote_offset, piece.length, p->mac, p->request_id}));
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY;
    param.cb.send = [](void* request, ucs_status_t, void* user_data) {
      delete static_cast<std::string*>(user_data);
      ucp_request_free(request);
    };
    param.user_data = message;
    ucs_status_ptr_t req = ucp_am_send_nbx(peer->ep.get(), kAmReadRequest, message->data(),
                                           message->size(), nullptr, 0, &param);
    if (UCS_PTR_IS_PTR(req)) return;  // the callback frees the message
    delete message;
    if (UCS_PTR_IS_ERR(req)) {  // not sent: no reply will come
      awaiting_.erase(op->token);
      op->token = 0;
      Complete(op, UCS_PTR_STATUS(req));
    }
  }

  // Progress thread (an AM handler): a publisher's answer to one read request.
  static ucs_status_t OnReadReply(void* arg, const void* header, size_t header_length,
                                  void* data, size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxPuller*>(arg);
    ReadReplyHeader reply;
    if (header_length != sizeof reply) return UCS_OK;  // not a reply: dropped
    std::memcpy(&reply, header, sizeof reply);
    auto it = self->awaiting_.find(reply.token);
    if (it == self->awaiting_.end()) return UCS_OK;  // cancelled, or nobody asked: dropped
    GetOp* op = it->second;
    self->awaiting_.erase(it);
    op->token = 0;
    PullState* p = op->pull;
    const CopyPiece& piece = p->pieces[op->piece];
    if (reply.status != static_cast<uint32_t>(StatusCode::kOk)) {
      if (!p->error) {
        const auto code = static_cast<StatusCode>(reply.status);
        p->error = code == StatusCode::kNotFound
                       ? NotFound("publisher " + std::to_string(p->instance_id) + " no longer has " +
                                  p->request_id)
                       : PermissionDenied("publisher " + std::to_string(p->instance_id) +
                                          " refused to read " + p->request_id);
      }
      self->Complete(op, UCS_ERR_REJECTED);
      return UCS_OK;
    }
    if (length != piece.length) {
      if (!p->error)
        p->error = Internal("read reply of " + std::to_string(length) + " bytes for a range of " +
                            std::to_string(piece.length));
      self->Complete(op, UCS_ERR_MESSAGE_TRUNCATED);
      return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      // Received outside the handler (ReceiveReplies), straight into the pool.
      op->reply = data;
      self->replies_.push_back(op);
      return UCS_INPROGRESS;
    }
    void* at = static_cast<char*>(self->region_.base) + piece.local_offset;
    if (!self->options_.copy_into_pool) {
      std::memcpy(at, data, length);
    } else if (Status copied = self->options_.copy_into_pool(at, data, length); !copied.ok()) {
      if (!p->error) p->error = copied.WithContext("copying a read reply into the KV pool");
      self->Complete(op, UCS_ERR_IO_ERROR);
      return UCS_OK;
    }
    self->Complete(op, UCS_OK);
    return UCS_OK;
  }

  // Read messages: starts receiving the rendezvous replies that arrived in the last progress.
  void ReceiveReplies() {
    while (!replies_.empty()) {
      GetOp* op = replies_.front();
      replies_.pop_front();
      if (op->reply == nullptr) continue;  // cancelled meanwhile (CancelOps released it)
      void* descriptor = std::exchange(op->reply, nullptr);
      const CopyPiece& piece = op->pull->pieces[op->piece];
      ucp_request_param_t param{};
      param.op_attr_mask =
          UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
      param.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
        auto* done = static_cast<GetOp*>(user_data);
        if (TakeCompletion(done, request, status)) done->pull->owner->Complete(done, status);
      };
      param.user_data = op;
      param.memh = pool_->memh();
      ucs_status_ptr_t req =
          ucp_am_recv_data_nbx(worker(), descriptor,
                               static_cast<char*>(region_.base) + piece.local_offset,
                               piece.length, &param);
      Adopt(op, req);
    }
  }

  // Stops every piece of `p` in flight: gets and receives are cancelled (their callbacks complete
  // them), read requests still awaiting a reply and replies not yet received complete now.
  void CancelOps(PullState* p) {
    for (size_t i = 0; i < p->next; ++i) {
      GetOp& op = p->ops[i];
      if (op.request) ucp_request_cancel(worker(), op.request.get());
      if (op.token != 0) {
        awaiting_.erase(op.token);
        op.token = 0;
        Complete(&op, UCS_ERR_CANCELED);
      } else if (op.reply != nullptr) {
        ucp_am_data_release(worker(), std::exchange(op.reply, nullptr));
        Complete(&op, UCS_ERR_CANCELED);
      }
    }
  }

  // Read requests and results are for publishers: a puller drops them.
  static ucs_status_t OnStrayMessage(void*, const void*, size_t, void*, size_t,
                                     const ucp_am_recv_param_t*) {
    TANDEM_LOG(kDebug) << "kvtransfer: a puller dropped a message meant for a publisher";
    return UCS_OK;
  }

  static void OnGetDone(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<GetOp*>(user_data);
    if (TakeCompletion(op, request, status)) op->pull->owner->Complete(op, status);
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
    ReceiveReplies();
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
        if (p->instance_id != peer->info.instance_id) continue;
        if (!p->error) p->error = peer->failure;
        CancelOps(p);  // no reply will come; receives are purged with the endpoint
      }
      {
        MutexLock lock(&mutex_);
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
        CancelOps(p);
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
        MutexLock lock(&mutex_);
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
    // With a secret the publisher acts only on a result that carries the request's mac.
    const KvReadMac mac = options_.secret.empty()
                              ? KvReadMac{}
                              : MakeKvReadMac(options_.secret, p.instance_id, p.request_id);
    buffer->insert(0, reinterpret_cast<const char*>(mac.data()), mac.size());  // the header
    ucs_status_ptr_t req = ucp_am_send_nbx(
        it->second->ep.get(), kAmTransferResult, buffer->data(),
        options_.secret.empty() ? 0 : mac.size(), buffer->data() + mac.size(),
        buffer->size() - mac.size(), &param);
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
      MutexLock lock(&mutex_);
      stopping_ = true;
    }
    // Commands posted before Stop have run; fail what is left and close every endpoint.
    for (auto& [p, owned] : pulls_) {
      if (!p->error) p->error = Cancelled("puller shut down");
      CancelOps(p);
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
  mutable Mutex mutex_;
  // instance_id -> region bytes
  std::unordered_map<uint64_t, uint64_t> peer_regions_ TANDEM_GUARDED_BY(mutex_);
  std::set<std::string> active_ TANDEM_GUARDED_BY(mutex_);  // request ids being pulled
  bool stopping_ TANDEM_GUARDED_BY(mutex_) = false;

  // Progress thread only.
  std::map<uint64_t, std::unique_ptr<Peer>> peers_;
  std::vector<std::unique_ptr<Peer>> retired_peers_;  // closed, rkey kept until pulls drain
  std::map<PullState*, std::unique_ptr<PullState>> pulls_;
  std::deque<PullState*> ready_;
  std::deque<PullState*> finished_;
  size_t inflight_gets_ = 0;
  // Read messages: the pieces whose reply is awaited, by token (random, single-use); rendezvous
  // replies that arrived and are not yet being received.
  std::unordered_map<uint64_t, GetOp*> awaiting_;
  std::deque<GetOp*> replies_;
  std::mt19937_64 token_rng_{std::random_device{}()};
  bool warned_no_peer_errors_ = false;
  Clock::time_point next_timeout_check_{};
};

}  // namespace

StatusOr<std::unique_ptr<KvPuller>> CreatePullerOnPool(std::shared_ptr<UcxPoolImpl> pool,
                                                       const UcxOptions& options) {
  return UcxPuller::Create(std::move(pool), options);
}

}  // namespace tandem::ucx_detail
