// The simulated decode and colocated instances (decode/decode_server.cc, decode/batch_engine.cc):
// KV pulls admitted by AdmitPulls and timed by the transfer model, engine steps scheduled by
// ScheduleEngineStep (recompute preemption), pipeline_parallel as micro-batch lanes, and the
// load reports the engine loop publishes.

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "cluster/simulation.h"
#include "common/engine/kv_cache.h"

namespace tandem::simulator {

double Simulation::TransferSeconds(int64_t id) const {
  const Req& r = reqs_[id];
  const LatencyModel* lm = prefill_[r.prefill].lm;
  double bytes = static_cast<double>(BlocksForTokens(r.prompt, block_size_)) * block_size_ *
                 lm->kv_bytes_per_token;
  double seconds = models_.transfer.Seconds(bytes);
  // transfer.layerwise: the layers stream while prefill's last pass computes them, so a pull
  // that starts as the request is handed off has only what that pass did not cover left.
  if (config_.transfer.layerwise && now_ <= r.pull_arrived)
    seconds = models_.transfer.latency_s +
              std::max(0.0, seconds - models_.transfer.latency_s - r.last_pass_s);
  return seconds;
}

void Simulation::HandOff(int64_t id) {
  Req& r = reqs_[id];
  EngineInstance& e = engines_[r.decode];
  if (BlocksForTokens(int64_t{r.prompt} + r.max_tokens, block_size_) > e.total_blocks) {
    PrefillInstance& p = prefill_[r.prefill];
    p.free_blocks += r.prefill_blocks;
    r.prefill_blocks = 0;
    Fail(id, "request needs more KV blocks than the decode instance has");
    return;
  }
  r.pull_arrived = now_;
  e.pull_queue.push_back(id);
  PublishEngine(r.decode);
  TryEngine(r.decode);
}

void Simulation::AddToEngine(int ei, int64_t id, bool pulled) {
  EngineInstance& e = engines_[ei];
  Req& r = reqs_[id];
  int best = 0;
  size_t best_size = std::numeric_limits<size_t>::max();
  for (int l = 0; l < e.pp; ++l) {
    size_t size = e.lanes[l].running.size() + e.lanes[l].waiting.size();
    if (size < best_size) {
      best_size = size;
      best = l;
    }
  }
  if (pulled) {
    r.num_tokens = r.prompt + 1;
    r.num_computed = r.prompt;
    e.lanes[best].running.push_back(id);
  } else {
    r.num_tokens = r.prompt;
    r.num_computed = 0;
    r.num_blocks = 0;
    e.lanes[best].waiting.push_back(id);
  }
}

void Simulation::AdmitPulls(int ei) {
  EngineInstance& e = engines_[ei];
  // ExpireQueuedPulls: prefill would free the KV soon; the request fails instead of pulling.
  // The queue is in arrival order, so the oldest is at the front.
  while (!e.pull_queue.empty() &&
         now_ - reqs_[e.pull_queue.front()].pull_arrived >= e.pull_expiry_s) {
    int64_t id = e.pull_queue.front();
    e.pull_queue.pop_front();
    Req& r = reqs_[id];
    prefill_[r.prefill].free_blocks += r.prefill_blocks;
    r.prefill_blocks = 0;
    Fail(id, "waited for decode KV blocks longer than prefill.kv_hold_timeout_s");
    PublishPrefill(r.prefill);
    TryPrefill(r.prefill);
  }
  if (e.pull_queue.empty()) return;
  int32_t running = 0;
  for (const Lane& l : e.lanes) {
    if (!l.waiting.empty()) return;  // preempted requests recompute before new ones come in
    running += static_cast<int32_t>(l.running.size());
  }
  e.needs.clear();
  // AdmitPulls stops at the batch limit: a prefix is enough.
  size_t limit = static_cast<size_t>(std::max(0, e.pull_limits.max_batch_size - running));
  for (int64_t id : e.pull_queue) {
    if (e.needs.size() >= limit) break;
    e.needs.push_back(BlocksForPull(reqs_[id].prompt, block_size_));
  }
  size_t n = tandem::AdmitPulls(e.needs, e.pull_limits, e.free_blocks, running + e.pulling);
  for (size_t i = 0; i < n; ++i) {
    int64_t id = e.pull_queue.front();
    e.pull_queue.pop_front();
    Req& r = reqs_[id];
    r.num_blocks = e.needs[i];
    e.free_blocks -= e.needs[i];
    e.pulling += 1;
    Push(now_ + TransferSeconds(id), EventType::kPullDone, ei, id);
  }
}

void Simulation::OnPullDone(int ei, int64_t id) {
  EngineInstance& e = engines_[ei];
  Req& r = reqs_[id];
  e.pulling -= 1;
  PrefillInstance& p = prefill_[r.prefill];
  p.free_blocks += r.prefill_blocks;  // KvReleased
  r.prefill_blocks = 0;
  PublishPrefill(r.prefill);
  TryPrefill(r.prefill);
  AddToEngine(ei, id, /*pulled=*/true);
  PublishEngine(ei);
  TryEngine(ei);
}

void Simulation::TryEngine(int ei) {
  EngineInstance& e = engines_[ei];
  if (e.kicked) return;
  e.kicked = true;
  Push(now_, EventType::kEngineKick, ei, 0);
}

void Simulation::RunEngine(int ei) {
  EngineInstance& e = engines_[ei];
  bool any_free = false;
  for (const Lane& l : e.lanes) any_free |= !l.busy;
  if (!any_free) return;  // the engine thread is inside a step
  if (!e.colocated) AdmitPulls(ei);
  for (int l = 0; l < e.pp; ++l) {
    Lane& lane = e.lanes[l];
    if (lane.busy || (lane.running.empty() && lane.waiting.empty())) continue;
    if (now_ < e.stage_free_at) {
      if (e.wake_at < 0) {
        e.wake_at = e.stage_free_at;
        Push(e.stage_free_at, EventType::kEngineWake, ei, 0);
      }
      break;
    }
    // A step that only preempted is followed by another at once (the server's loop).
    for (int guard = 0; guard < 1000 && !lane.busy; ++guard)
      if (!StartStep(ei, l)) break;
  }
  PublishEngine(ei);
}

// One BatchEngine::Step: true when it preempted but scheduled nothing (the caller steps again).
bool Simulation::StartStep(int ei, int li) {
  EngineInstance& e = engines_[ei];
  Lane& lane = e.lanes[li];
  if (lane.running.empty() && lane.waiting.empty()) return false;
  e.running_state.clear();
  e.waiting_state.clear();
  for (int64_t id : lane.running) {
    const Req& r = reqs_[id];
    e.running_state.push_back({r.num_tokens, r.num_computed, r.num_blocks});
  }
  // Both policies stop at the batch limit: a prefix of the waiting queue is enough.
  for (int64_t id : lane.waiting) {
    if (static_cast<int32_t>(e.waiting_state.size()) >= e.limits.max_batch_size) break;
    const Req& r = reqs_[id];
    e.waiting_state.push_back({r.num_tokens, r.num_computed, r.num_blocks});
  }
  StepPlan plan = ScheduleEngineStep(e.running_state, e.waiting_state, e.limits, e.free_blocks);
  if (!plan.preempted.empty()) {
    std::vector<size_t> victims = plan.preempted;
    std::sort(victims.begin(), victims.end());
    for (auto it = victims.rbegin(); it != victims.rend(); ++it) {
      int64_t id = lane.running[*it];
      Req& r = reqs_[id];
      e.free_blocks += r.num_blocks;
      r.num_blocks = 0;
      r.num_computed = 0;
      lane.waiting.push_front(id);
      lane.running.erase(lane.running.begin() + static_cast<long>(*it));
    }
  }
  if (plan.scheduled.empty()) return !plan.preempted.empty();
  size_t admitted = 0;
  for (const ScheduledSeq& s : plan.scheduled) admitted += s.from_waiting ? 1 : 0;
  for (size_t k = 0; k < admitted; ++k) {
    lane.running.push_back(lane.waiting.front());
    lane.waiting.pop_front();
  }
  const size_t first_admitted = lane.running.size() - admitted;
  lane.batch.clear();
  e.chunk_new.clear();
  e.chunk_past.clear();
  int64_t decode_batch = 0;
  double sum_context = 0;
  lane.prefill_tokens = 0;
  for (const ScheduledSeq& s : plan.scheduled) {
    int64_t id = s.from_waiting ? lane.running[first_admitted + s.index] : lane.running[s.index];
    Req& r = reqs_[id];
    e.free_blocks -= s.new_blocks;
    r.num_blocks += s.new_blocks;
    const int32_t remaining = r.num_tokens - r.num_computed;
    if (remaining > 1 || s.from_waiting) {
      lane.prefill_tokens += s.num_tokens;
      e.chunk_new.push_back(s.num_tokens);
      e.chunk_past.push_back(r.num_computed);
    } else {
      decode_batch += 1;
      sum_context += r.num_tokens;
    }
    lane.batch.push_back({id, s.num_tokens});
  }
  lane.seconds = e.lm->MixedStepSeconds(e.chunk_new, e.chunk_past, decode_batch, sum_context);
  if (options_.decode_time_scale != 1.0 && decode_batch > 0) {
    // Decode-only: the whole step (fixed cost included); mixed: the decode sequences' share.
    const double decode_share =
        e.chunk_new.empty() ? lane.seconds : e.lm->c5 * decode_batch + e.lm->c6 * sum_context;
    lane.seconds += (options_.decode_time_scale - 1.0) * decode_share;
  }
  lane.decode_batch = decode_batch;
  lane.decode_context = sum_context;
  lane.busy = true;
  lane.started_at = now_;
  e.stage_free_at = now_ + lane.seconds / e.pp;
  Push(now_ + lane.seconds, EventType::kStepDone, ei, li);
  return false;
}

void Simulation::OnStepDone(int ei, int li) {
  EngineInstance& e = engines_[ei];
  Lane& lane = e.lanes[li];
  lane.busy = false;
  bool any_finished = false;
  for (auto [id, n] : lane.batch) {
    Req& r = reqs_[id];
    r.num_computed += n;
    if (r.num_computed < r.num_tokens) continue;  // mid-prompt chunk
    r.num_tokens += 1;
    EmitToken(id);
    if (r.generated >= r.max_tokens) {
      e.free_blocks += r.num_blocks;
      r.num_blocks = 0;
      Complete(id);
      any_finished = true;
    }
  }
  if (any_finished) {
    lane.running.erase(std::remove_if(lane.running.begin(), lane.running.end(),
                                      [&](int64_t id) { return reqs_[id].finished; }),
                       lane.running.end());
  }
  if (lane.prefill_tokens > 0)
    e.avg_prefill_s_per_token.Add(lane.seconds / static_cast<double>(lane.prefill_tokens));
  else {
    e.avg_decode_step_s.Add(lane.seconds);
    e.avg_decode_batch.Add(static_cast<double>(lane.decode_batch));
    e.avg_decode_context.Add(lane.decode_context);
  }
  lane.batch.clear();
  PublishEngine(ei, lane.started_at);
  RunEngine(ei);  // the server steps again at once
}

void Simulation::PublishEngine(int ei, double seen_before) {
  const EngineInstance& e = engines_[ei];
  if (Stepping(e)) return;
  LoadReport& r = latest_e_[ei];
  r = LoadReport{};
  int32_t waiting = 0, running = 0;
  for (const Lane& l : e.lanes) {
    running += static_cast<int32_t>(l.running.size());
    for (int64_t id : l.running) r.context_tokens += reqs_[id].num_tokens;
    for (int64_t id : l.waiting) {
      // A colocated arrival during the step that just ended is still in the inbox.
      if (e.colocated && reqs_[id].arrival > seen_before) continue;
      waiting += 1;
      r.queued_prefill_tokens += reqs_[id].num_tokens - reqs_[id].num_computed;
    }
  }
  for (int64_t id : e.pull_queue) waiting += reqs_[id].pull_arrived > seen_before ? 0 : 1;
  r.waiting_requests = waiting + e.pulling;
  r.running_requests = running;
  r.free_kv_blocks = e.free_blocks;
  r.total_kv_blocks = e.total_blocks;
  r.prefill_seconds_per_token = e.avg_prefill_s_per_token.value();
  r.decode_step_seconds = e.avg_decode_step_s.value();
  r.decode_forward_seconds = e.avg_decode_step_s.value();  // a simulated step is its forward pass
  r.decode_step_batch = e.avg_decode_batch.value();
  r.decode_step_context_tokens = e.avg_decode_context.value();
  taken_in_e_[ei] = TakenIn(seen_before);
  if (options_.load_report_interval_s <= 0) ApplyEngineReport(ei);
}

}  // namespace tandem::simulator
