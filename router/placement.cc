#include "router/placement.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace tandem {

StatusOr<PlacementPolicy> ParsePlacementPolicy(std::string_view name) {
  if (name == "goodput") return PlacementPolicy::kGoodput;
  if (name == "least_loaded") return PlacementPolicy::kLeastLoaded;
  if (name == "round_robin") return PlacementPolicy::kRoundRobin;
  return InvalidArgument("router.policy must be goodput|least_loaded|round_robin, got '" +
                         std::string(name) + "'");
}

const char* PlacementPolicyName(PlacementPolicy policy) {
  switch (policy) {
    case PlacementPolicy::kGoodput: return "goodput";
    case PlacementPolicy::kLeastLoaded: return "least_loaded";
    case PlacementPolicy::kRoundRobin: return "round_robin";
  }
  return "?";
}

SloTarget SloForClass(const SloSection& slo, std::string_view slo_class) {
  if (!slo_class.empty()) {
    for (const SloClass& c : slo.classes) {
      if (c.name == slo_class) return SloTarget{c.ttft_s, c.tpot_s};
    }
  }
  return SloTarget{slo.ttft_s, slo.tpot_s};
}

namespace {

// Without a latency model: the instance's measured prefill time per token, or the default.
double PrefillSecondsPerToken(const LoadReport& load) {
  return load.prefill_seconds_per_token > 0 ? load.prefill_seconds_per_token
                                            : kDefaultPrefillSecondsPerToken;
}

}  // namespace

double PredictTtftSeconds(const LoadReport& load, int64_t prompt_tokens) {
  return static_cast<double>(std::max<int64_t>(load.queued_prefill_tokens, 0) + prompt_tokens) *
         PrefillSecondsPerToken(load);
}

double PredictTpotSeconds(const LoadReport& load) {
  // The step grows with the batch; each prediction is monotone in `running` (which includes
  // what the router has placed there since the report), so that a burst spreads.
  const double running = static_cast<double>(std::max<int32_t>(load.running_requests, 0));
  if (load.decode_step_seconds <= 0)  // nothing measured yet: the default at a batch of one
    return kDefaultDecodeStepSeconds * (1.0 + kDecodeStepGrowthPerSequence * running);
  if (load.decode_step_batch > 0) {  // measured at that mean batch
    return load.decode_step_seconds * (1.0 + kDecodeStepGrowthPerSequence * (running + 1.0)) /
           (1.0 + kDecodeStepGrowthPerSequence * load.decode_step_batch);
  }
  // Measured at the reported batch: one more request scales the step by (running + 1) / running.
  return load.decode_step_seconds * (running + 1.0) / std::max(running, 1.0);
}

double PredictTtftSeconds(const InstanceLoad& x, int64_t prompt_tokens) {
  const LatencyModel* lm = x.latency_model;
  if (lm == nullptr) return PredictTtftSeconds(x.load, prompt_tokens);
  const int64_t queued = std::max<int64_t>(x.load.queued_prefill_tokens, 0);
  const int64_t prompt = std::max<int64_t>(prompt_tokens, 0);
  const int64_t budget = x.token_budget > 0 ? x.token_budget : std::max<int64_t>(queued + prompt, 1);
  // Whole batches of queue first (closed form: a long queue must not cost a long loop).
  const int64_t full = queued / budget;
  const double b = static_cast<double>(budget);
  double seconds = static_cast<double>(full) * lm->PrefillSeconds(b, b * b);
  int64_t queue_left = queued - full * budget;
  int64_t done = 0;  // tokens of this prompt computed so far
  while (queue_left > 0 || done < prompt) {
    int64_t room = budget;
    int64_t news[2], pasts[2];
    size_t n = 0;
    if (queue_left > 0) {
      news[n] = std::min(queue_left, room);
      pasts[n++] = 0;
      room -= news[0];
      queue_left -= news[0];
    }
    if (room > 0 && done < prompt) {
      news[n] = std::min(prompt - done, room);
      pasts[n] = done;
      done += news[n++];
    }
    seconds += lm->MixedStepSeconds({news, n}, {pasts, n}, 0, 0);
  }
  return seconds;
}

