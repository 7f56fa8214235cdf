#include "decode/kv_intake.h"

#include <algorithm>

#include "common/base/log.h"
#include "common/config/serving_config.h"
#include "decode/decode_scheduler.h"
#include "kvtransfer/block_ranges.h"
#include "kvtransfer/wire.h"

namespace tandem {
namespace {

bool PrefillHolds(IntakeState s) {
  return s == IntakeState::kWaiting || s == IntakeState::kPulling ||
         s == IntakeState::kStreaming || s == IntakeState::kAbandoned;
}

bool Terminal(IntakeState s) { return s == IntakeState::kReleased || s == IntakeState::kFailed; }

uint32_t Layers(int32_t n) { return n < 0 ? kAllLayers : static_cast<uint32_t>(n); }

}  // namespace

const char* IntakeStateName(IntakeState state) {
  switch (state) {
    case IntakeState::kWaiting: return "waiting";
    case IntakeState::kPulling: return "pulling";
    case IntakeState::kStreaming: return "streaming";
    case IntakeState::kPulled: return "pulled";
    case IntakeState::kAbandoned: return "abandoned";
    case IntakeState::kReleased: return "released";
    case IntakeState::kFailed: return "failed";
  }
  return "?";
}

bool IntakeTransitionAllowed(IntakeState from, IntakeState to) {
  using S = IntakeState;
  if (Terminal(from)) return false;
  if (to == S::kFailed) return true;
  switch (from) {
    case S::kWaiting: return to == S::kPulling;
    case S::kPulling: return to == S::kStreaming || to == S::kPulled || to == S::kReleased ||
                             to == S::kAbandoned;
    case S::kStreaming: return to == S::kReleased || to == S::kAbandoned;
    case S::kPulled: return to == S::kReleased;
    case S::kAbandoned: return to == S::kReleased;
    default: return false;
  }
}

KvIntake::KvIntake(InstanceHost& host, BatchEngine& engine, KvPuller& puller, EngineSink& sink,
                   KvIntakeOptions options)
    : host_(host), engine_(engine), puller_(puller), sink_(sink), options_(options) {}

void KvIntake::Transition(const std::string& id, Entry& entry, IntakeState to,
                          const Status& why) {
  TANDEM_CHECK(IntakeTransitionAllowed(entry.state, to),
               "KV intake of " + id + ": " + IntakeStateName(entry.state) + " -> " +
                   IntakeStateName(to));
  const IntakeState from = entry.state;
  entry.state = to;
  if (PrefillHolds(from) && !PrefillHolds(to)) SendReleased(entry.prefill, id, why);
  if (from == IntakeState::kWaiting) std::erase(waiting_, id);
  if (!Terminal(to)) return;
  engine_.cache().blocks().Free(entry.blocks);
  entry.blocks.clear();
  if (!why.ok()) {
    TANDEM_LOG_REQ(kInfo, id) << "KV intake " << IntakeStateName(to) << ": " << why.ToString();
  }
  entries_.erase(id);  // `entry` dies here
}

void KvIntake::SendReleased(ConnId prefill, const std::string& id, const Status& status) {
  KvReleased released;
  released.request_id = id;
  released.code = status.code();
  released.message = status.message();
  host_.Send(prefill, released);
}

void KvIntake::FinishError(const std::string& id, const Status& status) {
  Finish f;
  f.request_id = id;
  f.code = status.code();
  f.message = status.message();
  f.completion_tokens = 1;  // prefill streamed the first token
  sink_.OnFinish(std::move(f));
}

void KvIntake::RefuseQuietly(ConnId prefill, const KvReady& ready, const Status& why) {
  TANDEM_LOG_REQ(kInfo, ready.request_id) << "KV refused: " << why.ToString();
  SendReleased(prefill, ready.request_id, why);
}

void KvIntake::Accept(ConnId prefill, KvReady ready) {
  const std::string id = ready.request_id;
  auto refuse = [&](const Status& s) {
    FinishError(id, s);
    SendReleased(prefill, id, s);
  };
  if (!host_.accepting()) return refuse(Unavailable(host_.name() + " is shutting down"));
  if (Known(id)) return refuse(InvalidArgument("request id already on this instance"));
  if (Status s = engine_.Validate(ready.prompt, ready.sampling); !s.ok()) return refuse(s);
  if (!ready.sampling.seed) return refuse(InvalidArgument("KvReady without a sampling seed"));
  const int num_layers = engine_.layout().num_layers;
  if (ready.layers_ready > num_layers)
    return refuse(InvalidArgument("KvReady announces more layers than the model has"));
  StatusOr<PeerInfo> peer = DecodePeerInfo(AsBytes(ready.kv_peer_info));
  if (!peer.ok()) return refuse(peer.status());
  StatusOr<KvDescriptor> desc = DecodeKvDescriptor(AsBytes(ready.kv_descriptor));
  if (!desc.ok()) return refuse(desc.status());
  if (desc->layers.size() != static_cast<size_t>(num_layers))
    return refuse(InvalidArgument("KV descriptor has " + std::to_string(desc->layers.size()) +
                                  " layers, the model " + std::to_string(num_layers)));
  if (desc->instance_id != peer->instance_id)
    return refuse(InvalidArgument("KV descriptor and peer info name different publishers"));
  if (Status s = puller_.Connect(*peer); !s.ok()) return refuse(s);
  Entry entry;
  entry.prefill = prefill;
  entry.first_token_at = Clock::now();
  entry.blocks_needed =
      BlocksForPull(static_cast<int32_t>(ready.prompt.size()), options_.block_size);
  entry.ready = std::move(ready);
  entries_.emplace(id, std::move(entry));
  waiting_.push_back(id);
}

void KvIntake::StartPull(const std::string& id, Entry& entry) {
  Status alloc = engine_.cache().blocks().Allocate(entry.blocks_needed, &entry.blocks);
  TANDEM_CHECK(alloc.ok(), "AdmitPulls checked the free blocks");
  Transition(id, entry, IntakeState::kPulling, Status());
  const KvLayout& layout = engine_.layout();
  const int32_t prompt_blocks = BlocksForTokens(entry.ready.prompt.size(), layout.block_size);
  LayerRanges local =
      KvBlockRanges(engine_.cache(), std::span(entry.blocks).first(prompt_blocks));
  PullCallbacks callbacks;
  if (options_.layerwise) {
    entry.arrival = std::make_shared<KvArrival>(layout.num_layers);
    callbacks.on_layer = [arrival = entry.arrival](uint32_t layer) { arrival->LayerLanded(layer); };
  }
  // The transport's thread: record the arrival, then hand the outcome to the engine thread.
  callbacks.on_done = [this, arrival = entry.arrival](const std::string& request_id,
                                                      const Status& status) {
    if (arrival) arrival->Done(status);
    host_.Post([this, request_id, status] { PullDone(request_id, status); });
  };
  // For a transport whose publisher sends only when asked (nccl): on the connection the KvReady
  // came on, so its messages keep the order the puller made them in.
  callbacks.to_publisher = [this, prefill = entry.prefill, id](std::string bytes) {
    host_.Send(prefill, KvTransport{id, std::move(bytes)});
  };
  StatusOr<KvDescriptor> desc = DecodeKvDescriptor(AsBytes(entry.ready.kv_descriptor));
  Status started = desc.ok() ? puller_.Pull(*desc, std::move(local), callbacks,
                                            Layers(entry.ready.layers_ready))
                             : desc.status();
  if (!started.ok()) {
    if (entry.arrival) entry.arrival->Done(started);
    host_.Post([this, id, started] { PullDone(id, started); });
    return;
  }
  if (options_.layerwise && entry.ready.first_token) JoinEngine(id, entry);
}

void KvIntake::JoinEngine(const std::string& id, Entry& entry) {
  engine_.AddPulled(id, entry.ready.prompt, entry.ready.first_token->token_id,
                    entry.ready.sampling, std::move(entry.blocks), entry.arrival);
  entry.blocks.clear();
  Transition(id, entry, IntakeState::kStreaming, Status());
}

void KvIntake::Complete(const std::string& id, Entry& entry) {
  if (options_.handoff_wait != nullptr)
    options_.handoff_wait->Observe(
        std::chrono::duration<double>(Clock::now() - entry.first_token_at).count());
  if (entry.state != IntakeState::kStreaming) {
    engine_.AddPulled(id, std::move(entry.ready.prompt), entry.ready.first_token->token_id,
                      entry.ready.sampling, std::move(entry.blocks));
    entry.blocks.clear();
  }
  Transition(id, entry, IntakeState::kReleased, Status());
}

void KvIntake::PullDone(const std::string& id, const Status& status) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& entry = it->second;
  if (entry.state == IntakeState::kAbandoned)
    return Transition(id, entry, status.ok() ? IntakeState::kReleased : IntakeState::kFailed,
                      status);
  if (!status.ok()) {
    TANDEM_LOG_REQ(kWarn, id) << "KV pull failed: " << status.ToString();
    // on_done ran: nothing writes the blocks any more, in the engine or not.
    if (entry.state == IntakeState::kStreaming) engine_.Cancel(id);
    FinishError(id, status.WithContext("KV pull"));
    return Transition(id, entry, IntakeState::kFailed, status);
  }
  if (entry.ready.first_token) return Complete(id, entry);
  if (entry.prefill_gone) {  // the first token will never come
    const Status gone = Unavailable("prefill instance disconnected");
    FinishError(id, gone);
    return Transition(id, entry, IntakeState::kFailed, gone);
  }
  Transition(id, entry, IntakeState::kPulled, Status());  // waits for the first token
}

