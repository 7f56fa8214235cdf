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
//              what the servers' PublishLoad() computes, including the moving averages (weight
//              0.2) of the measured (here: simulated) step times. load_report_interval_s > 0:
//              reports reach the router every interval; 0: after every change. With
//              router.latency_model set, the router predicts from the simulated instances' own
//              entries (a router whose latency model is exact) and token budgets.
//              reports_after_steps: a pp 1 instance publishes only when its engine loop does,
//              after a step (or a loop turn that scheduled nothing), from the state it knew when
//              the step began: requests that arrived during a step are missing from that report
//              (they sat in the inbox; the router adds them back), and a report sent while a
//              step runs is the one from before the step.
//   prefill    prefill/prefill_server.cc Step(): SchedulePrefill (the real function) over the
//              FCFS queue, blocks for the whole prompt at its first chunk, first token at the
//              end of the batch that computes the prompt's last chunk (TTFT ends there), KV
//              held until the decode instance has pulled it. kv_blocks 0 = the servers'
//              formula ceil(max_model_len / block_size) * max_batch_size.
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
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <queue>
#include <string>

#include "common/engine/kv_cache.h"
#include "common/base/flags.h"
#include "decode/colocated_scheduler.h"
#include "decode/decode_scheduler.h"
#include "prefill/prefill_scheduler.h"
#include "router/placement.h"

namespace tandem {
namespace {

constexpr double kAverageWeight = 0.2;  // the servers' moving averages (LoadReport)

void Average(double* avg, double sample) {
  *avg = *avg == 0 ? sample : (1 - kAverageWeight) * *avg + kAverageWeight * sample;
}


enum class EventType : uint8_t {
  kArrival,
  kPrefillDone,
  kPrefillWake,
  kPrefillKick,
  kPullDone,
  kStepDone,
  kEngineWake,
  kEngineKick,
  kReportTick,
};

struct Event {
  double t;
  uint64_t seq;
  EventType type;
  int32_t instance;
  int64_t a;  // request id or lane
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

// Per-request state. A request is in at most one engine at a time, so the engine-side
// sequence state lives here too.
struct Req {
  int32_t prompt = 0;
  int32_t max_tokens = 0;
  double arrival = 0;
  size_t arrival_index = 0;  // order in which the router handled it
  int prefill = -1, decode = -1, colocated = -1;
  // prefill side
  int32_t scheduled = 0;  // prompt tokens handed to a batch
  int32_t prefill_blocks = 0;
  // engine side
  int32_t num_tokens = 0, num_computed = 0, num_blocks = 0;
  double pull_arrived = 0;  // KvReady reached the decode instance
  double last_pass_s = 0;   // the prefill pass that computed the prompt's last chunk
  // outcome
  int32_t generated = 0;
  double first_token = -1;
  double last_token = -1;
  bool finished = false, ok = false, rejected = false;
  std::string error;
};

struct PrefillBatch {
  double done_at = 0;
  double seconds = 0;
  int64_t tokens = 0;
  std::vector<std::pair<int64_t, int32_t>> chunks;  // request, new tokens
};

struct PrefillInstance {
  const LatencyModel* lm = nullptr;
  int pp = 1;
  PrefillLimits limits;
  int32_t total_blocks = 0, free_blocks = 0;
  std::deque<int64_t> queue;  // FCFS, until the prompt's last chunk is done
  std::deque<PrefillBatch> in_flight;
  double stage_free_at = 0;
  double wake_at = -1;
  bool kicked = false;
  int64_t queued_tokens = 0;  // prompt tokens not yet computed (as PublishLoad counts them)
  double avg_s_per_token = 0;
  // scratch
  std::vector<PrefillItem> items;
  std::vector<int64_t> item_ids;
};

struct Lane {
  std::vector<int64_t> running;  // admission order, oldest first
  std::deque<int64_t> waiting;   // FCFS, preempted ones at the front
  bool busy = false;
  double started_at = 0;  // of the step in flight
  std::vector<std::pair<int64_t, int32_t>> batch;  // the step in flight
  double seconds = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_batch = 0;  // sequences of a step without prompt work, and their context
  double decode_context = 0;
};

struct EngineInstance {
  bool colocated = false;
  const LatencyModel* lm = nullptr;
  int pp = 1;
  StepLimits limits;
  PullLimits pull_limits;
  double pull_expiry_s = 0;
  int32_t total_blocks = 0, free_blocks = 0;
  std::vector<Lane> lanes;
  std::deque<int64_t> pull_queue;
  int32_t pulling = 0;
  double stage_free_at = 0;
  double wake_at = -1;
  bool kicked = false;
  double avg_decode_step_s = 0, avg_prefill_s_per_token = 0;
  double avg_decode_batch = 0, avg_decode_context = 0;  // of the steps in avg_decode_step_s
  // scratch
  std::vector<SeqState> running_state, waiting_state;
  std::vector<int64_t> chunk_new, chunk_past;
  std::vector<int32_t> needs;
};

const LatencyModel* FindEntry(const LatencyModelFile& models, const InstanceSection& s,
                              const std::string& role) {
  return models.ForInstance(s.device, s.threads, s.tensor_parallel, s.pipeline_parallel, role);
}

class Simulation {
 public:
  Simulation(const ClusterConfig& config, const LatencyModelFile& models,
             const std::vector<WorkloadRequest>& requests, const SimulationOptions& options)
      : config_(config), models_(models), requests_(requests), options_(options) {}