double DecodeModelCorrection(const InstanceLoad& x) {
  const LoadReport& load = x.load;
  if (x.latency_model == nullptr || load.decode_forward_seconds <= 0 || load.decode_step_batch <= 0)
    return 1.0;
  // The model is linear in batch and context, so at the averaged batch and context it predicts
  // the average of the steps it is compared with.
  const double predicted =
      x.latency_model->DecodeStepSeconds(load.decode_step_batch, load.decode_step_context_tokens);
  if (!(predicted > 0)) return 1.0;
  return std::clamp(load.decode_forward_seconds / predicted, kMinDecodeModelCorrection,
                    kMaxDecodeModelCorrection);
}

DecodeResident ResidentOf(int64_t prompt_tokens, int32_t max_tokens, int32_t generated) {
  return DecodeResident{prompt_tokens + generated, std::max(max_tokens - std::max(generated, 1), 0),
                        generated > 0, std::max(max_tokens - 1, 1)};
}

namespace {

// How many residents are decoding, and their summed context.
struct DecodingSum {
  double requests = 0;
  double context_tokens = 0;
};

DecodingSum SumDecoding(const std::vector<DecodeResident>& residents) {
  DecodingSum sum;
  for (const DecodeResident& r : residents) {
    if (!r.decoding) continue;
    sum.requests += 1;
    sum.context_tokens += static_cast<double>(r.context_tokens);
  }
  return sum;
}

// The current decode step on x: its decoding residents (at least one sequence) in x.latency_model,
// corrected. The clock by which the residents progress. x.latency_model must be set.
double StepNowSeconds(const InstanceLoad& x) {
  const DecodingSum decoding = SumDecoding(x.residents);
  return x.latency_model->DecodeStepSeconds(std::max(decoding.requests, 1.0),
                                            decoding.context_tokens) *
         DecodeModelCorrection(x);
}

}  // namespace

void ResidentAverage::Observe(const std::vector<DecodeResident>& residents,
                              int32_t arriving_max_tokens) {
  const DecodingSum decoding = SumDecoding(residents);
  const double n = decoding.requests, context = decoding.context_tokens;
  const double steps = std::max(arriving_max_tokens - 1, 1);
  requests.Add(n);
  context_tokens.Add(context);
  // An arrival without max_tokens says nothing of decode lengths (beyond seeding the average).
  if (arriving_max_tokens > 0 || !decode_steps.has_value()) decode_steps.Add(steps);
}

namespace {

// sum of min(1, s / knee) over s = a..b (knee <= 0: all 1).
double RampSum(int64_t a, int64_t b, double knee) {
  if (b < a) return 0;
  if (knee <= 0) return static_cast<double>(b - a + 1);
  double sum = 0;
  const int64_t k = std::min<int64_t>(b, static_cast<int64_t>(std::floor(knee)));
  if (k >= a) sum += static_cast<double>(a + k) * static_cast<double>(k - a + 1) / 2 / knee;
  const int64_t from = std::max(a, k + 1);
  if (b >= from) sum += static_cast<double>(b - from + 1);
  return sum;
}

// The mean batch and summed context over the request's steps 1..steps (see the header).
struct MeanStep {
  double batch = 0;
  double context = 0;
};

MeanStep MeanOverLife(const std::vector<DecodeResident>& residents, const ResidentAverage& typical,
                      int64_t prompt, int64_t steps, double start_delay_s, double step_now_s) {
  // Steps the others take in the start_delay_s before the request's first token.
  auto steps_in = [&](double seconds) -> int64_t {
    if (seconds <= 0 || step_now_s <= 0) return 0;
    return static_cast<int64_t>(std::min(seconds / step_now_s, 1e9));
  };
  // The prompts still ahead of it drain in FCFS order at about a constant token rate: the j-th
  // gets its first token at start_delay_s x (its and earlier prompts' tokens) / (all of them
  // and this prompt's).
  double queued = static_cast<double>(prompt), queued_before = 0;
  for (const DecodeResident& r : residents)
    if (!r.decoding) queued += static_cast<double>(r.context_tokens);
  // Each resident as the request's steps see it: present at steps 1..last, context base + s.
  struct Known {
    int64_t last;
    double base;
  };
  std::vector<Known> known;
  for (const DecodeResident& r : residents) {
    int64_t lead = steps_in(start_delay_s);  // a decoding one runs on during the whole wait
    if (!r.decoding) {
      queued_before += static_cast<double>(r.context_tokens);
      lead = steps_in(start_delay_s * (1.0 - queued_before / queued));
    }
    Known k{r.decode_steps - lead, static_cast<double>(r.context_tokens + lead)};
    if (k.last >= 1) known.push_back(k);
  }
  std::sort(known.begin(), known.end(), [](const Known& a, const Known& b) { return a.last < b.last; });
  double present = static_cast<double>(known.size()), present_base = 0;
  for (const Known& k : known) present_base += k.base;
  double sum_batch = 0, sum_context = 0;
  size_t gone = 0;  // known[0, gone) have left before step s
  // Segments of steps between departures, where the known population is constant and contexts
  // grow by one per step (closed forms: a long life must not cost a long loop).
  for (int64_t s = 1; s <= steps;) {
    while (gone < known.size() && known[gone].last < s) {
      present -= 1;
      present_base -= known[gone].base;
      ++gone;
    }
    const int64_t last = gone < known.size() ? std::min(known[gone].last, steps) : steps;
    const double n = static_cast<double>(last - s + 1);
    const double sum_s = static_cast<double>(s + last) * n / 2;  // s + (s+1) + ... + last
    const double arrived = RampSum(s, last, typical.decode_steps.value());  // later arrivals' share
    sum_batch += n * (1.0 + present) + typical.requests.value() * arrived;
    sum_context += n * static_cast<double>(prompt) + sum_s + n * present_base + present * sum_s +
                   typical.context_tokens.value() * arrived;
    s = last + 1;
  }
  const double count = static_cast<double>(std::max<int64_t>(steps, 1));
  return MeanStep{sum_batch / count, sum_context / count};
}

}  // namespace

