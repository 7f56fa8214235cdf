#include "prefill/kv_handoff.h"

#include "common/base/log.h"
#include "kvtransfer/block_ranges.h"
#include "kvtransfer/wire.h"

namespace tandem {

const char* HandoffStateName(HandoffState state) {
  static constexpr const char* kNames[] = {"queued", "prefilling", "published", "released",
                                           "failed"};
  return kNames[static_cast<int>(state)];
}

bool HandoffTransitionAllowed(HandoffState from, HandoffState to) {
  using S = HandoffState;
  switch (from) {
    case S::kQueued: return to == S::kPrefilling || to == S::kPublished || to == S::kReleased ||
                            to == S::kFailed;
    case S::kPrefilling: return to == S::kPublished || to == S::kFailed;
    case S::kPublished: return to == S::kReleased || to == S::kFailed;
    case S::kReleased:
    case S::kFailed: return false;
  }
  return false;
}

KvHandoff::KvHandoff(InstanceHost& host, PrefillEngine& engine, KvPublisher& publisher,
                     KvHandoffOptions options, Counter* failures)
    : host_(host),
      engine_(engine),
      publisher_(publisher),
      options_(options),
      failures_(failures),
      peer_info_blob_(Encode(publisher.peer_info())) {
  MutexLock lock(&relay_->mutex);
  relay_->host = &host;
  relay_->handoff = this;
}

KvHandoff::~KvHandoff() {
  MutexLock lock(&relay_->mutex);
  relay_->host = nullptr;
}

void KvHandoff::Transition(const std::string& id, Entry& entry, HandoffState to,
                           const Status& why) {
  TANDEM_CHECK(HandoffTransitionAllowed(entry.state, to),
               "KV handoff of " + id + ": " + HandoffStateName(entry.state) + " -> " +
                   HandoffStateName(to));
  const bool held = entry.state == HandoffState::kPrefilling ||
                    entry.state == HandoffState::kPublished;
  entry.state = to;
  if (to != HandoffState::kReleased && to != HandoffState::kFailed) return;
  if (held) {
    TransferResult result;  // drops the transport's publication (NotFound: it is gone already)
    result.instance_id = publisher_.peer_info().instance_id;
    result.request_id = id;
    result.code = why.code();
    result.message = why.message();
    static_cast<void>(publisher_.Release(result));
    // Its release callback is still to come (and will be posted here after this returns, the
    // engine thread being this one): keep the blocks until then.
    if (publisher_.StillReading(id)) {
      draining_[id] = Draining{std::move(entry.blocks), HoldDeadline()};
    } else {
      engine_.FreeBlocks(entry.blocks);
    }
  }
  if (!why.ok()) {
    TANDEM_LOG_REQ(kInfo, id) << "handoff " << HandoffStateName(to) << ": " << why.ToString();
  }
  requests_.erase(id);  // `entry` dies here
}

void KvHandoff::Queue(const Submit& submit, ConnId router) {
  Entry entry;
  entry.router = router;
  entry.decode_session = submit.decode_session;
  entry.decode_address = submit.decode_address;
  requests_[submit.request_id] = std::move(entry);
}

KvHandoff::Clock::time_point KvHandoff::HoldDeadline() const {
  return Clock::now() +
         std::chrono::milliseconds(static_cast<int64_t>(options_.hold_timeout_s * 1000));
}

StatusOr<KvReady> KvHandoff::Publish(const std::string& id, Entry& entry,
                                     const std::vector<int32_t>& blocks) {
  StatusOr<ConnId> conn = host_.Dial(entry.decode_address);
  if (!conn.ok())
    return Unavailable("decode instance " + entry.decode_address +
                       " unreachable: " + conn.status().message());
  LayerRanges ranges = KvBlockRanges(engine_.cache(), blocks);
  // Outcomes come back as KvReleased over the control plane. The transport's callback matters
  // only for a release it completes later (StillReading): it frees the blocks kept draining.
  auto on_release = [relay = relay_](const std::string& request_id, const Status&) {
    MutexLock lock(&relay->mutex);
    if (relay->host == nullptr) return;
    relay->host->Post([handoff = relay->handoff, request_id] {
      handoff->TransportReleased(request_id);
    });
  };
  TANDEM_ASSIGN_OR_RETURN(KvDescriptor desc,
                          publisher_.Publish(id, std::move(ranges), std::move(on_release)));
  entry.decode = *conn;
  entry.blocks = blocks;
  entry.deadline = HoldDeadline();
  KvReady ready;
  ready.request_id = id;
  ready.kv_descriptor = Encode(desc);
  ready.kv_peer_info = peer_info_blob_;
  ready.router_session = entry.decode_session;
  return ready;
}

bool KvHandoff::Announce(const PrefillRequest& r) {
  if (!options_.layerwise) return false;
  auto it = requests_.find(r.id);
  TANDEM_CHECK(it != requests_.end(), "announcing an unknown request " + r.id);
  Entry& entry = it->second;
  StatusOr<KvReady> ready = Publish(r.id, entry, r.blocks);
  if (!ready.ok()) {
    entry.announce_error = ready.status();
    return false;
  }
  ready->prompt = r.prompt;
  ready->layers_ready = 0;
  ready->sampling = r.sampling;
  if (!host_.Send(entry.decode, *ready)) {
    entry.blocks.clear();  // the engine still owns them; they are freed after the pass
    TransferResult result;
    result.instance_id = publisher_.peer_info().instance_id;
    result.request_id = r.id;
    static_cast<void>(publisher_.Release(result));
    entry.announce_error = Unavailable("decode connection closed");
    return false;
  }
  Transition(r.id, entry, HandoffState::kPrefilling, Status());
  announced_.push_back(r.id);
  return true;
}

void KvHandoff::LayersComputed(int32_t layers_ready) {
  for (const std::string& id : announced_) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    KvProgress progress;
    progress.request_id = id;
    progress.layers_ready = layers_ready;
    host_.Send(it->second.decode, progress);  // a closed connection is handled after the pass
  }
}