  StatusOr<SimulationResult> Run();

 private:
  Status Setup();
  int32_t ResolveBlocks(const InstanceSection& s) const {
    int bs = config_.kv_cache.block_size;
    return s.kv_blocks > 0 ? s.kv_blocks
                           : ((config_.model.max_model_len + bs - 1) / bs) * s.max_batch_size;
  }
  void Push(double t, EventType type, int32_t instance, int64_t a) {
    events_.push(Event{t, next_seq_++, type, instance, a});
  }

  void OnArrival(int64_t id);
  void Fail(int64_t id, const std::string& error);
  void Complete(int64_t id);
  void EmitToken(int64_t id);

  // Try*: the instance looks for work once the events of this instant are handled (the servers
  // drain their inbox before a step, so simultaneous arrivals share a batch). Run*: now.
  void TryPrefill(int p);
  void RunPrefill(int p);
  void OnPrefillDone(int p);
  // seen_before: requests that reached the instance after this time are not in the report
  // (reports_after_steps: they arrived during the step that just ended).
  void PublishPrefill(int p, double seen_before = std::numeric_limits<double>::infinity());

  void HandOff(int64_t id);
  void AdmitPulls(int e);
  void OnPullDone(int e, int64_t id);
  void TryEngine(int e);
  void RunEngine(int e);
  bool StartStep(int e, int lane);
  void OnStepDone(int e, int lane);
  void PublishEngine(int e, double seen_before = std::numeric_limits<double>::infinity());
  // reports_after_steps and a pp 1 instance inside a step: its report does not change now.
  bool Stepping(const PrefillInstance& p) const {
    return options_.reports_after_steps && p.pp == 1 && !p.in_flight.empty();
  }
  bool Stepping(const EngineInstance& e) const {
    return options_.reports_after_steps && e.pp == 1 && e.lanes[0].busy;
  }
  void AddToEngine(int e, int64_t id, bool pulled);

  void OnReportTick();
  double TransferSeconds(int64_t id) const;

  const ClusterConfig& config_;
  const LatencyModelFile& models_;
  const std::vector<WorkloadRequest>& requests_;
  SimulationOptions options_;
  PlacementPolicy policy_ = PlacementPolicy::kGoodput;
  SloTarget slo_;
  int32_t block_size_ = 16;