double PredictDecodeTpotSeconds(const InstanceLoad& x, int64_t prompt_tokens, int32_t max_tokens,
                                double start_delay_s) {
  if (x.latency_model == nullptr) return PredictTpotSeconds(x.load);
  const LatencyModel& lm = *x.latency_model;
  const double correction = DecodeModelCorrection(x);
  const int64_t prompt = std::max<int64_t>(prompt_tokens, 0);
  if (!x.residents_known || max_tokens <= 0) {
    const int64_t running = std::max<int32_t>(x.load.running_requests, 0);
    const double context = static_cast<double>(std::max<int64_t>(x.load.context_tokens, 0) + prompt);
    return lm.DecodeStepSeconds(running + 1, context) * correction;
  }
  // The current step, the clock of the residents' progress until the request's first token.
  const double step_now = StepNowSeconds(x);
  // max_tokens 1 has no step after the first token; price its one step as a one-step life.
  const int64_t steps = std::max<int64_t>(max_tokens - 1, 1);
  const MeanStep mean =
      MeanOverLife(x.residents, x.typical, prompt, steps, std::max(start_delay_s, 0.0), step_now);
  return lm.DecodeStepSeconds(mean.batch, mean.context) * correction;
}

double PredictColocatedTpotSeconds(const InstanceLoad& x, int64_t prompt_tokens,
                                   int32_t max_tokens, double start_delay_s) {
  // The request's own prefill step ends its TTFT, and the prompts queued ahead of it are
  // prefilled before its first token (FCFS): neither is in its TPOT. What slows its decode
  // steps is prompts that arrive later, which placement cannot know; so the prediction is the
  // decode instance's: the pure decode steps (interference shows up as measured TPOT, and in
  // the simulator).
  return PredictDecodeTpotSeconds(x, std::max<int64_t>(prompt_tokens, 1), max_tokens,
                                  start_delay_s);
}

double PredictStalledResidentTpotSeconds(const InstanceLoad& x, int64_t prompt_tokens,
                                         double ttft_s) {
  if (!x.residents_known || x.residents.empty()) return 0;
  const double prompt = static_cast<double>(std::max<int64_t>(prompt_tokens, 1));
  double step_now = 0, stall = 0;
  if (x.latency_model != nullptr) {
    step_now = StepNowSeconds(x);
    stall = x.latency_model->PrefillSeconds(prompt, prompt * prompt);
  } else {
    step_now = PredictTpotSeconds(x.load);
    stall = prompt * PrefillSecondsPerToken(x.load);
  }
  const double prefill_begins_s = std::max(ttft_s - stall, 0.0);
  double worst = 0;
  for (const DecodeResident& r : x.residents) {
    if (r.decoding && static_cast<double>(r.decode_steps) * step_now <= prefill_begins_s) continue;
    const double life = std::max({r.life_steps, r.decode_steps, 1});
    worst = std::max(worst, step_now + stall / life);
  }
  return worst;
}