void KvHandoff::SendFinish(ConnId router, const std::string& id, const Status& status,
                           const std::string& reason, int32_t completion_tokens) {
  if (!status.ok()) {
    TANDEM_LOG_REQ(kInfo, id) << "finished with " << status.ToString();
  }
  Finish f;
  f.request_id = id;
  f.finish_reason = reason;
  f.code = status.code();
  f.message = status.message();
  f.completion_tokens = completion_tokens;
  host_.Send(router, f);
}

void KvHandoff::FirstTokenSampled(Prefilled done) {
  announced_.clear();
  const std::string id = done.request.id;
  auto it = requests_.find(id);
  if (it == requests_.end()) {  // dropped during the pass cannot happen: events wait for it
    engine_.FreeBlocks(done.request.blocks);
    return;
  }
  Entry& entry = it->second;
  if (!entry.announce_error.ok()) {  // as a failed handoff, before the first token went out
    if (failures_ != nullptr) failures_->Inc();
    engine_.FreeBlocks(done.request.blocks);
    const Status error = entry.announce_error;
    const ConnId router = entry.router;
    Transition(id, entry, HandoffState::kFailed, error);
    return SendFinish(router, id, error, "", 0);
  }
  Tokens out;
  out.request_id = id;
  out.tokens.push_back(done.first);
  host_.Send(entry.router, out);
  const bool finished = done.finish != FinishReason::kNone;
  const std::string reason = finished ? std::string(FinishReasonName(done.finish)) : "";
  if (entry.state == HandoffState::kPrefilling) {
    // The engine's blocks are the held ones. The hold runs from now: a long pass must not eat it.
    if (finished) SendFinish(entry.router, id, Status(), reason, 1);
    entry.deadline = HoldDeadline();
    Transition(id, entry, HandoffState::kPublished, Status());
    KvProgress progress;
    progress.request_id = id;
    progress.layers_ready = kAllLayersReady;
    progress.first_token = done.first;
    progress.finished = finished;
    if (!host_.Send(entry.decode, progress))
      Transition(id, entry, HandoffState::kFailed, Unavailable("decode connection closed"));
    return;
  }
  if (finished) {
    engine_.FreeBlocks(done.request.blocks);
    const ConnId router = entry.router;
    Transition(id, entry, HandoffState::kReleased, Status());
    return SendFinish(router, id, Status(), reason, 1);
  }
  HandOff(done, entry);
}