void KvIntake::Progress(const KvProgress& m) {
  auto it = entries_.find(m.request_id);
  if (it == entries_.end()) return;  // failed or cancelled here already
  Entry& entry = it->second;
  // More layers may be read: a pull in flight needs them to end, wanted or not.
  const int32_t before = entry.ready.layers_ready;
  if (before != kAllLayersReady && (m.layers_ready == kAllLayersReady || m.layers_ready > before)) {
    entry.ready.layers_ready = m.layers_ready;
    if (entry.state == IntakeState::kPulling || entry.state == IntakeState::kStreaming ||
        entry.state == IntakeState::kAbandoned) {
      Status s = puller_.SetLayersAvailable(m.request_id, Layers(m.layers_ready));
      static_cast<void>(s);  // NotFound: the pull ended meanwhile (its PullDone is queued)
    }
  }
  if (entry.state == IntakeState::kAbandoned) return;
  if (m.finished) {  // prefill sent the Finish; only the KV is left to release
    switch (entry.state) {
      case IntakeState::kWaiting:
        return Transition(m.request_id, entry, IntakeState::kFailed,
                          Cancelled("finished at its first token"));
      case IntakeState::kPulled:
        return Transition(m.request_id, entry, IntakeState::kReleased, Status());
      case IntakeState::kStreaming:  // not possible: prefill sends the first token only once
        engine_.Remove(m.request_id, &entry.blocks);
        [[fallthrough]];
      default:
        return Transition(m.request_id, entry, IntakeState::kAbandoned, Status());
    }
  }
  const bool knew_first = entry.ready.first_token.has_value();
  if (m.first_token && !knew_first) {
    entry.ready.first_token = m.first_token;
    entry.first_token_at = Clock::now();
  }
  if (knew_first || !entry.ready.first_token) return;
  if (entry.state == IntakeState::kPulled) return Complete(m.request_id, entry);
  if (entry.state == IntakeState::kPulling && options_.layerwise) JoinEngine(m.request_id, entry);
}