void AddUnreportedSubmit(LoadReport& load, int64_t prompt_tokens, bool colocated) {
  load.queued_prefill_tokens += prompt_tokens;
  load.waiting_requests += 1;
  if (colocated) load.running_requests += 1;
}

void AddUnreportedHandoff(LoadReport& load, int64_t prompt_tokens, int32_t kv_block_size) {
  load.running_requests += 1;
  load.context_tokens += prompt_tokens;
  if (kv_block_size > 0) load.free_kv_blocks -= (prompt_tokens + kv_block_size) / kv_block_size;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Blocks a request needs on the decode side to be admitted without waiting.
bool HasBlocksFor(const InstanceLoad& d, int64_t tokens) {
  if (d.load.total_kv_blocks <= 0 || d.kv_block_size <= 0) return true;  // unknown: assume yes
  int64_t needed = (tokens + d.kv_block_size - 1) / d.kv_block_size;
  return d.load.free_kv_blocks >= needed;
}

// Relative slack of a prediction against an objective: 1 = instant, 0 = exactly at the SLO,
// negative = a miss. No objective: +inf (never the binding constraint).
double Slack(double predicted, double objective) {
  if (objective <= 0) return kInf;
  return (objective - predicted) / objective;
}

std::vector<int> Usable(const std::vector<InstanceLoad>* v) {
  std::vector<int> out;
  if (v == nullptr) return out;
  for (size_t i = 0; i < v->size(); ++i)
    if ((*v)[i].usable) out.push_back(static_cast<int>(i));
  return out;
}

bool Idle(const LoadReport& load) {
  return load.queued_prefill_tokens <= 0 && load.running_requests <= 0 &&
         load.waiting_requests <= 0;
}

std::string Seconds(double s) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3f s", s);
  return buffer;
}

struct Scored {
  int index = -1;
  double slack = -kInf;
  double predicted = 0;
  bool idle = false;
  // The request's own slack, which decides admission; `slack` ranks, and for a colocated
  // instance it also counts the residents the request's prefill would stall.
  double own_slack = -kInf;
  double predicted_tpot = 0;  // colocated: the request's TPOT there (`predicted` is its TTFT)
};

// Goodput: the best prefill by TTFT slack and the best decode by TPOT slack. The objective
// min(ttft slack, tpot slack) is monotone in each, so the best pair is (best P, best D).
// Ties go to the earlier candidate after rotating by the round-robin counter, so that equal
// instances share the load.
Scored BestBy(const std::vector<InstanceLoad>& v, const std::vector<int>& usable, uint64_t rr,
              const auto& score) {
  Scored best;
  for (size_t k = 0; k < usable.size(); ++k) {
    int i = usable[(k + rr) % usable.size()];
    Scored s = score(v[i]);
    s.index = i;
    if (best.index < 0 || s.slack > best.slack) best = s;
  }
  return best;
}

