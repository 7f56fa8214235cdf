#include "kvtransfer/inprocess_transport.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "common/base/thread_annotations.h"
#include "kvtransfer/layer_copies.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// What a publisher shares with pullers; outlives the publisher while a puller holds it.
struct PublisherCore {
  Mutex mutex;  // held during a copy and by the publisher's destructor
  bool alive TANDEM_GUARDED_BY(mutex) = true;
  MemoryRegion region;
  PeerInfo info;
  std::map<std::string, ReleaseCallback> leases TANDEM_GUARDED_BY(mutex);
};

Mutex& TableMutex() {
  static Mutex m;
  return m;
}
std::map<uint64_t, std::weak_ptr<PublisherCore>>& Table() {
  static std::map<uint64_t, std::weak_ptr<PublisherCore>> table;
  return table;
}

Status ReleaseLease(PublisherCore& core, const TransferResult& result) {
  ReleaseCallback cb;
  {
    MutexLock lock(&core.mutex);
    auto it = core.leases.find(result.request_id);
    if (it == core.leases.end()) return NotFound("request " + result.request_id + " not published");
    cb = std::move(it->second);
    core.leases.erase(it);
  }
  cb(result.request_id, result.ToStatus());
  return Status();
}

class InProcessPublisher final : public KvPublisher {
 public:
  explicit InProcessPublisher(MemoryRegion region) : core_(std::make_shared<PublisherCore>()) {
    core_->region = region;
    core_->info.transport = "inprocess";
    core_->info.region_base = reinterpret_cast<uint64_t>(region.base);
    core_->info.region_bytes = region.bytes;
    MutexLock lock(&TableMutex());
    do {
      core_->info.instance_id = NewInstanceId();
    } while (Table().count(core_->info.instance_id));
    Table()[core_->info.instance_id] = core_;
  }

  ~InProcessPublisher() override {
    {
      MutexLock lock(&TableMutex());
      Table().erase(core_->info.instance_id);
    }
    std::map<std::string, ReleaseCallback> leases;
    {
      MutexLock lock(&core_->mutex);
      core_->alive = false;
      leases.swap(core_->leases);
    }
    for (auto& [id, cb] : leases) cb(id, Cancelled("publisher shut down"));
  }

  const PeerInfo& peer_info() const override { return core_->info; }

  StatusOr<KvDescriptor> Publish(const std::string& request_id, LayerRanges layers,
                                 ReleaseCallback on_release) override {
    TANDEM_RETURN_IF_ERROR(CheckRanges(layers, core_->region.bytes));
    TANDEM_ASSIGN_OR_RETURN(KvDescriptor d, MakeDescriptor(core_->info.instance_id, request_id,
                                                           std::move(layers)));
    MutexLock lock(&core_->mutex);
    if (!core_->leases.emplace(request_id, std::move(on_release)).second) {
      return InvalidArgument("request " + request_id + " is already published");
    }
    return d;
  }

  Status Release(const TransferResult& result) override {
    if (result.instance_id != core_->info.instance_id) {
      return InvalidArgument("result for another publisher instance");
    }
    return ReleaseLease(*core_, result);
  }

  size_t published_count() const override {
    MutexLock lock(&core_->mutex);
    return core_->leases.size();
  }

 private:
  std::shared_ptr<PublisherCore> core_;
};

class InProcessPuller final : public KvPuller {
 public:
  InProcessPuller(MemoryRegion region, MetricsRegistry* metrics, std::chrono::milliseconds timeout)
      : region_(region), metrics_(metrics), timeout_(timeout) {
    watchdog_ = std::thread([this] { Watch(); });
  }

  ~InProcessPuller() override {
    {
      MutexLock lock(&mutex_);
      stopping_ = true;
    }
    watchdog_cv_.notify_all();
    watchdog_.join();
    std::vector<std::shared_ptr<Pending>> left;
    {
      MutexLock lock(&mutex_);
      for (auto& [id, p] : pending_) left.push_back(p);
    }
    for (auto& p : left) {
      MutexLock lock(&p->mutex);
      Finish(*p, Cancelled("puller shut down"));
    }
  }

