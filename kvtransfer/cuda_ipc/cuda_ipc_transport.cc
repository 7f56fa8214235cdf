#include "kvtransfer/cuda_ipc/cuda_ipc_transport.h"

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstring>
#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "common/base/log.h"
#include "common/base/thread_annotations.h"
#include "common/engine/cuda/cuda_backend.h"
#include "common/engine/cuda/cuda_util.h"
#include "common/engine/cuda/kernels.h"
#include "kvtransfer/layer_copies.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

std::string CudaErrorText(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

// ---- publisher ---------------------------------------------------------------------------------

class CudaIpcPublisher final : public KvPublisher {
 public:
  // `pool_bytes`: of each pool (ranges are offsets in rank 0's, the same in every pool).
  CudaIpcPublisher(uint64_t pool_bytes, PeerInfo info, std::chrono::milliseconds lease_timeout)
      : pool_bytes_(pool_bytes), info_(std::move(info)), lease_timeout_(lease_timeout) {
    expiry_ = std::thread([this] { ExpireLeases(); });
  }

  ~CudaIpcPublisher() override {
    std::map<std::string, Lease> left;
    {
      MutexLock lock(&mutex_);
      stopping_ = true;
      left.swap(leases_);
    }
    cv_.notify_all();
    expiry_.join();
    for (auto& [id, lease] : left) lease.on_release(id, Cancelled("publisher shut down"));
  }

  const PeerInfo& peer_info() const override { return info_; }

  StatusOr<KvDescriptor> Publish(const std::string& request_id, LayerRanges layers,
                                 ReleaseCallback on_release) override {
    TANDEM_RETURN_IF_ERROR(CheckRanges(layers, pool_bytes_));
    TANDEM_ASSIGN_OR_RETURN(KvDescriptor d,
                            MakeDescriptor(info_.instance_id, request_id, std::move(layers)));
    MutexLock lock(&mutex_);
    if (stopping_) return FailedPrecondition("publisher is stopping");
    if (!leases_.emplace(request_id, Lease{std::move(on_release), Clock::now() + lease_timeout_})
             .second)
      return InvalidArgument("request " + request_id + " is already published");
    return d;
  }

  Status Release(const TransferResult& result) override {
    if (result.instance_id != info_.instance_id)
      return InvalidArgument("result for another publisher instance");
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
    ReleaseCallback on_release;
    Clock::time_point deadline;
  };

  // Drops publications nobody released within the lease (the servers' hold timer comes first).
  void ExpireLeases() {
    for (;;) {
      std::vector<std::pair<std::string, Lease>> expired;
      {
        MutexLock lock(&mutex_);
        if (!stopping_) cv_.wait_for(mutex_, std::chrono::milliseconds(100));
        if (stopping_) return;
        const auto now = Clock::now();
        for (auto it = leases_.begin(); it != leases_.end();) {
          if (now < it->second.deadline) {
            ++it;
            continue;
          }
          expired.emplace_back(it->first, std::move(it->second));
          it = leases_.erase(it);
        }
      }
      for (auto& [id, lease] : expired)
        lease.on_release(id, DeadlineExceeded("request " + id + " was not released within the "
                                              "lease of " +
                                              std::to_string(lease_timeout_.count()) + " ms"));
    }
  }

  const uint64_t pool_bytes_;
  const PeerInfo info_;
  const std::chrono::milliseconds lease_timeout_;
  mutable Mutex mutex_;
  std::condition_variable_any cv_;
  std::map<std::string, Lease> leases_ TANDEM_GUARDED_BY(mutex_);
  bool stopping_ TANDEM_GUARDED_BY(mutex_) = false;
  std::thread expiry_;
};

// ---- puller ------------------------------------------------------------------------------------

// A publisher's pool mapped into this process; unmapped when the last reference goes (the
// puller's peer table drops it once it has been idle for kUnmapIdle, pulls hold their own).
constexpr auto kUnmapIdle = std::chrono::seconds(30);

struct MappedPeer {
  std::vector<void*> bases;  // one per publisher pool
  ~MappedPeer() {
    for (void* base : bases)
      if (base != nullptr) static_cast<void>(cudaIpcCloseMemHandle(base));
  }
};

// Contiguous copies shorter than this join the strided ones in CopyRowsBatch launches (a head's
// slice of one block when the table is fragmented: 2 KiB for SmolLM2 in bf16).
constexpr uint64_t kBatchedCopyBelow = 8192;

class CudaIpcPuller final : public KvPuller {
 public:
  // `pools`: this instance's, pool r on device r, of `shape`; `direct[r]`: device 0 may
  // access pool r in place (r = 0, or peer access enabled).
  CudaIpcPuller(std::vector<std::byte*> pools, std::vector<bool> direct, KvPoolShape shape,
                std::string boot_id, cudaStream_t stream, const CudaIpcOptions& options)
      : pools_(std::move(pools)),
        direct_(std::move(direct)),
        shape_(shape),
        boot_id_(std::move(boot_id)),
        stream_(stream),
        timeout_(options.timeout),
        layer_wait_(options.layer_wait_timeout),
        metrics_(options.metrics) {
    progress_ = std::thread([this] { Progress(); });
  }

  ~CudaIpcPuller() override {
    {
      MutexLock lock(&mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    progress_.join();  // returns once every queued copy completed
    static_cast<void>(cudaStreamSynchronize(stream_));  // and nothing was queued after that
    std::vector<std::shared_ptr<PullState>> left;
    {
      MutexLock lock(&mutex_);
      for (auto& [id, pull] : pulls_) left.push_back(pull);
      pulls_.clear();
    }
    for (auto& pull : left) {
      metrics_.Failed(Seconds(pull->busy), "cancelled");
      pull->callbacks.on_done(pull->request_id, Cancelled("puller shut down"));
    }
    for (cudaEvent_t e : free_events_) static_cast<void>(cudaEventDestroy(e));
    static_cast<void>(cudaStreamDestroy(stream_));
  }

  Status Connect(const PeerInfo& peer) override {
    if (peer.transport != kCudaIpcTransport)
      return InvalidArgument("peer transport is '" + peer.transport + "', not cuda_ipc");
    if (peer.worker_address != boot_id_)
      return InvalidArgument("cuda_ipc moves KV within one machine, and the publisher is on "
                             "another (boot id " + peer.worker_address + ", ours " + boot_id_ +
                             "): use transfer.backend ucx between machines");
    StatusOr<PoolKey> key = UnpackPoolKey(peer.packed_rkey, sizeof(cudaIpcMemHandle_t));
    if (!key.ok()) return key.status().WithContext("cuda_ipc: the publisher's key");
    if (key->shape.full != shape_.full)
      return InvalidArgument("cuda_ipc: the publisher serves another model's KV (" +
                             key->shape.full.ToString() + "; ours " + shape_.full.ToString() +
                             ")");
    // Mapped under the lock: two Connects to one publisher must not open its handles twice.
    MutexLock lock(&mutex_);
    if (stopping_) return FailedPrecondition("puller is stopping");
    if (peers_.count(peer.instance_id)) return Status();
    PeerEntry entry;
    entry.shape = key->shape;
    for (const std::string& h : key->handles) {
      cudaIpcMemHandle_t handle;
      std::memcpy(&handle, h.data(), sizeof handle);
      entry.handles.push_back(handle);
    }
    TANDEM_RETURN_IF_ERROR(Map(peer.instance_id, entry));
    peers_.emplace(peer.instance_id, std::move(entry));
    return Status();
  }

  Status Pull(const KvDescriptor& d, LayerRanges local, PullCallbacks callbacks,
              uint32_t layers_available) override {
    if (!callbacks.on_done) return InvalidArgument("Pull needs an on_done callback");
    std::shared_ptr<MappedPeer> peer;
    KvPoolShape remote_shape;
    {
      MutexLock lock(&mutex_);
      if (stopping_) return FailedPrecondition("puller is stopping");
      auto it = peers_.find(d.instance_id);
      if (it == peers_.end()) return NotFound("publisher not connected");
      if (pulls_.count(d.request_id))
        return FailedPrecondition("request " + d.request_id + " is already pulling");
      if (it->second.mapped == nullptr)  // unmapped while idle: map it again
        TANDEM_RETURN_IF_ERROR(Map(d.instance_id, it->second));
      it->second.last_used = Clock::now();
      peer = it->second.mapped;
      remote_shape = it->second.shape;
    }
    TANDEM_ASSIGN_OR_RETURN(std::vector<StridedCopy> pieces,
                            PlanStridedCopies(d.layers, remote_shape, local, shape_));
    uint64_t moved = 0;  // every pool's: d.total_bytes counts rank 0's
    for (const StridedCopy& c : pieces) moved += c.bytes();
    auto pull = std::make_shared<PullState>(std::move(pieces), static_cast<uint32_t>(d.layers.size()));
    pull->request_id = d.request_id;
    pull->total_bytes = moved;
    pull->peer = std::move(peer);
    pull->callbacks = std::move(callbacks);
    pull->copy_deadline = pull->layer_deadline = Clock::now() + layer_wait_;  // until a layer comes
    {
      MutexLock lock(&mutex_);
      if (!pulls_.emplace(d.request_id, pull).second)
        return FailedPrecondition("request " + d.request_id + " is already pulling");
      metrics_.Started();
      Raise(*pull, layers_available);
    }
    cv_.notify_all();
    return Status();
  }

  Status SetLayersAvailable(const std::string& request_id, uint32_t layers) override {
    {
      MutexLock lock(&mutex_);
      if (stopping_) return FailedPrecondition("puller is stopping");
      auto it = pulls_.find(request_id);
      if (it == pulls_.end()) return NotFound("request " + request_id + " is not pulling");
      Raise(*it->second, layers);
    }
    cv_.notify_all();
    return Status();
  }

  size_t inflight_count() const override {
    MutexLock lock(&mutex_);
    return pulls_.size();
  }

 private:
  struct PullState {
    PullState(std::vector<StridedCopy> pieces, uint32_t layers)
        : queue(std::move(pieces), layers) {}
    std::string request_id;
    uint64_t total_bytes = 0;
    std::shared_ptr<MappedPeer> peer;
    PullCallbacks callbacks;
    LayerQueue<StridedCopy> queue;      // layers whose copies are queued on the stream
    uint32_t landed = 0;          // layers whose copies completed (reported in order)
    uint32_t queued_batches = 0;  // event records of this pull not yet completed
    std::optional<Status> error;  // set: finish with it once queued_batches is 0
    Clock::time_point copy_deadline;
    Clock::time_point layer_deadline;  // meaningful while every queued layer has landed
    Clock::time_point busy_since;      // while queued_batches > 0
    Clock::duration busy{0};
  };
  struct QueuedLayer {
    std::shared_ptr<PullState> pull;
    uint32_t layer = 0;
    cudaEvent_t event = nullptr;
  };

  struct PeerEntry {
    KvPoolShape shape;                       // the publisher's pools
    std::vector<cudaIpcMemHandle_t> handles;  // one per pool
    std::shared_ptr<MappedPeer> mapped;  // null while unmapped
    Clock::time_point last_used = Clock::now();
  };

  static double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

  // Opens entry's handles into entry.mapped (on our device 0). mutex_ held.
  Status Map(uint64_t instance_id, PeerEntry& entry) TANDEM_REQUIRES(mutex_) {
    TANDEM_RETURN_IF_ERROR(cuda::SetDevice(0));
    auto mapped = std::make_shared<MappedPeer>();
    for (size_t r = 0; r < entry.handles.size(); ++r) {
      void* base = nullptr;
      const cudaError_t err =
          cudaIpcOpenMemHandle(&base, entry.handles[r], cudaIpcMemLazyEnablePeerAccess);
      if (err != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        return Unavailable("cuda_ipc: cannot map publisher " + std::to_string(instance_id) +
                           "'s KV pool " + std::to_string(r) +
                           " (is it alive, on this machine, its GPU a peer of ours?): " +
                           CudaErrorText(err));
      }
      mapped->bases.push_back(base);  // closed by ~MappedPeer, also when a later one fails
    }
    entry.mapped = std::move(mapped);
    entry.last_used = Clock::now();
    return Status();
  }

  // Unmaps the pools of publishers no pull has used for kUnmapIdle (a restarted or dead
  // prefill's pool would otherwise stay allocated on its GPU). mutex_ held.
  void UnmapIdle() TANDEM_REQUIRES(mutex_) {
    const auto now = Clock::now();
    for (auto& [id, entry] : peers_)
      if (entry.mapped != nullptr && entry.mapped.use_count() == 1 &&
          now - entry.last_used > kUnmapIdle)
        entry.mapped.reset();
  }

  // Queues the copies of the layers below `available` not queued yet, each followed by an
  // event. mutex_ held.
  void Raise(PullState& pull, uint32_t available) TANDEM_REQUIRES(mutex_) {
    if (pull.error || std::min(available, pull.queue.num_layers()) <= pull.queue.released_layers())
      return;  // nothing new: the deadlines run on
    const auto now = Clock::now();
    pull.copy_deadline = now + timeout_;
    pull.layer_deadline = now + layer_wait_;
    const std::vector<LayerBatch> batches = pull.queue.Release(available);
    if (batches.empty()) return;
    Status status = cuda::SetDevice(0);
    for (const LayerBatch& batch : batches) {
      // A run at equal degrees is one contiguous range: one cudaMemcpyAsync (the copy engine;
      // between GPUs through unified addressing and peer access). A re-sharded head's slices
      // of a run of blocks are a strided copy, and a short contiguous one (a head's slice of a
      // lone block) costs a memcpy call's host time for little: those of the layer go as a few
      // launches of one thread block per copy (cuda::CopyRowsBatch), reading the peer's pool
      // in place; into a pool device 0 cannot write in place (no peer access), one
      // cudaMemcpy2DAsync or cudaMemcpyAsync each, which CUDA stages through host memory.
      std::vector<RowCopy> strided;
      for (size_t i = batch.first; i < batch.last && status.ok(); ++i) {
        const StridedCopy& c = pull.queue.pieces()[i];
        std::byte* to = pools_[c.local_pool] + c.local_offset;
        const std::byte* from =
            static_cast<const std::byte*>(pull.peer->bases[c.remote_pool]) + c.remote_offset;
        cudaError_t err = cudaSuccess;
        if ((c.rows > 1 || c.length < kBatchedCopyBelow) && direct_[c.local_pool])
          strided.push_back({from, to, c.remote_stride, c.local_stride, c.length, c.rows});
        else if (c.rows > 1)
          err = cudaMemcpy2DAsync(to, c.local_stride, from, c.remote_stride, c.length, c.rows,
                                  cudaMemcpyDefault, stream_);
        else
          err = cudaMemcpyAsync(to, from, c.length, cudaMemcpyDefault, stream_);
        if (err != cudaSuccess) status = Internal("cuda_ipc copy: " + CudaErrorText(err));
      }
      if (status.ok() && !strided.empty())
        status = cuda::CopyRowsBatch(strided.data(), strided.size(), stream_)
                     .WithContext("cuda_ipc strided copies");
      cudaEvent_t event = nullptr;
      if (status.ok()) {
        if (!free_events_.empty()) {
          event = free_events_.back();
          free_events_.pop_back();
        } else if (cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
                   err != cudaSuccess) {
          status = Internal("cuda_ipc event: " + CudaErrorText(err));
        }
      }
      if (status.ok()) {
        if (cudaError_t err = cudaEventRecord(event, stream_); err != cudaSuccess)
          status = Internal("cuda_ipc event: " + CudaErrorText(err));
      }
      if (!status.ok()) {
        if (event != nullptr) free_events_.push_back(event);
        // Copies of this batch queued before the failure have no event: wait for them, so that
        // nothing writes the local ranges once on_done runs.
        static_cast<void>(cudaStreamSynchronize(stream_));
        pull.error = status;
        return;
      }
      if (pull.queued_batches++ == 0) pull.busy_since = now;
      queued_.push_back({pulls_.at(pull.request_id), batch.layer, event});
    }
  }

  // The progress thread: completes queued layers in stream order, enforces the deadlines, and
  // runs every callback (outside the lock).
  void Progress() {
    static_cast<void>(cuda::SetDevice(0));
    for (;;) {
      std::vector<std::function<void()>> actions;
      bool idle = false;
      {
        MutexLock lock(&mutex_);
        if (stopping_ && queued_.empty()) return;
        CompleteLanded(actions);
        EnforceDeadlines(actions);
        UnmapIdle();
        idle = queued_.empty();
        if (idle && !stopping_) cv_.wait_for(mutex_, std::chrono::milliseconds(10));
      }
      for (auto& action : actions) action();
      // Copies in flight: poll often (a layer of a small model lands in microseconds).
      if (!idle) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void CompleteLanded(std::vector<std::function<void()>>& actions) TANDEM_REQUIRES(mutex_) {
    while (!queued_.empty()) {
      QueuedLayer& front = queued_.front();
      const cudaError_t q = cudaEventQuery(front.event);
      if (q == cudaErrorNotReady) return;
      std::shared_ptr<PullState> pull = std::move(front.pull);
      const uint32_t layer = front.layer;
      free_events_.push_back(front.event);
      queued_.pop_front();
      const auto now = Clock::now();
      if (--pull->queued_batches == 0) {
        pull->busy += now - pull->busy_since;
        pull->layer_deadline = now + layer_wait_;  // every queued layer is in: wait for more
      }
      if (q != cudaSuccess && !pull->error) pull->error = Internal("cuda_ipc copy failed: " + CudaErrorText(q));
      if (pull->error) {
        if (pull->queued_batches == 0) Finish(pull, *pull->error, actions);
        continue;
      }
      pull->landed = layer + 1;
      if (pull->callbacks.on_layer)
        actions.push_back([cb = pull->callbacks.on_layer, layer] { cb(layer); });
      if (pull->landed == pull->queue.num_layers()) Finish(pull, Status(), actions);
    }
  }

  void EnforceDeadlines(std::vector<std::function<void()>>& actions) TANDEM_REQUIRES(mutex_) {
    const auto now = Clock::now();
    std::vector<std::shared_ptr<PullState>> done;
    for (auto& [id, pull] : pulls_) {
      if (pull->queued_batches > 0) {
        if (!pull->error && now >= pull->copy_deadline)
          pull->error = DeadlineExceeded("pull of " + id + ": the available layers did not land "
                                         "within " + std::to_string(timeout_.count()) + " ms");
        continue;  // finishes when its queued copies drained
      }
      if (pull->error) {
        done.push_back(pull);
      } else if (pull->queue.num_layers() == 0) {
        done.push_back(pull);  // nothing to move
      } else if (now >= pull->layer_deadline) {
        pull->error = DeadlineExceeded("pull of " + id + ": no layer announced within " +
                                       std::to_string(layer_wait_.count()) + " ms");
        done.push_back(pull);
      }
    }
    for (auto& pull : done) Finish(pull, pull->error.value_or(Status()), actions);
  }

  // Ends a pull (mutex_ held; its queued copies drained): metrics, then on_done (as an action).
  void Finish(const std::shared_ptr<PullState>& pull, const Status& status,
              std::vector<std::function<void()>>& actions) TANDEM_REQUIRES(mutex_) {
    if (pulls_.erase(pull->request_id) == 0) return;
    if (status.ok()) {
      metrics_.Succeeded(Seconds(pull->busy), pull->total_bytes);
    } else {
      metrics_.Failed(Seconds(pull->busy), TransferMetrics::ReasonFor(status));
    }
    actions.push_back([pull, status] { pull->callbacks.on_done(pull->request_id, status); });
  }

  const std::vector<std::byte*> pools_;  // ours, pool r on device r
  const std::vector<bool> direct_;        // [r]: device 0 writes pool r in place
  const KvPoolShape shape_;
  const std::string boot_id_;
  cudaStream_t stream_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds layer_wait_;
  TransferMetrics metrics_;
  mutable Mutex mutex_;
  std::condition_variable_any cv_;
  std::map<uint64_t, PeerEntry> peers_ TANDEM_GUARDED_BY(mutex_);
  std::map<std::string, std::shared_ptr<PullState>> pulls_ TANDEM_GUARDED_BY(mutex_);
  std::deque<QueuedLayer> queued_ TANDEM_GUARDED_BY(mutex_);  // in stream order
  std::vector<cudaEvent_t> free_events_ TANDEM_GUARDED_BY(mutex_);
  bool stopping_ TANDEM_GUARDED_BY(mutex_) = false;
  std::thread progress_;
};

// Pool r of `shape` on device r of the process.
StatusOr<std::vector<KvPoolMemory>> AllocatePools(const KvPoolShape& shape) {
  TANDEM_RETURN_IF_ERROR(shape.Validate());
  TANDEM_ASSIGN_OR_RETURN(int visible, cuda::DeviceCount());
  if (shape.degree > visible)
    return InvalidArgument("cuda_ipc: tensor_parallel " + std::to_string(shape.degree) +
                           " needs that many GPUs; " + std::to_string(visible) + " visible");
  std::vector<KvPoolMemory> pools;
  for (int r = 0; r < shape.degree; ++r) {
    TANDEM_ASSIGN_OR_RETURN(KvPoolMemory pool, cuda::AllocateCudaKvPool(shape.pool_bytes(), r));
    pools.push_back(std::move(pool));
  }
  return pools;
}

}  // namespace

StatusOr<PublisherWithPool> CreateCudaIpcPublisherWithPool(const KvPoolShape& shape,
                                                           const CudaIpcOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(std::string boot_id, MachineBootId());
  PublisherWithPool out;
  TANDEM_ASSIGN_OR_RETURN(out.pools, AllocatePools(shape));
  std::vector<cudaIpcMemHandle_t> handles(out.pools.size());
  for (size_t r = 0; r < out.pools.size(); ++r) {
    TANDEM_RETURN_IF_ERROR(cuda::SetDevice(static_cast<int>(r)));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handles[r], out.pools[r].base));
  }
  PeerInfo info;
  info.instance_id = NewInstanceId();
  info.transport = std::string(kCudaIpcTransport);
  info.worker_address = boot_id;
  PoolKey key{shape, {}};
  for (const cudaIpcMemHandle_t& h : handles)
    key.handles.emplace_back(reinterpret_cast<const char*>(&h), sizeof h);
  info.packed_rkey = PackPoolKey(key);
  info.region_base = reinterpret_cast<uint64_t>(out.pools[0].base);
  info.region_bytes = out.pools[0].bytes;
  out.publisher = std::make_unique<CudaIpcPublisher>(shape.pool_bytes(), std::move(info),
                                                     options.lease_timeout);
  return out;
}

StatusOr<PullerWithPool> CreateCudaIpcPullerWithPool(const KvPoolShape& shape,
                                                     const CudaIpcOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(std::string boot_id, MachineBootId());
  PullerWithPool out;
  TANDEM_ASSIGN_OR_RETURN(out.pools, AllocatePools(shape));
  std::vector<std::byte*> bases;
  for (const KvPoolMemory& pool : out.pools) bases.push_back(pool.base);
  TANDEM_RETURN_IF_ERROR(cuda::SetDevice(0));
  // The copies run on device 0's stream into every pool: direct where device 0 may access
  // pool r's GPU (NVLink, PCIe P2P), else CUDA stages them through host memory (slower).
  std::vector<bool> direct(shape.degree, true);
  for (int r = 1; r < shape.degree; ++r) {
    int can = 0;
    direct[r] = cudaDeviceCanAccessPeer(&can, 0, r) == cudaSuccess && can;
    if (direct[r]) {
      const cudaError_t err = cudaDeviceEnablePeerAccess(r, 0);
      if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled)
        return Internal("cuda_ipc: enabling peer access from GPU 0 to " + std::to_string(r) +
                        ": " + CudaErrorText(err));
      static_cast<void>(cudaGetLastError());  // clears AlreadyEnabled
    } else {
      TANDEM_LOG(kWarn) << "cuda_ipc: GPU 0 cannot access GPU " << r
                           << " directly; KV copies into its pool go through host memory";
    }
  }
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  out.puller = std::make_unique<CudaIpcPuller>(std::move(bases), std::move(direct), shape,
                                               std::move(boot_id), stream, options);
  return out;
}

}  // namespace tandem
