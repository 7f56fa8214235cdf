// ClusterBackend: placement, Submit/Cancel and the per-request token streams (the connections
// and heartbeats are in cluster_backend.cc).
#include <algorithm>
#include <utility>

#include "common/base/log.h"
#include "router/cluster_backend.h"
#include "router/cluster_backend_state.h"

namespace tandem {

// What a request adds to an instance's load until a report includes it (router/placement.h).
void ClusterBackend::AddSubmit(Instance& instance, int64_t prompt_tokens) {
  AddUnreportedSubmit(instance.load, prompt_tokens, instance.role == InstanceRole::kColocated);
}

void ClusterBackend::AddHandoff(Instance& instance, int64_t prompt_tokens) {
  AddUnreportedHandoff(instance.load, prompt_tokens, instance.hello.kv_block_size);
}

bool ClusterBackend::HeldBy(const Request& r, int instance) {
  switch (r.phase) {
    case RequestPhase::kPrefilling: return instance == r.prefill || instance == r.decode;
    case RequestPhase::kHandingOff:
    case RequestPhase::kDecoding: return instance == r.decode;
    case RequestPhase::kColocated: return instance == r.colocated;
    case RequestPhase::kCancelling:
      return instance == r.prefill || instance == r.decode || instance == r.colocated;
    case RequestPhase::kFinished: return false;
  }
  return false;
}

void ClusterBackend::ApplyReportLocked(Instance& instance, const LoadReport& report) {
  instance.load = report;
  auto gone = [this](const Instance::Pending& p) TANDEM_REQUIRES(mutex_) {
    auto it = requests_.find(p.request_id);
    return it == requests_.end() || it->second->finished();
  };
  auto reported = [&](const Instance::Pending& p) TANDEM_REQUIRES(mutex_) {
    return p.seq <= report.last_submit_seq || gone(p);
  };
  std::erase_if(instance.unseen_submits, reported);
  for (const Instance::Pending& p : instance.unseen_submits) AddSubmit(instance, p.prompt_tokens);
  // A decode instance's report includes a request once it has sent output for it (kDecoding):
  // this report came after that output on the same connection.
  auto decoding = [&](const Instance::Pending& p) TANDEM_REQUIRES(mutex_) {
    if (gone(p)) return true;
    RequestPhase phase = requests_.at(p.request_id)->phase;
    return phase != RequestPhase::kPrefilling && phase != RequestPhase::kHandingOff;
  };
  std::erase_if(instance.incoming_handoffs, decoding);
  for (const Instance::Pending& p : instance.incoming_handoffs)
    AddHandoff(instance, p.prompt_tokens);
}

Status ClusterBackend::CheckSloClass(const std::string& slo_class) const {
  MutexLock lock(&mutex_);
  return CheckSloClassLocked(slo_class);
}

Status ClusterBackend::CheckSloClassLocked(const std::string& slo_class) const {
  if (slo_class.empty()) return Status::Ok();
  std::string known;
  for (const SloClass& c : slo_.classes) {
    if (c.name == slo_class) return Status::Ok();
    known += (known.empty() ? "" : ", ") + c.name;
  }
  return InvalidArgument("header x-tandem-slo-class: unknown SLO class '" + slo_class + "' (" +
                         (known.empty() ? std::string("no classes are configured")
                                        : "configured: " + known) +
                         ")");
}

void ClusterBackend::SnapshotLocked(const GenerateRequest& request, Clock::time_point now,
                                    Snapshot* out) {
  // The requests each decode/colocated instance holds, in the order they were placed, for
  // TPOT predictions over a life (goodput is the only policy that reads them).
  const bool goodput = policy_ == PlacementPolicy::kGoodput;
  std::vector<std::vector<DecodeResident>> residents(instances_.size());
  if (goodput) {
    std::vector<std::vector<std::pair<uint64_t, DecodeResident>>> held(instances_.size());
    for (const auto& [id, r] : requests_) {
      int at = r->decode >= 0 ? r->decode : r->colocated;
      if (at < 0 || r->finished()) continue;
      held[at].push_back(
          {r->placed_order, ResidentOf(r->prompt_tokens, r->max_tokens, r->generated)});
    }
    for (size_t i = 0; i < held.size(); ++i) {
      std::sort(held[i].begin(), held[i].end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const auto& [order, resident] : held[i]) residents[i].push_back(resident);
    }
  }
  auto snapshot = [&](const std::vector<int>& ids, const LatencyModel* lm, int budget,
                      std::vector<InstanceLoad>* loads) TANDEM_REQUIRES(mutex_) {
    for (int i : ids) {
      Instance& x = *instances_[i];
      InstanceLoad load;
      load.name = x.name;
      load.usable = UsableLocked(x, now);
      load.load = x.load;
      load.kv_block_size = x.hello.kv_block_size;
      load.latency_model = lm;  // latency_ outlives Place(): both under mutex_
      load.token_budget = budget;
      if (goodput && x.role != InstanceRole::kPrefill) {
        // Every request the router is asked to place samples every instance.
        x.typical.Observe(residents[i], request.sampling.max_tokens);
        load.residents_known = true;
        load.residents = std::move(residents[i]);
        load.typical = x.typical;
      }
      loads->push_back(std::move(load));
    }
  };
  snapshot(prefill_, latency_.prefill, config_.prefill.token_budget, &out->prefill);
  snapshot(decode_, latency_.decode, config_.decode.token_budget, &out->decode);
  snapshot(colocated_, latency_.colocated, config_.colocated.token_budget, &out->colocated);
  PlacementInput& input = out->input;
  input.prefill = &out->prefill;
  input.decode = &out->decode;
  input.colocated = &out->colocated;
  input.prompt_tokens = static_cast<int64_t>(request.prompt_token_ids.size());
  input.max_tokens = request.sampling.max_tokens;
  input.slo = SloForClass(slo_, request.slo_class);
  input.round_robin = round_robin_++;
}

ClusterBackend::Instance& ClusterBackend::RecordPlacementLocked(
    const std::shared_ptr<Request>& entry, const Placement& placed,
    const GenerateRequest& request, tandem::Submit* message) {
  message->request_id = request.request_id;
  message->prompt = request.prompt_token_ids;
  message->sampling = request.sampling;
  message->sampling.stop.clear();  // stop strings are the router's business
  Instance* first = nullptr;
  if (placed.colocated >= 0) {
    entry->colocated = colocated_[placed.colocated];
    entry->phase = RequestPhase::kColocated;
    first = instances_[entry->colocated].get();
  } else {
    entry->prefill = prefill_[placed.prefill];
    entry->decode = decode_[placed.decode];
    entry->phase = RequestPhase::kPrefilling;
    first = instances_[entry->prefill].get();
    Instance& d = *instances_[entry->decode];
    message->decode_address =
        d.hello.control_address.empty() ? d.address : d.hello.control_address;
    message->decode_session = d.session;
    // Until a report includes it, count what this router just gave the decode instance.
    AddHandoff(d, entry->prompt_tokens);
    d.incoming_handoffs.push_back({0, entry->id, entry->prompt_tokens});
  }
  message->seq = first->next_submit_seq++;
  AddSubmit(*first, entry->prompt_tokens);
  first->unseen_submits.push_back({message->seq, entry->id, entry->prompt_tokens});
  requests_[entry->id] = entry;
  TANDEM_LOG_REQ(kDebug, entry->id)
      << "placed on " << first->name
      << (entry->decode >= 0 ? " -> " + instances_[entry->decode]->name : std::string())
      << " (predicted ttft " << placed.predicted_ttft_s << " s, tpot "
      << placed.predicted_tpot_s << " s)";
  return *first;
}

std::optional<Placement> ClusterBackend::SiblingPlacementLocked(const std::string& sibling,
                                                                Clock::time_point now) {
  auto it = requests_.find(sibling);
  if (it == requests_.end()) return std::nullopt;
  const Request& r = *it->second;
  if (r.phase == RequestPhase::kCancelling || r.finished()) return std::nullopt;
  // The placement's indices are into the role lists (prefill_, decode_, colocated_).
  auto position = [&](const std::vector<int>& ids, int instance) {
    auto at = std::find(ids.begin(), ids.end(), instance);
    if (at == ids.end() || !UsableLocked(*instances_[instance], now)) return -1;
    return static_cast<int>(at - ids.begin());
  };
  Placement placed;
  if (r.colocated >= 0) {
    placed.colocated = position(colocated_, r.colocated);
    if (placed.colocated < 0) return std::nullopt;
    return placed;
  }
  if (r.prefill < 0 || r.decode < 0) return std::nullopt;
  placed.prefill = position(prefill_, r.prefill);
  placed.decode = position(decode_, r.decode);
  if (placed.prefill < 0 || placed.decode < 0) return std::nullopt;
  return placed;
}

Status ClusterBackend::Submit(const GenerateRequest& request,
                              std::function<void(BackendEvent)> on_event) {
  MutexLock lock(&mutex_);
  if (!started_ || stopping_) return Unavailable("the router is not running");
  if (requests_.count(request.request_id))
    return InvalidArgument("duplicate request id " + request.request_id);
  TANDEM_RETURN_IF_ERROR(CheckSloClassLocked(request.slo_class));
  const Clock::time_point now = Clock::now();
  // A choice that follows its request's first is no placement decision of its own: no snapshot
  // (the round-robin count and the residents' samples are the first's).
  std::optional<Placement> sibling;
  if (!request.place_with.empty()) sibling = SiblingPlacementLocked(request.place_with, now);
  Snapshot snapshot;
  if (!sibling) SnapshotLocked(request, now, &snapshot);
  StatusOr<Placement> placement = sibling ? *sibling : Place(policy_, snapshot.input);
  if (!placement.ok()) {
    if (placements_) {
      bool rejected = placement.status().code() == StatusCode::kResourceExhausted;
      placements_->WithLabels({rejected ? "rejected" : "unavailable"}).Inc();
    }
    TANDEM_LOG_REQ(kDebug, request.request_id) << "not placed: " << placement.status().message();
    return placement.status();
  }
  if (placements_) placements_->WithLabels({"placed"}).Inc();
  auto entry = std::make_shared<Request>();
  entry->id = request.request_id;
  entry->on_event = std::move(on_event);
  entry->placed_order =
      sibling ? requests_.at(request.place_with)->placed_order : snapshot.input.round_robin;
  entry->prompt_tokens = static_cast<int64_t>(request.prompt_token_ids.size());
  entry->max_tokens = request.sampling.max_tokens;
  tandem::Submit message;
  Instance& first = RecordPlacementLocked(entry, *placement, request, &message);
  // Sent under the lock, so that a Cancel of this request (which takes the lock) always
  // follows its Submit on the connection.
  if (first.connection && first.connection->Send(message)) return Status::Ok();
  requests_.erase(entry->id);  // its pending-load entries go with the next report
  return Unavailable(first.name + " went away before the request could be sent");
}

void ClusterBackend::SendCancelLocked(int instance, const std::string& request_id) {
  if (instance < 0) return;
  const auto& connection = instances_[instance]->connection;
  if (connection) connection->Send(tandem::Cancel{request_id});
}

void ClusterBackend::Cancel(const std::string& request_id) {
  MutexLock lock(&mutex_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  if (r.phase == RequestPhase::kCancelling || r.finished()) return;
  r.Advance(RequestPhase::kCancelling);
  r.cancelled_at = Clock::now();
  // Both sides of a pair, whatever the phase: the request may be in flight between them, and
  // a decode instance that does not know the request yet keeps the Cancel for it.
  SendCancelLocked(r.prefill, request_id);
  SendCancelLocked(r.decode, request_id);
  SendCancelLocked(r.colocated, request_id);
}

void ClusterBackend::FinishLocked(const std::shared_ptr<Request>& request, BackendEvent event) {
  request->Advance(RequestPhase::kFinished);
  request->held_back.clear();
  request->queue.push_back(std::move(event));
  auto it = requests_.find(request->id);
  if (it != requests_.end() && it->second == request) requests_.erase(it);
}

void ClusterBackend::FailLocked(const std::shared_ptr<Request>& request, const Status& error,
                                RequestList* to_drain) {
  if (request->finished()) return;
  BackendEvent event;
  event.error = error;
  FinishLocked(request, std::move(event));
  to_drain->push_back(request);
}

// Unannotated for the analysis, which does not follow std::unique_lock.
void ClusterBackend::Drain(const std::shared_ptr<Request>& request)
    TANDEM_NO_THREAD_SAFETY_ANALYSIS {
  std::unique_lock<Mutex> lock(mutex_);
  while (!request->delivering && !request->queue.empty()) {
    request->delivering = true;
    BackendEvent event = std::move(request->queue.front());
    request->queue.pop_front();
    bool final = event.finish_reason.has_value() || !event.error.ok();
    std::function<void(BackendEvent)> callback = request->on_event;
    if (final) request->on_event = nullptr;  // release the caller's state after the end
    lock.unlock();
    if (callback) callback(std::move(event));
    lock.lock();
    request->delivering = false;
  }
}

std::shared_ptr<ClusterBackend::Request> ClusterBackend::OnTokensLocked(size_t index,
                                                                        Tokens tokens) {
  auto it = requests_.find(tokens.request_id);
  if (it == requests_.end()) return nullptr;  // finished, failed, or of another router
  std::shared_ptr<Request> request = it->second;
  Request& r = *request;
  const int from = static_cast<int>(index);
  if (from != r.prefill && from != r.decode && from != r.colocated) return nullptr;
  // A cancelled request's output is not wanted; only its final event is delivered.
  if (r.phase == RequestPhase::kCancelling) return nullptr;
  BackendEvent event;
  event.tokens = std::move(tokens.tokens);
  r.generated += static_cast<int32_t>(event.tokens.size());
  if (from == r.prefill && r.phase == RequestPhase::kPrefilling) {
    r.queue.push_back(std::move(event));
    instances_[from]->load.waiting_requests =
        std::max(instances_[from]->load.waiting_requests - 1, 0);
    if (r.held_back.empty()) {
      r.Advance(RequestPhase::kHandingOff);
      return request;
    }
    // Decode's output overtook the first token: release it behind the first token, in order.
    const BackendEvent& last = r.held_back.back();
    const bool held_final = last.finish_reason.has_value() || !last.error.ok();
    for (auto& held : r.held_back) r.queue.push_back(std::move(held));
    r.held_back.clear();
    r.Advance(held_final ? RequestPhase::kFinished : RequestPhase::kDecoding);
    if (held_final) requests_.erase(it);
  } else if (from == r.decode && r.phase == RequestPhase::kPrefilling) {
    r.held_back.push_back(std::move(event));
    return nullptr;
  } else if (from == r.decode) {
    r.Advance(RequestPhase::kDecoding);
    r.queue.push_back(std::move(event));
  } else {
    r.queue.push_back(std::move(event));  // colocated, or prefill's tokens after the first
  }
  return request;
}

std::shared_ptr<ClusterBackend::Request> ClusterBackend::OnFinishLocked(size_t index,
                                                                        const Finish& finish) {
  auto it = requests_.find(finish.request_id);
  if (it == requests_.end()) return nullptr;
  std::shared_ptr<Request> request = it->second;
  const int from = static_cast<int>(index);
  if (from != request->prefill && from != request->decode && from != request->colocated)
    return nullptr;
  BackendEvent event;
  if (finish.code == StatusCode::kOk) {
    event.finish_reason = finish.finish_reason.empty() ? "stop" : finish.finish_reason;
  } else {
    event.error = Status(finish.code, instances_[from]->name + ": " + finish.message);
  }
  if (from == request->decode && request->phase == RequestPhase::kPrefilling &&
      finish.code == StatusCode::kOk) {
    request->held_back.push_back(std::move(event));  // ends the request once the first token came
    return nullptr;
  }
  FinishLocked(request, std::move(event));
  return request;
}

}  // namespace tandem