  std::vector<Req> reqs_;
  std::vector<PrefillInstance> prefill_;
  std::vector<EngineInstance> engines_;  // decode instances first, then colocated
  int num_decode_ = 0;
  // The router's view (InstanceLoad per instance) and the instances' latest reports.
  std::vector<InstanceLoad> view_p_, view_d_, view_c_;
  std::vector<LoadReport> latest_p_, latest_e_;
  // Mirrors router/cluster_backend.cc's pending lists: per instance, the time up to which its
  // latest report took requests in (the analogue of LoadReport::last_submit_seq: how many
  // arrivals, in the router's order), the requests placed on it as first instance, and (decode)
  // the requests placed on it whose prefill has not finished. The view = the report + those the
  // report lacks.
  std::vector<double> arrival_times_;  // of the requests the router has handled, in order
  std::vector<size_t> taken_in_p_, taken_in_e_;
  size_t TakenIn(double seen_before) const {
    return static_cast<size_t>(
        std::upper_bound(arrival_times_.begin(), arrival_times_.end(), seen_before) -
        arrival_times_.begin());
  }
  std::vector<std::vector<int64_t>> placed_p_, placed_e_, incoming_e_;
  // Per engine instance: the requests the router placed there and has not seen finish (the
  // router's residents, router/placement.h DecodeResident).
  std::vector<std::vector<int64_t>> residents_e_;
  void ObserveResidents(InstanceLoad& view, int e, int32_t arriving_max_tokens);
  InstanceLoad RouterView(std::string name) const;  // an instance the router starts with
  void ApplyReport(InstanceLoad& view, const LoadReport& report, size_t taken_in,
                   std::vector<int64_t>& placed, std::vector<int64_t>* incoming, bool colocated);
  void ApplyPrefillReport(int pi) {
    ApplyReport(view_p_[pi], latest_p_[pi], taken_in_p_[pi], placed_p_[pi], nullptr, false);
  }
  void ApplyEngineReport(int ei) {
    const bool colocated = engines_[ei].colocated;
    ApplyReport(colocated ? view_c_[ei - num_decode_] : view_d_[ei], latest_e_[ei], taken_in_e_[ei],
                placed_e_[ei], colocated ? nullptr : &incoming_e_[ei], colocated);
  }
  uint64_t round_robin_ = 0;
  double last_arrival_ = 0;

  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t next_seq_ = 0;
  double now_ = 0;
};

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
      p.total_blocks = p.free_blocks = ResolveBlocks(ps);
      prefill_.push_back(std::move(p));
      view_p_.push_back(RouterView("prefill-" + std::to_string(i)));
    }
    const InstanceSection& ds = config_.decode;
    for (int i = 0; i < ds.instances; ++i) {
      EngineInstance e;
      e.lm = dm;
      e.pp = std::max(1, ds.pipeline_parallel);
      e.limits = StepLimits{ds.token_budget, ds.max_batch_size, block_size_};
      e.total_blocks = e.free_blocks = ResolveBlocks(ds);
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
      e.total_blocks = e.free_blocks = ResolveBlocks(cs);
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
      case EventType::kArrival: OnArrival(ev.a); break;
      case EventType::kPrefillDone: OnPrefillDone(ev.instance); break;
      case EventType::kPrefillWake:
        prefill_[ev.instance].wake_at = -1;
        RunPrefill(ev.instance);
        break;
      case EventType::kPrefillKick:
        prefill_[ev.instance].kicked = false;
        RunPrefill(ev.instance);
        break;
      case EventType::kPullDone: OnPullDone(ev.instance, ev.a); break;
      case EventType::kStepDone: OnStepDone(ev.instance, static_cast<int>(ev.a)); break;
      case EventType::kEngineWake:
        engines_[ev.instance].wake_at = -1;
        RunEngine(ev.instance);
        break;
      case EventType::kEngineKick:
        engines_[ev.instance].kicked = false;
        RunEngine(ev.instance);
        break;
      case EventType::kReportTick: OnReportTick(); break;
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
  std::erase_if(placed, [&](int64_t id) {
    return reqs_[id].arrival_index < taken_in || reqs_[id].finished;
  });
  for (int64_t id : placed) AddUnreportedSubmit(view.load, reqs_[id].prompt, colocated);
  if (incoming == nullptr) return;
  std::erase_if(*incoming, [&](int64_t id) { return reqs_[id].first_token >= 0 || reqs_[id].finished; });
  for (int64_t id : *incoming) AddUnreportedHandoff(view.load, reqs_[id].prompt, block_size_);
}

void Simulation::OnReportTick() {
  for (size_t p = 0; p < prefill_.size(); ++p) ApplyPrefillReport(static_cast<int>(p));
  for (size_t e = 0; e < engines_.size(); ++e) ApplyEngineReport(static_cast<int>(e));
  // After the last arrival nobody reads the view: stop ticking so that the run ends.
  if (now_ < last_arrival_) Push(now_ + options_.load_report_interval_s, EventType::kReportTick, -1, 0);
}

// ---- prefill ----

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
  r.prefill_seconds_per_token = p.avg_s_per_token;
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
  if (batch.empty()) {  // waiting for blocks (decode has not pulled yet) or all in flight
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
    if (r.scheduled == r.prompt && !std::any_of(p.in_flight.begin(), p.in_flight.end(),
                                                [&](const PrefillBatch& later) {
                                                  for (auto& c : later.chunks)
                                                    if (c.first == id) return true;
                                                  return false;
                                                }))
      done.push_back(id);
  }
  if (b.tokens > 0) Average(&p.avg_s_per_token, b.seconds / static_cast<double>(b.tokens));
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

// ---- decode / colocated ----

double Simulation::TransferSeconds(int64_t id) const {
  const Req& r = reqs_[id];
  const LatencyModel* lm = prefill_[r.prefill].lm;
  double bytes = static_cast<double>(BlocksForTokens(r.prompt, block_size_)) * block_size_ *
                 lm->kv_bytes_per_token;
  double seconds = models_.transfer.Seconds(bytes);
  // transfer.layerwise: the layers stream while prefill's last pass computes them, so a pull
  // that starts as the request is handed off has only what that pass did not cover left.
  if (StreamsLayerwise(config_.transfer) && now_ <= r.pull_arrived)
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
  while (!e.pull_queue.empty() && now_ - reqs_[e.pull_queue.front()].pull_arrived >= e.pull_expiry_s) {
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
    Average(&e.avg_prefill_s_per_token, lane.seconds / static_cast<double>(lane.prefill_tokens));
  else {
    Average(&e.avg_decode_step_s, lane.seconds);
    Average(&e.avg_decode_batch, static_cast<double>(lane.decode_batch));
    Average(&e.avg_decode_context, lane.decode_context);
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
  r.prefill_seconds_per_token = e.avg_prefill_s_per_token;
  r.decode_step_seconds = e.avg_decode_step_s;
  r.decode_forward_seconds = e.avg_decode_step_s;  // a simulated step is its forward pass
  r.decode_step_batch = e.avg_decode_batch;
  r.decode_step_context_tokens = e.avg_decode_context;
  taken_in_e_[ei] = TakenIn(seen_before);
  if (options_.load_report_interval_s <= 0) ApplyEngineReport(ei);
}

// ---- the command ----

std::string Fmt(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

}  // namespace

SimulationOptions ServerLikeSimulationOptions() {
  SimulationOptions o;
  o.load_report_interval_s = 0.1;  // the servers' report timer
  o.reports_after_steps = true;
  return o;
}

StatusOr<SimulationResult> Simulate(const ClusterConfig& config, const LatencyModelFile& models,
                                    const std::vector<WorkloadRequest>& requests,
                                    const SimulationOptions& options) {
  Simulation simulation(config, models, requests, options);
  return simulation.Run();
}

std::string FormatRunSummary(const RunSummary& s, const Slo& slo) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "requests %lld  completed %lld  rejected %lld  failed %lld  duration %.2f s\n",
                static_cast<long long>(s.requests), static_cast<long long>(s.completed),
                static_cast<long long>(s.rejected), static_cast<long long>(s.failed),
                s.duration_s);
  out += line;
  std::snprintf(line, sizeof line, "throughput %.3f req/s  %.1f output tokens/s\n",
                s.throughput_rps, s.output_tokens_per_s);
  out += line;
  std::snprintf(line, sizeof line, "%-10s %10s %10s %10s\n", "latency", "p50", "p90", "p99");
  out += line;
  auto row = [&](const char* name, double a, double b, double c) {
    std::snprintf(line, sizeof line, "%-10s %10.4f %10.4f %10.4f\n", name, a, b, c);
    out += line;
  };
  row("ttft_s", s.ttft_p50, s.ttft_p90, s.ttft_p99);
  row("tpot_s", s.tpot_p50, s.tpot_p90, s.tpot_p99);
  row("e2e_s", s.e2e_p50, s.e2e_p90, s.e2e_p99);
  std::snprintf(line, sizeof line,
                "SLO ttft %.3f s, tpot %.3f s: attainment %.1f%% (ttft %.1f%%, tpot %.1f%%)\n",
                slo.ttft_s, slo.tpot_s, 100 * s.attainment, 100 * s.ttft_attainment,
                100 * s.tpot_attainment);
  out += line;
  return out;
}

int SimulateMain(const std::vector<std::string>& args) {
  FlagParser flags(
      "tandem simulate --config CLUSTER.yaml --latency-model LM.yaml (--workload NAME --rate R "
      "--num-requests N --seed S | --trace FILE.jsonl) [--out FILE.json]",
      "Simulates the cluster (router placement, prefill/decode/colocated scheduling) on a "
      "workload with step times from a latency model; prints the run summary and writes "
      "per-request outcomes.");
  flags.AddString("config", "", "cluster YAML (absent: defaults)");
  flags.AddString("latency-model", "", "latency model YAML (tandem profile, cluster/gpu/*.yaml)");
  flags.AddString("workload", "chatbot", WorkloadNameList() + " (ignored with --trace)");
  flags.AddDouble("rate", 1.0, "requests/s, Poisson (<= 0: all at t = 0)");
  flags.AddInt("num-requests", 100, "requests to generate");
  flags.AddInt("seed", 1, "workload seed");
  flags.AddInt("max-model-len", 0, "length budget of generated requests (0: model.max_model_len)");
  flags.AddString("trace", "", "JSON Lines trace instead of a synthetic workload");
  flags.AddString("out", "", "write {\"summary\", \"requests\"} JSON here");
  flags.AddDouble("router-overhead-s", 0.0, "added to every TTFT");
  flags.AddDouble("load-report-interval-s", 0.1,
                  "instances report load this often (0: the router sees the exact state)");
  flags.AddBool("reports-at-once",
                "instances publish every change at once (default: after each step, from the "
                "state they knew when it began, as the servers' engine loops do)");
  flags.AddDouble("decode-time-scale", 1.0,
                  "decode runs at this multiple of the latency model's time, prefill as modelled "
                  "(a machine that decodes faster or slower than its profile; the router keeps "
                  "the unscaled model)");
  flags.AllowConfigOverrides();
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "tandem simulate: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (!(flags.GetDouble("decode-time-scale") > 0)) {
    std::fprintf(stderr, "tandem simulate: --decode-time-scale must be > 0, got %g\n",
                 flags.GetDouble("decode-time-scale"));
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (flags.GetString("latency-model").empty()) {
    std::fprintf(stderr, "tandem simulate: --latency-model is required\n");
    return kExitUsage;
  }
  StatusOr<ClusterConfig> config =
      flags.IsSet("config") ? LoadConfig(flags.GetString("config"), flags.config_overrides())
                            : ParseConfig("", "<defaults>", flags.config_overrides());
  if (!config.ok()) {
    std::fprintf(stderr, "tandem simulate: %s\n", config.status().message().c_str());
    return kExitFailure;
  }
  StatusOr<LatencyModelFile> models = LoadLatencyModel(flags.GetString("latency-model"));
  if (!models.ok()) {
    std::fprintf(stderr, "tandem simulate: %s\n", models.status().message().c_str());
    return kExitFailure;
  }
  std::vector<WorkloadRequest> requests;
  std::string what;
  if (!flags.GetString("trace").empty()) {
    StatusOr<std::vector<WorkloadRequest>> trace = LoadTrace(flags.GetString("trace"));
    if (!trace.ok()) {
      std::fprintf(stderr, "tandem simulate: %s\n", trace.status().message().c_str());
      return kExitFailure;
    }
    requests = std::move(*trace);
    what = "trace " + flags.GetString("trace");
  } else {
    StatusOr<WorkloadShape> shape = WorkloadShapeByName(flags.GetString("workload"));
    if (!shape.ok()) {
      std::fprintf(stderr, "tandem simulate: %s\n", shape.status().message().c_str());
      return kExitUsage;
    }
    WorkloadOptions wo;
    wo.rate = flags.GetDouble("rate");
    wo.num_requests = flags.GetInt("num-requests");
    wo.seed = static_cast<uint64_t>(flags.GetInt("seed"));
    wo.max_model_len = flags.GetInt("max-model-len") > 0
                           ? static_cast<int32_t>(flags.GetInt("max-model-len"))
                           : config->model.max_model_len;
    requests = GenerateWorkload(*shape, wo);
    what = shape->name + " at " + Fmt("%g", wo.rate) + " req/s";
  }
  SimulationOptions options;
  options.router_overhead_s = flags.GetDouble("router-overhead-s");
  options.load_report_interval_s = flags.GetDouble("load-report-interval-s");
  options.reports_after_steps = !flags.GetBool("reports-at-once");
  options.decode_time_scale = flags.GetDouble("decode-time-scale");
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<SimulationResult> result = Simulate(*config, *models, requests, options);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!result.ok()) {
    std::fprintf(stderr, "tandem simulate: %s\n", result.status().message().c_str());
    return kExitFailure;
  }
  Slo slo{config->slo.ttft_s, config->slo.tpot_s};
  RunSummary summary = Summarize(result->outcomes, slo);
  std::printf("simulated %zu requests (%s) on %d prefill + %d decode + %d colocated instances "
              "in %.3f s\n",
              requests.size(), what.c_str(), config->prefill.instances, config->decode.instances,
              config->colocated.instances, wall);
  std::fputs(FormatRunSummary(summary, slo).c_str(), stdout);
  if (!flags.GetString("out").empty()) {
    nlohmann::json j;
    j["summary"] = SummaryToJson(summary);
    j["summary"]["slo_ttft_s"] = slo.ttft_s;
    j["summary"]["slo_tpot_s"] = slo.tpot_s;
    j["requests"] = OutcomesToJson(result->outcomes);
    std::ofstream out(flags.GetString("out"));
    out << j.dump(1) << "\n";
    if (!out) {
      std::fprintf(stderr, "tandem simulate: cannot write %s\n", flags.GetString("out").c_str());
      return kExitFailure;
    }
  }
  return kExitOk;
}

}  // namespace tandem
