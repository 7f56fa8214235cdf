// The Simulation behind Simulate() (cluster/simulator.h): its event queue, the state of each
// request and of each simulated instance, and the router's view of them. Internal to the
// simulator's sources: simulator.cc (set-up, event loop, router), simulator_prefill.cc (prefill
// instances), simulator_engine.cc (decode and colocated instances). simulator.cc's header
// comment says what is mirrored from which server.
//
// Single-threaded: one Simulation is run once, by one thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "cluster/simulator.h"
#include "common/base/moving_average.h"
#include "decode/colocated_scheduler.h"
#include "decode/decode_scheduler.h"
#include "prefill/prefill_scheduler.h"
#include "router/placement.h"

namespace tandem::simulator {

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
  int64_t queued_tokens = 0;      // prompt tokens not yet computed (as PublishLoad counts them)
  MovingAverage avg_s_per_token;  // seconds per prompt token of its batches
  // scratch
  std::vector<PrefillItem> items;
  std::vector<int64_t> item_ids;
};

struct Lane {
  std::vector<int64_t> running;  // admission order, oldest first
  std::deque<int64_t> waiting;   // FCFS, preempted ones at the front
  bool busy = false;
  double started_at = 0;                           // of the step in flight
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
  MovingAverage avg_decode_step_s, avg_prefill_s_per_token;
  MovingAverage avg_decode_batch, avg_decode_context;  // of the steps in avg_decode_step_s
  // scratch
  std::vector<SeqState> running_state, waiting_state;
  std::vector<int64_t> chunk_new, chunk_past;
  std::vector<int32_t> needs;
};

class Simulation {
 public:
  Simulation(const ClusterConfig& config, const LatencyModelFile& models,
             const std::vector<WorkloadRequest>& requests, const SimulationOptions& options)
      : config_(config), models_(models), requests_(requests), options_(options) {}

  StatusOr<SimulationResult> Run();

 private:
  Status Setup();
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

}  // namespace tandem::simulator