  Status Connect(const PeerInfo& info) override {
    if (info.transport != "inprocess") {
      return InvalidArgument("peer transport is '" + info.transport + "', not inprocess");
    }
    MutexLock table_lock(&TableMutex());
    auto it = Table().find(info.instance_id);
    if (it == Table().end()) return Unavailable("no in-process publisher " +
                                                std::to_string(info.instance_id));
    MutexLock lock(&mutex_);
    peers_[info.instance_id] = it->second;
    return Status();
  }

  Status Pull(const KvDescriptor& d, LayerRanges local, PullCallbacks callbacks,
              uint32_t layers_available) override {
    if (!callbacks.on_done) return InvalidArgument("Pull needs an on_done callback");
    std::shared_ptr<PublisherCore> core;
    {
      MutexLock lock(&mutex_);
      if (stopping_) return FailedPrecondition("puller is stopping");
      auto it = peers_.find(d.instance_id);
      if (it == peers_.end()) return NotFound("publisher not connected");
      core = it->second.lock();
      if (active_.count(d.request_id)) {
        return FailedPrecondition("request " + d.request_id + " is already pulling");
      }
      if (!core) {
        peers_.erase(it);
        return NotFound("publisher is gone");
      }
    }
    TANDEM_ASSIGN_OR_RETURN(auto pieces, PlanCopies(d.layers, core->info.region_bytes, local,
                                                    region_.bytes));
    auto pull = std::make_shared<Pending>();
    pull->request_id = d.request_id;
    pull->instance_id = d.instance_id;
    pull->total_bytes = d.total_bytes;
    pull->core = std::move(core);
    pull->callbacks = std::move(callbacks);
    {
      MutexLock lock(&pull->mutex);  // the watchdog reads it once the pull is pending
      pull->queue.emplace(std::move(pieces), static_cast<uint32_t>(d.layers.size()));
      pull->deadline = Clock::now() + timeout_;
    }
    {
      MutexLock lock(&mutex_);
      if (!active_.insert(d.request_id).second) {
        return FailedPrecondition("request " + d.request_id + " is already pulling");
      }
      pending_[d.request_id] = pull;
    }
    metrics_.Started();
    MutexLock lock(&pull->mutex);
    Advance(*pull, layers_available);
    return Status();
  }

  Status SetLayersAvailable(const std::string& request_id, uint32_t layers) override {
    std::shared_ptr<Pending> pull;
    {
      MutexLock lock(&mutex_);
      auto it = pending_.find(request_id);
      if (it == pending_.end()) return NotFound("request " + request_id + " is not pulling");
      pull = it->second;
    }
    MutexLock lock(&pull->mutex);
    if (pull->finished || layers <= pull->queue->released_layers()) return Status();
    pull->deadline = Clock::now() + timeout_;
    Advance(*pull, layers);
    return Status();
  }

  size_t inflight_count() const override {
    MutexLock lock(&mutex_);
    return active_.size();
  }

 private:
  // One pull; its mutex serializes the copies and callbacks of SetLayersAvailable callers and
  // the watchdog.
  struct Pending {
    Mutex mutex;
    std::string request_id;
    uint64_t instance_id = 0;
    uint64_t total_bytes = 0;
    std::shared_ptr<PublisherCore> core;
    // The pieces and the layers released (copied and reported) so far; set before the pull is
    // pending.
    std::optional<LayerCopyQueue> queue TANDEM_GUARDED_BY(mutex);
    PullCallbacks callbacks;
    Clock::time_point deadline TANDEM_GUARDED_BY(mutex);
    // Time spent copying: tandem_kv_transfer_seconds.
    Clock::duration busy TANDEM_GUARDED_BY(mutex){0};
    bool finished TANDEM_GUARDED_BY(mutex) = false;
  };

