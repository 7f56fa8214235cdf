// Placement policies: which prefill/decode pair (or colocated instance) gets a request.
//
// Policies are plain functions of a load snapshot, the prompt length and the SLO: no network,
// no clock, no state beyond a round-robin counter the caller owns. The router's ClusterBackend
// builds the snapshot from the instances' LoadReports (plus what it submitted since the last
// report) and calls Place() for every request.
//
//   round_robin   the next usable instance of each kind, in turn
//   least_loaded  prefill with the fewest queued prompt tokens, decode with the fewest requests
//   goodput       (default) predicts TTFT on each prefill and TPOT on each decode, keeps the
//                 pair that meets both SLOs with the most headroom, rejects (ResourceExhausted,
//                 429) when none does. A request that not even an idle pair could serve within
//                 the SLO is placed anyway on the best pair: retrying later would not help.
//                 Colocated instances are ranked also by the decodes the new prompt's
//                 prefill would stall there (PredictStalledResidentTpotSeconds).
//                 Predictions come from the instance's latency model (common/engine/latency_model.h,
//                 `router.latency_model`) when it has one, its decode steps corrected by the
//                 step times the instance measures (DecodeModelCorrection), else from its
//                 measured averages.
//
// When P/D pairs exist they are used; colocated instances are used only when there is no usable
// pair. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/config/config.h"
#include "common/net/control_wire.h"
#include "common/engine/latency_model.h"
#include "common/base/moving_average.h"
#include "common/base/status.h"
#include "router/backend.h"

