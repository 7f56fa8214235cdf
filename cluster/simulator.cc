// The cluster simulator: a discrete-event replay of the real servers' scheduling loops.
//
// What is mirrored, and from where:
//   router     router/cluster_backend.cc: Place() (router/placement.h, the real function) on
//              InstanceLoads built as the router builds them: each instance's latest LoadReport
//              plus what the router placed there that the report does not include yet (first
//              instance: queued tokens + prompt, waiting + 1, colocated also running + 1, for
//              requests the instance had not taken in when it computed the report; decode:
//              running + 1, context + prompt and the prompt's blocks, until prefill's first
//              token; first token from prefill: waiting - 1 until the next report). Reports are
//              what the servers' PublishLoad() computes, including the moving averages
//              (common/base/moving_average.h) of the measured (here: simulated) step times.
//              load_report_interval_s > 0: reports reach the router every interval; 0: after every
//              change. With router.latency_model set, the router predicts from the simulated
//              instances' own entries (a router whose latency model is exact) and token budgets.
//              reports_after_steps: a pp 1 instance publishes only when its engine loop does,
//              after a step (or a loop turn that scheduled nothing), from the state it knew when
//              the step began: requests that arrived during a step are missing from that report
//              (they sat in the inbox; the router adds them back), and a report sent while a
//              step runs is the one from before the step.
//   prefill    prefill/prefill_server.cc Step(): SchedulePrefill (the real function) over the
//              FCFS queue, blocks for the whole prompt at its first chunk, first token at the
//              end of the batch that computes the prompt's last chunk (TTFT ends there), KV
//              held until the decode instance has pulled it. kv_blocks 0 = the servers'
//              default pool, KvPoolBlocks (common/engine/kv_cache.h).
//   decode     decode/decode_server.cc + decode/batch_engine.cc: KvReady joins the pull queue;
//              between steps AdmitPulls (the real function; none while preempted requests
//              wait) starts pulls that take TransferModel::Seconds(prompt blocks * block_size *
//              kv_bytes_per_token; with transfer.layerwise, less the last prefill pass, which
//              the layer stream overlaps); a pulled request joins the running batch; every step is
//              ScheduleEngineStep (the real function, with recompute preemption); queued pulls
//              older than prefill.kv_hold_timeout_s - 1 fail as on the server.
//   colocated  the same engine with requests added from scratch, under colocated.scheduling:
//              chunked (vLLM-style mixed steps) or prefill_first (whole prompts in prefill-only
//              steps that pause the decodes; vLLM 2023), decode/colocated_scheduler.h.
// Step times: prefill batches LatencyModel::PrefillSeconds, engine steps MixedStepSeconds
// (= DecodeStepSeconds when no prefill chunk is in the step; the context of a decoding
// sequence is its prompt + generated tokens). Requests are ignore_eos: exactly max_tokens
// outputs.
//
// Pipeline parallelism (pipeline_parallel = pp > 1): the entry's time is a batch's latency
// through all stages; the first stage takes a new batch every latency / pp. Prefill instances
// start the next batch then (a pipelined batch stream; completions keep their order). Engine
// instances run pp micro-batch lanes (as vLLM's virtual engines): a request stays in the lane
// it was admitted to (the one with the fewest requests), a lane has at most one step in flight
// and max_batch_size sequences per step, the KV pool and admission (max_batch_size * pp
// requests) are shared. pp = 1 is exactly the servers' loop.
#include "cluster/simulator.h"

#include <algorithm>
#include <limits>
#include <string>

#include "cluster/simulation.h"
#include "common/engine/kv_cache.h"