StatusOr<Placement> Goodput(const PlacementInput& in, const std::vector<int>& p,
                            const std::vector<int>& d, const std::vector<int>& c) {
  const SloTarget& slo = in.slo;
  int64_t kv_tokens = in.prompt_tokens + 1;
  auto ttft_score = [&](const InstanceLoad& x) {
    double t = PredictTtftSeconds(x, in.prompt_tokens);
    const double slack = Slack(t, slo.ttft_s);
    return Scored{-1, slack, t, Idle(x.load), slack};
  };
  double start_delay_s = 0;  // the chosen prefill's predicted TTFT: when decoding begins
  auto tpot_score = [&](const InstanceLoad& x) {
    double t = PredictDecodeTpotSeconds(x, in.prompt_tokens, in.max_tokens, start_delay_s);
    double slack = HasBlocksFor(x, kv_tokens) ? Slack(t, slo.tpot_s) : -kInf;
    return Scored{-1, slack, t, Idle(x.load), slack};
  };
  Placement placement;
  bool meets = false;
  bool all_idle = false;
  Scored first, second;
  if (!p.empty() && !d.empty()) {
    first = BestBy(*in.prefill, p, in.round_robin, ttft_score);
    start_delay_s = first.predicted;
    second = BestBy(*in.decode, d, in.round_robin, tpot_score);
    placement.prefill = first.index;
    placement.decode = second.index;
  } else {
    auto both = [&](const InstanceLoad& x) {
      double ttft = PredictTtftSeconds(x, in.prompt_tokens);
      double tpot = PredictColocatedTpotSeconds(x, in.prompt_tokens, in.max_tokens, ttft);
      double own = std::min(Slack(ttft, slo.ttft_s),
                            HasBlocksFor(x, kv_tokens) ? Slack(tpot, slo.tpot_s) : -kInf);
      double stalled = PredictStalledResidentTpotSeconds(x, in.prompt_tokens, ttft);
      double residents = stalled > 0 ? Slack(stalled, slo.tpot_s) : kInf;
      return Scored{-1, std::min(own, residents), ttft, Idle(x.load), own, tpot};
    };
    first = BestBy(*in.colocated, c, in.round_robin, both);
    second = first;
    second.predicted = first.predicted_tpot;
    placement.colocated = first.index;
  }
  placement.predicted_ttft_s = first.predicted;
  placement.predicted_tpot_s = second.predicted;
  meets = first.own_slack >= 0 && second.own_slack >= 0;
  all_idle = first.idle && second.idle;
  if (meets || all_idle) return placement;
  // Retry once the queue ahead has drained: about the predicted overshoot.
  double over = std::max(first.predicted - slo.ttft_s, 0.0) + 1.0;
  return ResourceExhausted("no instance can meet the SLO now (best predicted TTFT " +
                           Seconds(first.predicted) + " vs " + Seconds(slo.ttft_s) +
                           ", TPOT " + Seconds(second.predicted) + " vs " +
                           Seconds(slo.tpot_s) + "); retry after about " +
                           std::to_string(static_cast<int>(std::ceil(over))) + " s");
}

int LeastLoaded(const std::vector<InstanceLoad>& v, const std::vector<int>& usable, uint64_t rr,
                bool prefill_side, int64_t kv_tokens) {
  int best = -1;
  double best_cost = kInf;
  for (size_t k = 0; k < usable.size(); ++k) {
    int i = usable[(k + rr) % usable.size()];
    const LoadReport& l = v[i].load;
    double cost = prefill_side
                      ? static_cast<double>(l.queued_prefill_tokens) + l.waiting_requests
                      : static_cast<double>(l.running_requests) + l.waiting_requests;
    if (!prefill_side && !HasBlocksFor(v[i], kv_tokens)) cost += 1e9;  // last resort
    if (cost < best_cost) {
      best_cost = cost;
      best = i;
    }
  }
  return best;
}

}  // namespace

StatusOr<Placement> Place(PlacementPolicy policy, const PlacementInput& in) {
  std::vector<int> p = Usable(in.prefill);
  std::vector<int> d = Usable(in.decode);
  std::vector<int> c = Usable(in.colocated);
  bool pairs = !p.empty() && !d.empty();
  if (!pairs && c.empty()) {
    return Unavailable("no usable instance: need a prefill and a decode instance, or a "
                       "colocated one (" + std::to_string(p.size()) + " prefill, " +
                       std::to_string(d.size()) + " decode, " + std::to_string(c.size()) +
                       " colocated up)");
  }
  Placement placement;
  switch (policy) {
    case PlacementPolicy::kGoodput:
      return Goodput(in, p, d, c);
    case PlacementPolicy::kRoundRobin:
      if (pairs) {
        placement.prefill = p[in.round_robin % p.size()];
        placement.decode = d[in.round_robin % d.size()];
      } else {
        placement.colocated = c[in.round_robin % c.size()];
      }
      return placement;
    case PlacementPolicy::kLeastLoaded: {
      int64_t kv_tokens = in.prompt_tokens + 1;
      if (pairs) {
        placement.prefill = LeastLoaded(*in.prefill, p, in.round_robin, true, kv_tokens);
        placement.decode = LeastLoaded(*in.decode, d, in.round_robin, false, kv_tokens);
      } else {
        // Colocated: both phases share the instance; weigh queued tokens and the batch.
        double best_cost = kInf;
        for (size_t k = 0; k < c.size(); ++k) {
          int i = c[(k + in.round_robin) % c.size()];
          const LoadReport& l = (*in.colocated)[i].load;
          double cost = static_cast<double>(l.queued_prefill_tokens) + l.waiting_requests +
                        l.running_requests;
          if (cost < best_cost) {
            best_cost = cost;
            placement.colocated = i;
          }
        }
      }
      return placement;
    }
  }
  return Internal("unknown placement policy");
}

}  // namespace tandem