namespace tandem {

enum class PlacementPolicy { kGoodput, kLeastLoaded, kRoundRobin };

// "goodput" | "least_loaded" | "round_robin"; InvalidArgument naming the value otherwise.
StatusOr<PlacementPolicy> ParsePlacementPolicy(std::string_view name);
const char* PlacementPolicyName(PlacementPolicy policy);

// Before an instance has measured anything (LoadReport fields 0), the predictions use these.
inline constexpr double kDefaultPrefillSecondsPerToken = 0.0005;
inline constexpr double kDefaultDecodeStepSeconds = 0.02;

// A request a decode (or colocated) instance holds, as the router knows it: it has placed it
// there and streams its tokens.
struct DecodeResident {
  int64_t context_tokens = 0;  // prompt + tokens generated so far
  int32_t decode_steps = 0;    // decode steps it still has: max_tokens - max(generated, 1)
  bool decoding = false;       // its first token has come (else: its prompt is still queued
                               // or prefilling, and its decode steps have not begun)
  int32_t life_steps = 0;      // decode steps in all: max_tokens - 1 (0 = take decode_steps)
};
// A request with this prompt and max_tokens that has received `generated` tokens (the router
// and the simulated router build their residents with it).
DecodeResident ResidentOf(int64_t prompt_tokens, int32_t max_tokens, int32_t generated);

// What arriving requests found decoding on an instance, and how long their decode lasts, as
// moving averages over arrivals (weight kResidentAverageWeight). Arrivals at random times
// (Poisson) see the time average (PASTA), idle time included: the population the requests
// that arrive later will build up again. The router and the simulator call Observe for every
// decode and colocated instance at every request they are asked to place, before Place().
inline constexpr double kResidentAverageWeight = 0.1;
struct ResidentAverage {
  MovingAverage requests{kResidentAverageWeight};        // decoding residents
  MovingAverage context_tokens{kResidentAverageWeight};  // their summed context
  // Decode steps of an arriving request (its max_tokens - 1).
  MovingAverage decode_steps{kResidentAverageWeight};
  void Observe(const std::vector<DecodeResident>& residents, int32_t arriving_max_tokens);
};

// One instance as placement sees it.
struct InstanceLoad {
  std::string name;        // "prefill-1", for messages
  bool usable = false;     // connected, greeted, heartbeat fresh
  LoadReport load;         // the latest report, plus the router's own submissions since
  int32_t kv_block_size = 0;  // from Hello; 0 = unknown (no KV-block check)
  // A decode candidate needs free blocks for the prompt + 1 token, else it would queue the pull.
  // The latency model entry of this instance's shape; not owned (the caller keeps it alive for
  // the Place() call); null = predict from the measured averages in `load`.
  const LatencyModel* latency_model = nullptr;
  int32_t token_budget = 0;  // tokens per prefill batch (prefill/colocated); 0 = one batch
  // Decode/colocated: every request this router has placed here and not seen finish (known =
  // the caller filled it; the simulator and the router do). Lets TPOT predictions see when the
  // batch will shrink.
  bool residents_known = false;
  std::vector<DecodeResident> residents;  // in the order they were placed
  ResidentAverage typical;  // what arriving requests found here lately
};

// The SLO of a request class: the class in `slo.classes` named `slo_class`, else the defaults
// (slo.ttft_s, slo.tpot_s). An unknown class name falls back to the defaults here; the router
// refuses one before placement (ClusterBackend::CheckSloClass, 400).
SloTarget SloForClass(const SloSection& slo, std::string_view slo_class);

struct PlacementInput {
  const std::vector<InstanceLoad>* prefill = nullptr;    // not owned; may be null = none
  const std::vector<InstanceLoad>* decode = nullptr;
  const std::vector<InstanceLoad>* colocated = nullptr;
  int64_t prompt_tokens = 0;
  int32_t max_tokens = 0;  // the request's; 0 = unknown (TPOT predicted from the next step)
  SloTarget slo;
  uint64_t round_robin = 0;  // the caller's counter; round_robin uses it modulo the count
};

struct Placement {
  // Indices into the input vectors. Either prefill and decode are set (a pair), or colocated.
  int prefill = -1;
  int decode = -1;
  int colocated = -1;
  double predicted_ttft_s = 0;  // goodput only; 0 otherwise
  double predicted_tpot_s = 0;
};

// Predictions used by goodput (exposed for tests).
// From the measured averages: (queued + prompt) tokens x seconds per token; the decode step
// at running + 1 sequences: before any step was measured, kDefaultDecodeStepSeconds for one
// sequence growing by kDecodeStepGrowthPerSequence of it per sequence; measured at the mean
// batch decode_step_batch, the measured step scaled by the same affine growth from that batch
// to running + 1; measured without a batch (decode_step_batch 0), the measured step scaled by
// (running + 1) / running. The first two grow with `running`, which counts what the router has
// placed since the report, so that a burst on equal instances spreads.
inline constexpr double kDecodeStepGrowthPerSequence = 0.1;
double PredictTtftSeconds(const LoadReport& load, int64_t prompt_tokens);
double PredictTpotSeconds(const LoadReport& load);
// From x.latency_model when set (else the two above). TTFT: the queued prompt tokens and then
// this prompt, cut into prefill batches of x.token_budget tokens (the prefill scheduler's
// chunking); the queue's share of a batch counts as one prompt of that many tokens (the router
// does not know the queued prompts' lengths), this prompt's chunks as chunks with their past.
// Decode TPOT: the mean step over the request's own decode steps (max_tokens - 1 of them: TPOT
// spans the tokens after the first), times DecodeModelCorrection. Its steps begin when its
// first token comes, start_delay_s from now (its predicted TTFT); until then the decoding
// residents run on (start_delay_s / the current step's time steps). At its step s the batch
// is the request itself, plus
//   - the decoding residents that still have steps left then, their contexts grown,
//   - the residents whose prompts are still queued or prefilling, ahead of it (FCFS): they
//     begin decoding before it, as the prefill queue drains at about a constant token rate
//     (x.residents lists them in the order they were placed), and run on until it begins,
//   - the requests that arrive after it, which an FCFS prefill queue lets begin decoding only
//     after it: the typical decoding population (x.typical) times min(1, s / the typical
//     decode steps). For Poisson arrivals that ramp plus the decay of what is decoding at an
//     arrival keep the expected population at the typical one, as it should be.
// The model is linear, so the mean step is the model at the mean batch and context. Without
// residents or max_tokens: one step of running + 1 sequences over context_tokens + prompt
// (pricing a whole life at the current batch + 1 over-predicts when neighbours finish before
// the request's first token). The model's forward pass is compared with the measured forward
// pass only, not with the whole step (sampling and waits for arriving KV are not in a profile).
// Colocated TPOT: the same decode prediction. Its own prefill and the prompts queued ahead of it
// finish before its first token; prompts that arrive later will slow its steps, but placement
// cannot know them, and a chunk of this prompt is not added (the instance serves that within
// the SLO).
double PredictTtftSeconds(const InstanceLoad& x, int64_t prompt_tokens);
double PredictDecodeTpotSeconds(const InstanceLoad& x, int64_t prompt_tokens,
                                int32_t max_tokens = 0, double start_delay_s = 0);
// The latency model's decode steps, corrected by what the instance measures: the ratio of its
// reported moving-average forward pass of a decode step (LoadReport.decode_forward_seconds: the
// part of a step a profile times) to the model's step at the same average batch and context
// (decode_step_batch, decode_step_context_tokens), clamped to [kMinDecodeModelCorrection,
// kMaxDecodeModelCorrection]. An offline
// profile drifts from the machine it serves on (a shared host's speed varies by the hour, a
// neighbour's work changes what a core gets); the measured steps are the instance's truth. 1
// when there is no model or no measured decode step yet. Decode TPOT predictions (decode and
// colocated) are multiplied by it.
double DecodeModelCorrection(const InstanceLoad& x);
inline constexpr double kMinDecodeModelCorrection = 0.25;
inline constexpr double kMaxDecodeModelCorrection = 4.0;
double PredictColocatedTpotSeconds(const InstanceLoad& x, int64_t prompt_tokens,
                                   int32_t max_tokens = 0, double start_delay_s = 0);
// What a new prompt costs the requests a colocated instance already holds: its prefill runs in
// a step that every decoding sequence waits for (a chunk rides in a decode step, or a
// prefill_first step pauses them), so each resident still decoding when it runs takes a stall
// of about the prompt's prefill time, spread over the resident's life. Returns the highest
// TPOT so predicted among the residents it stalls: step_now + stall / life_steps, step_now
// being the current decode step (corrected as above); 0 when it stalls none (no residents known).
// A resident is stalled when it will still be decoding as the prompt's prefill begins
// (ttft_s minus the prompt's own prefill time from now): the residents queued ahead always
// are (FCFS puts their first tokens before it), a decoding one when its remaining steps last
// that long. The goodput policy ranks colocated instances by the smaller of the request's own
// slack and this one's, so that a prompt goes where it stalls the fewest decodes into missing
// their SLO (two colocated instances tied on the request's own predictions would otherwise take
// prompts onto a busy instance beside an idle one); admission (429) still looks at the
// request's own predictions only.
double PredictStalledResidentTpotSeconds(const InstanceLoad& x, int64_t prompt_tokens,
                                         double ttft_s);

// What a placed request adds to an instance's load until one of its reports includes it
// (router/cluster_backend.cc; the simulator mirrors it). First instance (prefill or colocated):
// its prompt is queued, and a colocated one also runs it. Decode instance: it will run the
// request with the prompt as context, in the prompt's blocks (kv_block_size 0 = unknown: no
// block count).
void AddUnreportedSubmit(LoadReport& load, int64_t prompt_tokens, bool colocated);
void AddUnreportedHandoff(LoadReport& load, int64_t prompt_tokens, int32_t kv_block_size);

// Chooses where a request goes. Errors: Unavailable when no usable instance (pair or
// colocated) exists; ResourceExhausted (goodput) when no candidate meets the SLO, with the best
// predictions and a retry hint in the message.
StatusOr<Placement> Place(PlacementPolicy policy, const PlacementInput& input);

}  // namespace tandem
