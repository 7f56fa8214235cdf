// The simulated prefill instances (prefill/prefill_server.cc Step()): FCFS batches by token
// budget scheduled by SchedulePrefill, blocks for the whole prompt at its first chunk, the first
// token at the end of the batch that computes the prompt's last chunk, then the hand-off to the
// decode instance (simulator_engine.cc).

#include <algorithm>
#include <utility>
#include <vector>

#include "cluster/simulation.h"

namespace tandem::simulator {

void Simulation::PublishPrefill(int pi, double seen_before) {
  const PrefillInstance& p = prefill_[pi];
  if (Stepping(p)) return;
  LoadReport& r = latest_p_[pi];
  r.queued_prefill_tokens = p.queued_tokens;
  r.waiting_requests = static_cast<int32_t>(p.queue.size());
  // Arrivals during the step that just ended are still in the inbox (none has a chunk yet).
  for (int64_t id : p.queue) {
    if (reqs_[id].arrival <= seen_before) continue;
    r.queued_prefill_tokens -= reqs_[id].prompt - reqs_[id].scheduled;
    r.waiting_requests -= 1;
  }
  r.running_requests = 0;
  r.free_kv_blocks = p.free_blocks;
  r.total_kv_blocks = p.total_blocks;
  r.prefill_seconds_per_token = p.avg_s_per_token.value();
  taken_in_p_[pi] = TakenIn(seen_before);
  if (options_.load_report_interval_s <= 0) ApplyPrefillReport(pi);
}

void Simulation::TryPrefill(int pi) {
  PrefillInstance& p = prefill_[pi];
  if (p.kicked || p.queue.empty()) return;
  p.kicked = true;
  Push(now_, EventType::kPrefillKick, pi, 0);
}

void Simulation::RunPrefill(int pi) {
  PrefillInstance& p = prefill_[pi];
  if (p.queue.empty()) return;
  if (p.pp == 1 && !p.in_flight.empty()) return;  // the batch's end calls again
  if (now_ < p.stage_free_at) {
    if (p.wake_at < 0) {
      p.wake_at = p.stage_free_at;
      Push(p.stage_free_at, EventType::kPrefillWake, pi, 0);
    }
    return;
  }
  // SchedulePrefill stops once the budget or the batch is full: a prefix of the queue is enough.
  p.items.clear();
  p.item_ids.clear();
  int64_t budget = 0;
  int32_t count = 0;
  for (int64_t id : p.queue) {
    const Req& r = reqs_[id];
    p.items.push_back({r.prompt, r.scheduled, r.prefill_blocks});
    p.item_ids.push_back(id);
    if (r.prompt > r.scheduled) {
      budget += r.prompt - r.scheduled;
      ++count;
      if (budget >= p.limits.token_budget || count >= p.limits.max_batch_size) break;
    }
  }
  std::vector<PrefillChunk> batch = SchedulePrefill(p.items, p.limits, p.free_blocks);
  if (batch.empty()) {   // waiting for blocks (decode has not pulled yet) or all in flight
    PublishPrefill(pi);  // the loop turn that scheduled nothing publishes what it knows
    return;
  }
  PrefillBatch b;
  double sum = 0, sum_sq = 0;
  for (const PrefillChunk& c : batch) {
    int64_t id = p.item_ids[c.index];
    Req& r = reqs_[id];
    p.free_blocks -= c.new_blocks;
    r.prefill_blocks += c.new_blocks;
    r.scheduled += c.num_tokens;
    b.chunks.push_back({id, c.num_tokens});
    b.tokens += c.num_tokens;
    // A chunk's attention covers the tokens before it as well (n * (n + 2 * past)).
    double n = c.num_tokens, past = r.scheduled - c.num_tokens;
    sum += n;
    sum_sq += n * (n + 2 * past);
  }
  b.seconds = p.lm->PrefillSeconds(sum, sum_sq);
  b.done_at = now_ + b.seconds;
  if (!p.in_flight.empty()) b.done_at = std::max(b.done_at, p.in_flight.back().done_at);
  p.stage_free_at = now_ + b.seconds / p.pp;
  Push(b.done_at, EventType::kPrefillDone, pi, 0);
  p.in_flight.push_back(std::move(b));
  PublishPrefill(pi);
  if (p.pp > 1) RunPrefill(pi);  // schedules a wake for the next stage slot
}

void Simulation::OnPrefillDone(int pi) {
  PrefillInstance& p = prefill_[pi];
  PrefillBatch b = std::move(p.in_flight.front());
  p.in_flight.pop_front();
  std::vector<int64_t> done;
  for (auto [id, n] : b.chunks) {
    Req& r = reqs_[id];
    p.queued_tokens -= n;
    // Last chunk of the prompt done: first token, to the router and on to decode.
    if (r.scheduled == r.prompt &&
        !std::any_of(p.in_flight.begin(), p.in_flight.end(), [&](const PrefillBatch& later) {
          for (auto& c : later.chunks)
            if (c.first == id) return true;
          return false;
        }))
      done.push_back(id);
  }
  if (b.tokens > 0) p.avg_s_per_token.Add(b.seconds / static_cast<double>(b.tokens));
  for (int64_t id : done) {
    auto it = std::find(p.queue.begin(), p.queue.end(), id);
    if (it != p.queue.end()) p.queue.erase(it);
  }
  for (int64_t id : done) {
    Req& r = reqs_[id];
    r.last_pass_s = b.seconds;
    EmitToken(id);
    view_p_[pi].load.waiting_requests = std::max(view_p_[pi].load.waiting_requests - 1, 0);
    if (r.generated >= r.max_tokens) {
      p.free_blocks += r.prefill_blocks;
      r.prefill_blocks = 0;
      Complete(id);
      continue;
    }
    HandOff(id);
  }
  PublishPrefill(pi, b.done_at - b.seconds);
  RunPrefill(pi);  // the server steps again at once
}

}  // namespace tandem::simulator