void KvHandoff::HandOff(Prefilled& done, Entry& entry) {
  const std::string id = done.request.id;
  StatusOr<KvReady> ready = Publish(id, entry, done.request.blocks);
  if (!ready.ok()) {
    if (failures_ != nullptr) failures_->Inc();
    engine_.FreeBlocks(done.request.blocks);
    const ConnId router = entry.router;
    const Status error = ready.status().WithContext("handing off the KV");
    Transition(id, entry, HandoffState::kFailed, error);
    return SendFinish(router, id, error, "", 1);
  }
  ready->prompt = std::move(done.request.prompt);
  ready->first_token = done.first;
  ready->sampling = done.request.sampling;
  Transition(id, entry, HandoffState::kPublished, Status());
  if (!host_.Send(entry.decode, *ready))  // decode's Finish is lost too
    Transition(id, entry, HandoffState::kFailed, Unavailable("decode connection closed"));
}

void KvHandoff::Released(const std::string& id, const Status& status) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.state != HandoffState::kPublished) return;
  Transition(id, it->second, status.ok() ? HandoffState::kReleased : HandoffState::kFailed,
             status);
}

void KvHandoff::Cancel(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Entry& entry = it->second;
  const Status cancelled = Cancelled("cancelled");
  if (entry.state == HandoffState::kQueued) {
    engine_.Cancel(id);
    const ConnId router = entry.router;
    Transition(id, entry, HandoffState::kFailed, cancelled);
    return SendFinish(router, id, cancelled, "", 0);
  }
  Transition(id, entry, HandoffState::kFailed, cancelled);  // decode owns the Finish
}

void KvHandoff::ConnectionClosed(ConnId conn) {
  std::vector<std::string> ids;
  for (auto& [id, entry] : requests_)
    if ((entry.state == HandoffState::kQueued && entry.router == conn) ||
        (entry.state == HandoffState::kPublished && entry.decode == conn))
      ids.push_back(id);
  for (const std::string& id : ids) {
    Entry& entry = requests_.at(id);
    if (entry.state == HandoffState::kQueued) {
      engine_.Cancel(id);  // the router gave the request up: nobody to tell
      Transition(id, entry, HandoffState::kFailed, Cancelled("router session closed"));
    } else {
      Transition(id, entry, HandoffState::kFailed, Unavailable("decode instance disconnected"));
    }
  }
}

void KvHandoff::TransportReleased(const std::string& id) {
  auto it = draining_.find(id);
  if (it == draining_.end()) return;  // freed at its release already
  engine_.FreeBlocks(it->second.blocks);
  draining_.erase(it);
}

void KvHandoff::ExpireHolds() {
  const auto now = Clock::now();
  for (auto it = draining_.begin(); it != draining_.end();) {
    if (now < it->second.deadline) {
      ++it;
      continue;
    }
    TANDEM_LOG_REQ(kWarn, it->first)
        << "the KV transport still read the blocks prefill.kv_hold_timeout_s after their "
           "release; freed";
    engine_.FreeBlocks(it->second.blocks);
    it = draining_.erase(it);
  }
  std::vector<std::string> expired;
  for (auto& [id, entry] : requests_)
    if (entry.state == HandoffState::kPublished && now >= entry.deadline) expired.push_back(id);
  for (const std::string& id : expired)
    Transition(id, requests_.at(id), HandoffState::kFailed,
               DeadlineExceeded("KV not pulled within prefill.kv_hold_timeout_s"));
}

void KvHandoff::FailAll(const Status& why) {
  std::vector<std::string> ids;
  for (auto& [id, entry] : requests_) ids.push_back(id);
  for (const std::string& id : ids) {
    Entry& entry = requests_.at(id);
    if (entry.state == HandoffState::kQueued) {
      engine_.Cancel(id);
      const ConnId router = entry.router;
      Transition(id, entry, HandoffState::kFailed, why);
      SendFinish(router, id, why, "", 0);
    } else {
      Transition(id, entry, HandoffState::kFailed, why);
    }
  }
}

size_t KvHandoff::held() const {
  size_t n = 0;
  for (const auto& [id, entry] : requests_)
    n += entry.state == HandoffState::kPrefilling || entry.state == HandoffState::kPublished;
  return n;
}

}  // namespace tandem
