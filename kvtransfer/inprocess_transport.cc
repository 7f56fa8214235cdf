#include "kvtransfer/inprocess_transport.h"

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// What a publisher shares with pullers; outlives the publisher while a puller holds it.
struct PublisherCore {
  std::mutex mutex;  // held during a copy and by the publisher's destructor
  bool alive = true;
  MemoryRegion region;
  PeerInfo info;
  std::map<std::string, ReleaseCallback> leases;
};

std::mutex& TableMutex() {
  static std::mutex m;
  return m;
}
std::map<uint64_t, std::weak_ptr<PublisherCore>>& Table() {
  static std::map<uint64_t, std::weak_ptr<PublisherCore>> table;
  return table;
}

Status ReleaseLease(PublisherCore& core, const TransferResult& result) {
  ReleaseCallback cb;
  {
    std::lock_guard<std::mutex> lock(core.mutex);
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
    std::random_device rd;
    core_->region = region;
    core_->info.transport = "inprocess";
    core_->info.region_base = reinterpret_cast<uint64_t>(region.base);
    core_->info.region_bytes = region.bytes;
    std::lock_guard<std::mutex> lock(TableMutex());
    do {
      core_->info.instance_id = (static_cast<uint64_t>(rd()) << 32) | rd();
    } while (core_->info.instance_id == 0 || Table().count(core_->info.instance_id));
    Table()[core_->info.instance_id] = core_;
  }

  ~InProcessPublisher() override {
    {
      std::lock_guard<std::mutex> lock(TableMutex());
      Table().erase(core_->info.instance_id);
    }
    std::map<std::string, ReleaseCallback> leases;
    {
      std::lock_guard<std::mutex> lock(core_->mutex);
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
    std::lock_guard<std::mutex> lock(core_->mutex);
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
    std::lock_guard<std::mutex> lock(core_->mutex);
    return core_->leases.size();
  }

 private:
  std::shared_ptr<PublisherCore> core_;
};

class InProcessPuller final : public KvPuller {
 public:
  InProcessPuller(MemoryRegion region, MetricsRegistry* metrics)
      : region_(region), metrics_(metrics) {}

  Status Connect(const PeerInfo& info) override {
    if (info.transport != "inprocess") {
      return InvalidArgument("peer transport is '" + info.transport + "', not inprocess");
    }
    std::lock_guard<std::mutex> table_lock(TableMutex());
    auto it = Table().find(info.instance_id);
    if (it == Table().end()) return Unavailable("no in-process publisher " +
                                                std::to_string(info.instance_id));
    std::lock_guard<std::mutex> lock(mutex_);
    peers_[info.instance_id] = it->second;
    return Status();
  }

  Status Pull(const KvDescriptor& d, LayerRanges local, PullCallbacks callbacks) override {
    if (!callbacks.on_done) return InvalidArgument("Pull needs an on_done callback");
    std::shared_ptr<PublisherCore> core;
    {
      std::lock_guard<std::mutex> lock(mutex_);
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
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!active_.insert(d.request_id).second) {
        return FailedPrecondition("request " + d.request_id + " is already pulling");
      }
    }
    metrics_.Started();
    auto start = Clock::now();
    Status status;
    std::vector<uint32_t> layers_done;
    {
      std::lock_guard<std::mutex> lock(core->mutex);
      if (!core->alive) {
        status = Unavailable("publisher shut down");
      } else {
        for (const CopyPiece& p : pieces) {
          std::memcpy(static_cast<char*>(region_.base) + p.local_offset,
                      static_cast<const char*>(core->region.base) + p.remote_offset, p.length);
        }
      }
    }
    if (status.ok() && callbacks.on_layer) {
      for (uint32_t l = 0; l < d.layers.size(); ++l) callbacks.on_layer(l);
    }
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (status.ok()) {
      metrics_.Succeeded(seconds, d.total_bytes);
    } else {
      metrics_.Failed(seconds, TransferMetrics::ReasonFor(status));
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      active_.erase(d.request_id);
    }
    if (status.ok()) {
      TransferResult result{d.instance_id, d.request_id, StatusCode::kOk, "", d.total_bytes};
      Status s = ReleaseLease(*core, result);
      static_cast<void>(s);  // NotFound: the publisher already released it (shut down)
    }
    callbacks.on_done(d.request_id, status);
    return Status();
  }

  size_t inflight_count() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return active_.size();
  }

 private:
  MemoryRegion region_;
  TransferMetrics metrics_;
  mutable std::mutex mutex_;
  std::map<uint64_t, std::weak_ptr<PublisherCore>> peers_;
  std::set<std::string> active_;
};

}  // namespace

StatusOr<std::unique_ptr<KvPublisher>> CreateInProcessPublisher(MemoryRegion region) {
  if (region.base == nullptr || region.bytes == 0) return InvalidArgument("empty region");
  return std::unique_ptr<KvPublisher>(new InProcessPublisher(region));
}

StatusOr<std::unique_ptr<KvPuller>> CreateInProcessPuller(MemoryRegion region,
                                                          MetricsRegistry* metrics) {
  if (region.base == nullptr || region.bytes == 0) return InvalidArgument("empty region");
  return std::unique_ptr<KvPuller>(new InProcessPuller(region, metrics));
}

}  // namespace tandem