  // Copies the pieces of the layers below `available` not copied yet, reports those layers,
  // finishes the pull when every layer is in. pull.mutex held.
  void Advance(Pending& pull, uint32_t available) TANDEM_REQUIRES(pull.mutex) {
    const auto start = Clock::now();
    Status status;
    std::vector<LayerBatch> landed;
    {
      MutexLock lock(&pull.core->mutex);
      if (!pull.core->alive) {
        status = Unavailable("publisher shut down");
      } else {
        landed = pull.queue->Release(available);
        const std::vector<CopyPiece>& pieces = pull.queue->pieces();
        for (const LayerBatch& batch : landed)
          for (size_t i = batch.first; i < batch.last; ++i)
            std::memcpy(static_cast<char*>(region_.base) + pieces[i].local_offset,
                        static_cast<const char*>(pull.core->region.base) + pieces[i].remote_offset,
                        pieces[i].length);
      }
    }
    pull.busy += Clock::now() - start;
    if (!status.ok()) return Finish(pull, status);
    for (const LayerBatch& batch : landed)
      if (pull.callbacks.on_layer) pull.callbacks.on_layer(batch.layer);
    if (pull.queue->all_released()) Finish(pull, Status());
  }

  // Ends a pull once (pull.mutex held): metrics, the publisher's lease, on_done.
  void Finish(Pending& pull, const Status& status) TANDEM_REQUIRES(pull.mutex) {
    if (pull.finished) return;
    pull.finished = true;
    const double seconds = std::chrono::duration<double>(pull.busy).count();
    if (status.ok()) {
      metrics_.Succeeded(seconds, pull.total_bytes);
    } else {
      metrics_.Failed(seconds, TransferMetrics::ReasonFor(status));
    }
    {
      MutexLock lock(&mutex_);
      active_.erase(pull.request_id);
      pending_.erase(pull.request_id);
    }
    // The publisher learns the outcome as it would from UCX's result message (a publisher
    // that shut down has released everything already).
    if (status.code() != StatusCode::kUnavailable) {
      TransferResult result{pull.instance_id, pull.request_id, status.code(), status.message(),
                            status.ok() ? pull.total_bytes : 0};
      Status s = ReleaseLease(*pull.core, result);
      static_cast<void>(s);  // NotFound: the publisher already released it
    }
    pull.callbacks.on_done(pull.request_id, status);
  }

  // Fails pulls whose next layer was not announced within the timeout.
  void Watch() {
    for (;;) {
      std::vector<std::shared_ptr<Pending>> candidates;
      {
        MutexLock lock(&mutex_);
        if (!stopping_) watchdog_cv_.wait_for(mutex_, std::chrono::milliseconds(10));
        if (stopping_) return;
        for (auto& [id, p] : pending_) candidates.push_back(p);
      }
      const auto now = Clock::now();
      for (auto& p : candidates) {
        MutexLock pull_lock(&p->mutex);
        if (!p->finished && now >= p->deadline) {
          Finish(*p, DeadlineExceeded("pull of " + p->request_id + ": no layer announced within " +
                                      std::to_string(timeout_.count()) + " ms"));
        }
      }
    }
  }

  MemoryRegion region_;
  TransferMetrics metrics_;
  std::chrono::milliseconds timeout_;
  mutable Mutex mutex_;
  std::map<uint64_t, std::weak_ptr<PublisherCore>> peers_ TANDEM_GUARDED_BY(mutex_);
  std::set<std::string> active_ TANDEM_GUARDED_BY(mutex_);
  std::map<std::string, std::shared_ptr<Pending>> pending_ TANDEM_GUARDED_BY(mutex_);
  bool stopping_ TANDEM_GUARDED_BY(mutex_) = false;
  std::condition_variable_any watchdog_cv_;
  std::thread watchdog_;
};

}  // namespace

StatusOr<std::unique_ptr<KvPublisher>> CreateInProcessPublisher(MemoryRegion region) {
  if (region.base == nullptr || region.bytes == 0) return InvalidArgument("empty region");
  return std::unique_ptr<KvPublisher>(new InProcessPublisher(region));
}

StatusOr<std::unique_ptr<KvPuller>> CreateInProcessPuller(MemoryRegion region,
                                                          MetricsRegistry* metrics,
                                                          std::chrono::milliseconds timeout) {
  if (region.base == nullptr || region.bytes == 0) return InvalidArgument("empty region");
  return std::unique_ptr<KvPuller>(new InProcessPuller(region, metrics, timeout));
}

}  // namespace tandem