bool KvIntake::Cancel(const std::string& id, bool quietly) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  Entry& entry = it->second;
  if (entry.state == IntakeState::kAbandoned) return true;
  const Status cancelled = quietly ? Cancelled("router session closed") : Cancelled("cancelled");
  if (!quietly) FinishError(id, cancelled);
  switch (entry.state) {
    case IntakeState::kWaiting:
    case IntakeState::kPulled:
      Transition(id, entry, IntakeState::kFailed, cancelled);
      break;
    case IntakeState::kStreaming:  // in the batch while its KV arrives: out of it now
      engine_.Remove(id, &entry.blocks);
      [[fallthrough]];
    default:  // the blocks are freed when the pull has ended
      Transition(id, entry, IntakeState::kAbandoned, cancelled);
  }
  return true;
}

void KvIntake::PrefillClosed(ConnId conn) {
  std::vector<std::string> ids;
  for (auto& [id, entry] : entries_)
    if (entry.prefill == conn && !entry.ready.first_token && entry.state != IntakeState::kAbandoned)
      ids.push_back(id);
  // Waiting ones whose first token is known cannot be pulled any more either.
  for (auto& [id, entry] : entries_)
    if (entry.prefill == conn && entry.ready.first_token && entry.state == IntakeState::kWaiting)
      ids.push_back(id);
  const Status gone = Unavailable("prefill instance disconnected");
  for (const std::string& id : ids) {
    Entry& entry = entries_.at(id);
    entry.prefill_gone = true;
    // A pull in flight fails or completes with no first token to come: PullDone decides.
    if (entry.state == IntakeState::kPulling || entry.state == IntakeState::kStreaming) continue;
    FinishError(id, gone);
    Transition(id, entry, IntakeState::kFailed, gone);
  }
}