namespace tandem {
namespace simulator {
namespace {

// A simulated instance's pool: S.kv_blocks, else what max_batch_size requests of max_model_len
// need (the machine simulated is not this one, so no memory fraction and no memory check).
StatusOr<int> SimulatedPoolBlocks(const ClusterConfig& config, const InstanceSection& section) {
  return KvPoolBlocks(config, section, KvLayout{0, 0, 0, config.kv_cache.block_size},
                      /*machine_bytes=*/0);
}

const LatencyModel* FindEntry(const LatencyModelFile& models, const InstanceSection& s,
                              const std::string& role) {
  return models.ForInstance(s.device, s.threads, s.tensor_parallel, s.pipeline_parallel, role);
}

}  // namespace

InstanceLoad Simulation::RouterView(std::string name) const {
  InstanceLoad view;
  view.name = std::move(name);
  view.usable = true;
  view.kv_block_size = block_size_;
  return view;
}

Status Simulation::Setup() {
  TANDEM_ASSIGN_OR_RETURN(policy_, ParsePlacementPolicy(config_.router.policy));
  slo_ = SloTarget{config_.slo.ttft_s, config_.slo.tpot_s};
  block_size_ = config_.kv_cache.block_size;
  auto entry = [&](const char* role, const InstanceSection& s) -> StatusOr<const LatencyModel*> {
    const LatencyModel* m = FindEntry(models_, s, role);
    if (m == nullptr)
      return InvalidArgument(std::string(role) + " instances (device " + s.device + ", threads " +
                             std::to_string(s.threads) + ", tensor_parallel " +
                             std::to_string(s.tensor_parallel) + ", pipeline_parallel " +
                             std::to_string(s.pipeline_parallel) + ") have no entry in " +
                             (models_.source.empty() ? "the latency model" : models_.source));
    return m;
  };
  if (config_.prefill.instances > 0 && config_.decode.instances > 0) {
    TANDEM_ASSIGN_OR_RETURN(const LatencyModel* pm, entry("prefill", config_.prefill));
    TANDEM_ASSIGN_OR_RETURN(const LatencyModel* dm, entry("decode", config_.decode));
    const InstanceSection& ps = config_.prefill;
    for (int i = 0; i < ps.instances; ++i) {
      PrefillInstance p;
      p.lm = pm;
      p.pp = std::max(1, ps.pipeline_parallel);
      p.limits = PrefillLimits{ps.token_budget, ps.max_batch_size, block_size_};
      TANDEM_ASSIGN_OR_RETURN(p.total_blocks, SimulatedPoolBlocks(config_, ps));
      p.free_blocks = p.total_blocks;
      prefill_.push_back(std::move(p));
      view_p_.push_back(RouterView("prefill-" + std::to_string(i)));
    }
    const InstanceSection& ds = config_.decode;
    for (int i = 0; i < ds.instances; ++i) {
      EngineInstance e;
      e.lm = dm;
      e.pp = std::max(1, ds.pipeline_parallel);
      e.limits = StepLimits{ds.token_budget, ds.max_batch_size, block_size_};
      TANDEM_ASSIGN_OR_RETURN(e.total_blocks, SimulatedPoolBlocks(config_, ds));
      e.free_blocks = e.total_blocks;
      e.pull_limits = PullLimits{e.total_blocks, ds.kv_usage_watermark, ds.max_batch_size * e.pp};
      e.pull_expiry_s = std::max(0.0, config_.prefill.kv_hold_timeout_s - 1.0);
      e.lanes.resize(e.pp);
      engines_.push_back(std::move(e));
      view_d_.push_back(RouterView("decode-" + std::to_string(i)));
    }
    num_decode_ = ds.instances;
  }
  // Colocated instances only serve when there is no pair (Place() ignores them otherwise).
  if (num_decode_ == 0 && config_.colocated.instances > 0) {
    TANDEM_ASSIGN_OR_RETURN(const LatencyModel* cm, entry("colocated", config_.colocated));
    const InstanceSection& cs = config_.colocated;
    for (int i = 0; i < cs.instances; ++i) {
      EngineInstance e;
      e.colocated = true;
      e.lm = cm;
      e.pp = std::max(1, cs.pipeline_parallel);
      e.limits = StepLimits{cs.token_budget, cs.max_batch_size, block_size_,
                            StepPolicyFromConfig(cs.scheduling)};
      TANDEM_ASSIGN_OR_RETURN(e.total_blocks, SimulatedPoolBlocks(config_, cs));
      e.free_blocks = e.total_blocks;
      e.lanes.resize(e.pp);
      engines_.push_back(std::move(e));
      view_c_.push_back(RouterView("colocated-" + std::to_string(i)));
    }
  }
  // With router.latency_model the router predicts from the instances' entries (here: the
  // simulation's own, i.e. a router whose model is exact) and their token budgets.
  if (!config_.router.latency_model.empty()) {
    for (size_t i = 0; i < view_p_.size(); ++i) {
      view_p_[i].latency_model = prefill_[i].lm;
      view_p_[i].token_budget = config_.prefill.token_budget;
    }
    for (size_t i = 0; i < view_d_.size(); ++i) {
      view_d_[i].latency_model = engines_[i].lm;
      view_d_[i].token_budget = config_.decode.token_budget;
    }
    for (size_t i = 0; i < view_c_.size(); ++i) {
      view_c_[i].latency_model = engines_[num_decode_ + i].lm;
      view_c_[i].token_budget = config_.colocated.token_budget;
    }
  }
  latest_p_.resize(prefill_.size());
  latest_e_.resize(engines_.size());
  taken_in_p_.assign(prefill_.size(), 0);
  taken_in_e_.assign(engines_.size(), 0);
  placed_p_.resize(prefill_.size());
  placed_e_.resize(engines_.size());
  incoming_e_.resize(engines_.size());
  residents_e_.resize(engines_.size());
  for (size_t p = 0; p < prefill_.size(); ++p) PublishPrefill(static_cast<int>(p));
  for (size_t e = 0; e < engines_.size(); ++e) PublishEngine(static_cast<int>(e));

  reqs_.resize(requests_.size());
  for (size_t i = 0; i < requests_.size(); ++i) {
    const WorkloadRequest& w = requests_[i];
    if (w.prompt_tokens < 1)
      return InvalidArgument("request " + std::to_string(w.id) +
                             " has no known prompt length (prompt_tokens " +
                             std::to_string(w.prompt_tokens) + ")");
    Req& r = reqs_[i];
    r.prompt = w.prompt_tokens;
    r.max_tokens = std::max(1, w.max_tokens);
    r.arrival = w.arrival_s;
    Push(w.arrival_s, EventType::kArrival, -1, static_cast<int64_t>(i));
    last_arrival_ = std::max(last_arrival_, w.arrival_s);
  }
  if (options_.load_report_interval_s > 0 && !requests_.empty())
    Push(options_.load_report_interval_s, EventType::kReportTick, -1, 0);
  return Status();
}

StatusOr<SimulationResult> Simulation::Run() {
  TANDEM_RETURN_IF_ERROR(Setup());
  while (!events_.empty()) {
    Event ev = events_.top();
    events_.pop();
    now_ = ev.t;
    switch (ev.type) {
      case EventType::kArrival:
        OnArrival(ev.a);
        break;
      case EventType::kPrefillDone:
        OnPrefillDone(ev.instance);
        break;
      case EventType::kPrefillWake:
        prefill_[ev.instance].wake_at = -1;
        RunPrefill(ev.instance);
        break;
      case EventType::kPrefillKick:
        prefill_[ev.instance].kicked = false;
        RunPrefill(ev.instance);
        break;
      case EventType::kPullDone:
        OnPullDone(ev.instance, ev.a);
        break;
      case EventType::kStepDone:
        OnStepDone(ev.instance, static_cast<int>(ev.a));
        break;
      case EventType::kEngineWake:
        engines_[ev.instance].wake_at = -1;
        RunEngine(ev.instance);
        break;
      case EventType::kEngineKick:
        engines_[ev.instance].kicked = false;
        RunEngine(ev.instance);
        break;
      case EventType::kReportTick:
        OnReportTick();
        break;
    }
  }
  SimulationResult result;
  double first = std::numeric_limits<double>::infinity(), last = 0;
  for (size_t i = 0; i < reqs_.size(); ++i) {
    const Req& r = reqs_[i];
    RequestOutcome o;
    o.id = requests_[i].id;
    o.arrival_s = r.arrival;
    o.prompt_tokens = r.prompt;
    o.output_tokens = r.generated;
    o.rejected = r.rejected;
    o.ok = r.ok;
    o.error = r.finished ? r.error : "not finished when the simulation ended";
    if (r.first_token >= 0) o.ttft_s = r.first_token - r.arrival + options_.router_overhead_s;
    if (r.last_token >= 0) {
      o.e2e_s = r.last_token - r.arrival + options_.router_overhead_s;
      last = std::max(last, r.last_token);
    }
    o.tpot_s = r.ok ? TpotSeconds(o.e2e_s, o.ttft_s, o.output_tokens) : 0;
    if (r.colocated >= 0) {
      o.placed_on = view_c_[r.colocated - num_decode_].name;
    } else if (r.prefill >= 0 && r.decode >= 0) {
      o.placed_on = view_p_[r.prefill].name + " + " + view_d_[r.decode].name;
    }
    first = std::min(first, r.arrival);
    result.outcomes.push_back(std::move(o));
  }
  result.makespan_s = reqs_.empty() ? 0 : std::max(0.0, last - first);
  return result;
}

// ---- router ----

void Simulation::OnArrival(int64_t id) {
  Req& r = reqs_[id];
  r.arrival_index = arrival_times_.size();
  arrival_times_.push_back(r.arrival);
  PlacementInput input;
  input.prefill = &view_p_;
  input.decode = &view_d_;
  input.colocated = &view_c_;
  input.prompt_tokens = r.prompt;
  input.max_tokens = r.max_tokens;
  input.slo = slo_;
  input.round_robin = round_robin_++;
  if (policy_ == PlacementPolicy::kGoodput) {  // the only policy that reads them
    for (int e = 0; e < num_decode_; ++e) ObserveResidents(view_d_[e], e, r.max_tokens);
    for (size_t k = 0; k < view_c_.size(); ++k)
      ObserveResidents(view_c_[k], num_decode_ + static_cast<int>(k), r.max_tokens);
  }
  StatusOr<Placement> placement = Place(policy_, input);
  if (!placement.ok()) {
    r.rejected = placement.status().code() == StatusCode::kResourceExhausted;
    Fail(id, placement.status().message());
    return;
  }
  // The router's own increments (router/placement.h AddUnreported*).
  if (placement->colocated >= 0) {
    r.colocated = num_decode_ + placement->colocated;
    AddUnreportedSubmit(view_c_[placement->colocated].load, r.prompt, /*colocated=*/true);
    placed_e_[r.colocated].push_back(id);
    if (policy_ == PlacementPolicy::kGoodput) residents_e_[r.colocated].push_back(id);
  } else {
    r.prefill = placement->prefill;
    r.decode = placement->decode;
    AddUnreportedSubmit(view_p_[r.prefill].load, r.prompt, /*colocated=*/false);
    AddUnreportedHandoff(view_d_[r.decode].load, r.prompt, block_size_);
    placed_p_[r.prefill].push_back(id);
    incoming_e_[r.decode].push_back(id);
    if (policy_ == PlacementPolicy::kGoodput) residents_e_[r.decode].push_back(id);
  }

  const int64_t total = int64_t{r.prompt} + r.max_tokens;
  if (total > config_.model.max_model_len) {
    Fail(id, "prompt + max_tokens exceeds max_model_len " +
                 std::to_string(config_.model.max_model_len));
    return;
  }
  if (r.colocated >= 0) {
    EngineInstance& e = engines_[r.colocated];
    if (BlocksForTokens(total, block_size_) > e.total_blocks) {
      Fail(id, "request needs more KV blocks than the instance has");
      return;
    }
    AddToEngine(r.colocated, id, /*pulled=*/false);
    // reports_after_steps: the engine publishes after the step this request starts (or at once
    // when none starts: RunEngine).
    if (!options_.reports_after_steps) PublishEngine(r.colocated);
    TryEngine(r.colocated);
    return;
  }
  PrefillInstance& p = prefill_[r.prefill];
  if (BlocksForTokens(r.prompt, block_size_) > p.total_blocks) {
    Fail(id, "prompt needs more KV blocks than the instance has");
    return;
  }
  p.queue.push_back(id);
  p.queued_tokens += r.prompt;
  if (!options_.reports_after_steps) PublishPrefill(r.prefill);  // else as for colocated
  TryPrefill(r.prefill);
}

// As router/cluster_backend.cc Submit(): the router's residents of engine instance e, and the
// moving average of what arrivals found there.
void Simulation::ObserveResidents(InstanceLoad& view, int e, int32_t arriving_max_tokens) {
  std::erase_if(residents_e_[e], [&](int64_t id) { return reqs_[id].finished; });
  view.residents.clear();
  for (int64_t id : residents_e_[e]) {
    const Req& q = reqs_[id];
    view.residents.push_back(ResidentOf(q.prompt, q.max_tokens, q.generated));
  }
  view.residents_known = true;
  view.typical.Observe(view.residents, arriving_max_tokens);
}

void Simulation::Fail(int64_t id, const std::string& error) {
  Req& r = reqs_[id];
  r.finished = true;
  r.ok = false;
  r.error = error;
  if (r.last_token < 0 && r.first_token >= 0) r.last_token = r.first_token;
}

void Simulation::Complete(int64_t id) {
  Req& r = reqs_[id];
  r.finished = true;
  r.ok = true;
}

void Simulation::EmitToken(int64_t id) {
  Req& r = reqs_[id];
  r.generated += 1;
  if (r.first_token < 0) r.first_token = now_;
  r.last_token = now_;
}

void Simulation::ApplyReport(InstanceLoad& view, const LoadReport& report, size_t taken_in,
                             std::vector<int64_t>& placed, std::vector<int64_t>* incoming,
                             bool colocated) {
  view.load = report;
  std::erase_if(
      placed, [&](int64_t id) { return reqs_[id].arrival_index < taken_in || reqs_[id].finished; });
  for (int64_t id : placed) AddUnreportedSubmit(view.load, reqs_[id].prompt, colocated);
  if (incoming == nullptr) return;
  std::erase_if(*incoming,
                [&](int64_t id) { return reqs_[id].first_token >= 0 || reqs_[id].finished; });
  for (int64_t id : *incoming) AddUnreportedHandoff(view.load, reqs_[id].prompt, block_size_);
}

void Simulation::OnReportTick() {
  for (size_t p = 0; p < prefill_.size(); ++p) ApplyPrefillReport(static_cast<int>(p));
  for (size_t e = 0; e < engines_.size(); ++e) ApplyEngineReport(static_cast<int>(e));
  // After the last arrival nobody reads the view: stop ticking so that the run ends.
  if (now_ < last_arrival_)
    Push(now_ + options_.load_report_interval_s, EventType::kReportTick, -1, 0);
}

}  // namespace simulator

SimulationOptions ServerLikeSimulationOptions() {
  SimulationOptions o;
  o.load_report_interval_s = 0.1;  // the servers' report timer
  o.reports_after_steps = true;
  return o;
}

StatusOr<SimulationResult> Simulate(const ClusterConfig& config, const LatencyModelFile& models,
                                    const std::vector<WorkloadRequest>& requests,
                                    const SimulationOptions& options) {
  simulator::Simulation simulation(config, models, requests, options);
  return simulation.Run();
}

}  // namespace tandem