double PullStartMarginSeconds(std::string_view transfer_backend, double transfer_timeout_s,
                              double hold_timeout_s) {
  // cuda_ipc: the whole margin, whatever the hold (ValidateForServing refuses a hold shorter
  // than twice it): a shorter one would let a copy run past the hold.
  if (transfer_backend == "cuda_ipc") return CudaIpcPullMarginSeconds(transfer_timeout_s);
  return std::min(1.0, 0.2 * hold_timeout_s);
}

void KvIntake::ExpireWaiting() {
  // Prefill frees unpulled KV after prefill.kv_hold_timeout_s (same cluster config). Pulling
  // after that could read blocks it has reused, so a request that waited that long (less a
  // margin: PullStartMarginSeconds) fails here instead. Prefill's hold starts when it sends the
  // first token; until then, conservatively, when KvReady came.
  const double margin_s = options_.pull_start_margin_s;
  const auto limit = std::chrono::milliseconds(
      static_cast<int64_t>((options_.hold_timeout_s - margin_s) * 1000));
  const auto now = Clock::now();
  std::vector<std::string> late;
  for (const std::string& id : waiting_)
    if (now - entries_.at(id).first_token_at >= limit) late.push_back(id);
  const Status status = DeadlineExceeded("waited for decode KV blocks longer than "
                                         "prefill.kv_hold_timeout_s");
  for (const std::string& id : late) {
    FinishError(id, status);
    Transition(id, entries_.at(id), IntakeState::kFailed, status);
  }
}

int32_t KvIntake::outside_engine() const {
  int32_t n = 0;
  for (const auto& [id, entry] : entries_)
    n += entry.state == IntakeState::kPulling || entry.state == IntakeState::kPulled ||
         entry.state == IntakeState::kAbandoned;
  return n;
}

void KvIntake::Admit() {
  ExpireWaiting();
  if (waiting_.empty()) return;
  EngineStats stats = engine_.Stats();
  if (stats.waiting > 0) return;  // preempted requests recompute before new ones come in
  std::vector<int32_t> needs;
  for (const std::string& id : waiting_) needs.push_back(entries_.at(id).blocks_needed);
  PullLimits limits{stats.total_blocks, options_.kv_usage_watermark, options_.max_batch_size};
  const size_t n = AdmitPulls(needs, limits, stats.free_blocks, stats.running + outside_engine());
  for (size_t i = 0; i < n; ++i) {
    const std::string id = waiting_.front();
    StartPull(id, entries_.at(id));
  }
}

void KvIntake::FailAll(const Status& why) {
  std::vector<std::string> ids;
  for (auto& [id, entry] : entries_) ids.push_back(id);
  for (const std::string& id : ids) {
    Entry& entry = entries_.at(id);
    switch (entry.state) {
      case IntakeState::kWaiting:
      case IntakeState::kPulled:
        FinishError(id, why);
        Transition(id, entry, IntakeState::kFailed, why);
        break;
      case IntakeState::kPulling:
        FinishError(id, why);  // the engine's FailAll told the kStreaming ones
        break;
      default:
        break;
    }
  }
}

}  // namespace tandem
