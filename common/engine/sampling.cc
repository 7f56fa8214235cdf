#include "common/engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

namespace tandem {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::string FormatFloat(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

Status RangeError(std::string_view field, std::string_view range, double got) {
  return InvalidArgument(std::string(field) + " must be in " + std::string(range) + ", got " +
                         FormatFloat(got));
}

// SplitMix64's finaliser: a good 64-bit mixer, cheap enough to call once per token.
uint64_t Mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// NaN counts as masked: a NaN logit must not win an argmax or poison a softmax.
bool Usable(float v) { return v > kNegInf; }

// Higher score first; on a tie the lower id, so results never depend on sort stability.
struct ByScoreDesc {
  const float* scores;
  bool operator()(int32_t a, int32_t b) const {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return a < b;
  }
};

// A key whose ascending order is ByScoreDesc's: the score's bits made to sort as unsigned
// integers (IEEE order), inverted (higher first), then the id (lower first). Scores here are
// numbers (Usable), so no NaN.
uint64_t DescKey(float score, int32_t id) {
  uint32_t bits;
  std::memcpy(&bits, &score, sizeof bits);
  bits = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;  // ascending as unsigned
  return (static_cast<uint64_t>(~bits) << 32) | static_cast<uint32_t>(id);
}

// Top-p as HF applies it to cand[0..n): in score order, it sums the probabilities from the least
// likely token up and drops tokens while that sum stays <= 1 - top_p; the most likely token
// always stays (min_tokens_to_keep = 1). Computed the equivalent way from the top: a token
// stays while the weight of the tokens more likely than it is below top_p of the total (the
// weights exp(s - max) unnormalised, so that equal weights add exactly, as DrawRow's do:
// common/engine/row_draw.h). Returns how many are kept, with the kept ones first in cand, most
// likely first.
//
// Only the head it keeps is sorted, not the vocabulary (a full sort was 5.6 ms a row at vocab
// 49152, perf/README.md): the top m candidates are selected (nth_element on packed keys, no
// indirection) and sorted, m doubling from 64 until their weight reaches top_p of the total;
// the cut then lies within them. `token_probs` (vocab entries, by token id) and `keys` (n
// entries) are scratch.
size_t TopPKeep(int32_t* cand, size_t n, const float* scores, float top_p, double* token_probs,
                uint64_t* keys) {
  float max_score = scores[cand[0]];
  for (size_t j = 1; j < n; ++j) max_score = std::max(max_score, scores[cand[j]]);
  double total = 0.0;
  for (size_t j = 0; j < n; ++j) {
    const int32_t t = cand[j];
    token_probs[t] = std::exp(static_cast<double>(scores[t]) - max_score);
    total += token_probs[t];
    keys[j] = DescKey(scores[t], t);
  }
  auto id = [&](size_t j) { return static_cast<int32_t>(keys[j] & 0xffffffffu); };
  const double reach = static_cast<double>(top_p) * total;
  size_t sorted = 0;  // keys[0..sorted) hold the top `sorted`, in order
  for (size_t m = std::min<size_t>(64, n);; m = std::min(2 * m, n)) {
    // keys[sorted..n) holds the rest: select the next m - sorted among them.
    if (m < n) std::nth_element(keys + sorted, keys + m - 1, keys + n);
    std::sort(keys + sorted, keys + m);
    sorted = m;
    double before = 0.0;  // the weight of the tokens more likely than keys[keep]
    size_t keep = 0;
    while (keep < m && (keep == 0 || before < reach)) before += token_probs[id(keep++)];
    if (keep == m && before < reach && m < n) continue;  // the cut lies below the top m: widen
    for (size_t j = 0; j < keep; ++j) cand[j] = id(j);
    return keep;
  }
}

}  // namespace

int32_t ArgmaxRow(std::span<const float> logits) {
  int32_t best = -1;
  float best_value = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] > best_value) {  // NaN and -inf never (Usable); the first of equals stays
      best_value = logits[i];
      best = static_cast<int32_t>(i);
    }
  return best;
}

// ---- SamplingParams ------------------------------------------------------------------------

Status SamplingParams::Validate() const {
  // Written as !(in range) so that NaN fails too.
  if (!(temperature >= 0.0f && temperature <= 2.0f)) {
    return RangeError("temperature", "[0, 2]", temperature);
  }
  if (top_k < -1) {
    return InvalidArgument("top_k must be -1 or 0 (disabled) or at least 1, got " +
                           std::to_string(top_k));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) return RangeError("top_p", "(0, 1]", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return RangeError("min_p", "[0, 1]", min_p);
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 2.0f)) {
    return RangeError("repetition_penalty", "(0, 2]", repetition_penalty);
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return RangeError("presence_penalty", "[-2, 2]", presence_penalty);
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return RangeError("frequency_penalty", "[-2, 2]", frequency_penalty);
  }
  if (max_tokens < 1) {
    return InvalidArgument("max_tokens must be at least 1, got " + std::to_string(max_tokens));
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return InvalidArgument("min_tokens must be in [0, max_tokens] = [0, " +
                           std::to_string(max_tokens) + "], got " + std::to_string(min_tokens));
  }
  if (logit_bias.size() > kMaxLogitBiasEntries) {
    return InvalidArgument("logit_bias may hold at most " + std::to_string(kMaxLogitBiasEntries) +
                           " entries, got " + std::to_string(logit_bias.size()));
  }
  for (const TokenBias& b : logit_bias) {
    if (b.token_id < 0) {
      return InvalidArgument("logit_bias token ids must be non-negative, got " +
                             std::to_string(b.token_id));
    }
    if (!(b.bias >= -kMaxLogitBias && b.bias <= kMaxLogitBias)) {
      return InvalidArgument("logit_bias for token " + std::to_string(b.token_id) +
                             " must be in [-100, 100], got " + FormatFloat(b.bias));
    }
  }
  if (logit_bias.size() > 1) {
    std::vector<int32_t> ids;
    ids.reserve(logit_bias.size());
    for (const TokenBias& b : logit_bias) ids.push_back(b.token_id);
    std::sort(ids.begin(), ids.end());
    auto dup = std::adjacent_find(ids.begin(), ids.end());
    if (dup != ids.end()) {
      return InvalidArgument("logit_bias lists token " + std::to_string(*dup) + " twice");
    }
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0) {
      return InvalidArgument("stop_token_ids must be non-negative, got " + std::to_string(id));
    }
  }
  if (stop.size() > kMaxStopStrings) {
    return InvalidArgument("stop may hold at most " + std::to_string(kMaxStopStrings) +
                           " sequences, got " + std::to_string(stop.size()));
  }
  for (const std::string& s : stop) {
    if (s.empty()) return InvalidArgument("stop sequences must not be empty");
  }
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs) {
    return InvalidArgument("top_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) +
                           "], got " + std::to_string(top_logprobs));
  }
  if (top_logprobs > 0 && !logprobs) {
    return InvalidArgument("logprobs must be set to true if top_logprobs is used");
  }
  return Status::Ok();
}

Status SamplingParams::ValidateForVocab(int32_t vocab_size) const {
  TANDEM_RETURN_IF_ERROR(Validate());
  for (const TokenBias& b : logit_bias) {
    if (b.token_id >= vocab_size) {
      return InvalidArgument("logit_bias token id " + std::to_string(b.token_id) +
                             " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    }
  }
  for (int32_t id : stop_token_ids) {
    if (id >= vocab_size) {
      return InvalidArgument("stop_token_ids must be below the vocabulary size " +
                             std::to_string(vocab_size) + ", got " + std::to_string(id));
    }
  }
  return Status::Ok();
}

// ---- Sampler -------------------------------------------------------------------------------

TokenIdSet::TokenIdSet(std::span<const int32_t> tokens, int32_t vocab_size)
    : bits_((static_cast<size_t>(vocab_size) + 63) / 64, 0), rank_(bits_.size(), 0) {
  for (int32_t t : tokens) {
    TANDEM_CHECK(t >= 0 && t < vocab_size, "token id out of range: " + std::to_string(t));
    bits_[t >> 6] |= uint64_t{1} << (t & 63);
  }
  for (size_t w = 0; w < bits_.size(); ++w) {
    rank_[w] = static_cast<int32_t>(size_);
    size_ += static_cast<size_t>(std::popcount(bits_[w]));
  }
}

SamplerWorkspace::SamplerWorkspace(int32_t vocab_size)
    : scores(vocab_size),
      logprob_src(vocab_size),
      candidates(vocab_size),
      order(vocab_size),
      probs(vocab_size),
      keys(vocab_size),
      counts(vocab_size, 0),
      edit_of(vocab_size, -1) {
  TANDEM_CHECK(vocab_size > 0, "vocab_size must be positive");
  edits.reserve(vocab_size);  // a row lists a token at most once
}

Sampler::Sampler(const SamplingParams& params, int32_t vocab_size, size_t num_prompt_tokens,
                 std::span<const int32_t> eos_token_ids)
    : Sampler(params, nullptr, num_prompt_tokens, eos_token_ids) {
  owned_workspace_ = std::make_unique<SamplerWorkspace>(vocab_size);
  ws_ = owned_workspace_.get();
  vocab_size_ = vocab_size;
}

Sampler::Sampler(const SamplingParams& params, SamplerWorkspace* workspace,
                 size_t num_prompt_tokens, std::span<const int32_t> eos_token_ids)
    : params_(params),
      ws_(workspace),
      vocab_size_(workspace ? workspace->vocab_size() : 0),
      num_prompt_tokens_(num_prompt_tokens) {
  Status status = params_.Validate();
  TANDEM_CHECK(status.ok(), "Sampler given invalid params: " + status.message());
  if (params_.min_tokens > 0) {
    min_tokens_masked_ = params_.stop_token_ids;
    if (!params_.ignore_eos) {
      min_tokens_masked_.insert(min_tokens_masked_.end(), eos_token_ids.begin(),
                                eos_token_ids.end());
    }
  }
  if (params_.seed) {
    seed_ = *params_.seed;
  } else {
    std::random_device device;
    seed_ = (static_cast<uint64_t>(device()) << 32) ^ device();
  }
}

double Sampler::Uniform(uint64_t step) const {
  uint64_t bits = Mix64(seed_ ^ Mix64(step));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

void Sampler::ApplyPenalties(std::span<const float> logits, std::span<const int32_t> tokens) {
  float* scores = ws_->scores.data();
  std::copy(logits.begin(), logits.end(), scores);
  ws_->edits.clear();
  AppendScoreEdits(tokens, &ws_->edits);
  const Status applied =
      ApplyScoreEdits({scores, static_cast<size_t>(vocab_size_)}, ws_->edits);
  TANDEM_CHECK(applied.ok(), applied.message());  // AppendScoreEdits checked every id
}

void Sampler::AppendScoreEdits(std::span<const int32_t> prompt_and_output_tokens,
                               std::vector<ScoreEdit>* edits) const {
  TANDEM_CHECK(prompt_and_output_tokens.size() >= num_prompt_tokens_, "fewer tokens than prompt");
  const float rep = params_.repetition_penalty;
  const size_t first = edits->size();
  // Under the repetition penalty, one edit per distinct prompt token first, in id order (the
  // prompt's TokenIdSet finds a token's among them); then one per other token touched, found
  // through the workspace's edit_of (token -> its index from `others`; else -1).
  const TokenIdSet* prompt_set = nullptr;
  if (rep != 1.0f) {
    if (!prompt_set_)
      prompt_set_.emplace(prompt_and_output_tokens.first(num_prompt_tokens_), vocab_size_);
    prompt_set = &*prompt_set_;
    prompt_set->ForEach([&](int32_t t) {
      edits->push_back(ScoreEdit{.token_id = t, .flags = kEditRepetition, .repetition = rep});
    });
  }
  const size_t others = edits->size();
  int32_t* edit_of = ws_->edit_of.data();
  auto edit_for = [&](int32_t t) -> ScoreEdit& {
    TANDEM_CHECK(t >= 0 && t < vocab_size_, "token id out of range: " + std::to_string(t));
    if (prompt_set && prompt_set->Contains(t)) return (*edits)[first + prompt_set->IndexOf(t)];
    if (edit_of[t] < 0) {
      edit_of[t] = static_cast<int32_t>(edits->size() - others);
      edits->push_back(ScoreEdit{.token_id = t});
    }
    return (*edits)[others + edit_of[t]];
  };

  for (const TokenBias& b : params_.logit_bias) {
    ScoreEdit& e = edit_for(b.token_id);
    e.flags |= kEditBias;
    e.bias = b.bias;
  }
  const std::span<const int32_t> output = prompt_and_output_tokens.subspan(num_prompt_tokens_);
  if (MaskActive(output.size())) {
    for (int32_t t : min_tokens_masked_)
      if (t >= 0 && t < vocab_size_) edit_for(t).flags |= kEditMask;
  }
  if (rep != 1.0f) {  // once per distinct token of prompt and output, as HF's gather/scatter
    for (int32_t t : output) {
      ScoreEdit& e = edit_for(t);
      e.flags |= kEditRepetition;
      e.repetition = rep;
    }
  }
  const float presence = params_.presence_penalty;
  const float frequency = params_.frequency_penalty;
  if (presence != 0.0f || frequency != 0.0f) {  // output tokens only
    int32_t* counts = ws_->counts.data();
    for (int32_t t : output) {
      edit_for(t).flags |= kEditSubtract;
      ++counts[t];
    }
    for (int32_t t : output) {
      if (counts[t] == 0) continue;  // already set
      edit_for(t).subtract = frequency * static_cast<float>(counts[t]) + presence;
      counts[t] = 0;
    }
  }
  for (size_t i = others; i < edits->size(); ++i) edit_of[(*edits)[i].token_id] = -1;
}

void Sampler::Warp() {
  float* scores = ws_->scores.data();
  int32_t* cand = ws_->candidates.data();
  double* probs = ws_->probs.data();

  if (params_.temperature != 1.0f) {
    for (int32_t i = 0; i < vocab_size_; ++i) scores[i] /= params_.temperature;
  }

  size_t n = 0;
  for (int32_t i = 0; i < vocab_size_; ++i) {
    if (Usable(scores[i])) cand[n++] = i;
  }
  TANDEM_CHECK(n > 0, "no finite logit to sample from");
  ByScoreDesc by_score{scores};

  // Top-k: keep everything >= the k-th largest, as HF's `scores < topk[-1]` does. The kept
  // ones stay in token id order (the draw's order without top-p; DrawRow's too).
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    int32_t* select = ws_->order.data();
    std::copy(cand, cand + n, select);
    std::nth_element(select, select + params_.top_k - 1, select + n, by_score);
    const float kth = scores[select[params_.top_k - 1]];
    n = std::remove_if(cand, cand + n, [&](int32_t t) { return !(scores[t] >= kth); }) - cand;
  }

  if (params_.top_p < 1.0f)
    n = TopPKeep(cand, n, scores, params_.top_p, probs, ws_->keys.data());

  if (params_.min_p > 0.0f) {
    // p_i < min_p * p_max  <=>  exp(s_i - s_max) < min_p; the top token always stays.
    float max_score = kNegInf;
    for (size_t j = 0; j < n; ++j) max_score = std::max(max_score, scores[cand[j]]);
    const double min_p = params_.min_p;
    n = std::remove_if(cand, cand + n,  // stable, and allocates nothing
                       [&](int32_t t) {
                         return !(std::exp(static_cast<double>(scores[t]) - max_score) >= min_p);
                       }) -
        cand;
  }

  float max_score = kNegInf;
  for (size_t j = 0; j < n; ++j) max_score = std::max(max_score, scores[cand[j]]);
  double sum = 0.0;
  for (size_t j = 0; j < n; ++j) {
    probs[j] = std::exp(static_cast<double>(scores[cand[j]]) - max_score);
    sum += probs[j];
  }
  num_candidates_ = n;
  kept_weight_ = sum;
}

Sampler::Distribution Sampler::Process(std::span<const float> logits,
                                       std::span<const int32_t> prompt_and_output_tokens) {
  TANDEM_CHECK(logits.size() == static_cast<size_t>(vocab_size_), "logits size != vocab size");
  ApplyPenalties(logits, prompt_and_output_tokens);
  Warp();
  double* probs = ws_->probs.data();
  for (size_t j = 0; j < num_candidates_; ++j) probs[j] /= kept_weight_;
  return {std::span<const int32_t>(ws_->candidates.data(), num_candidates_),
          std::span<const double>(probs, num_candidates_)};
}

RowDraw Sampler::DrawNumbers(size_t num_output) const {
  RowDraw draw;
  draw.top_logprobs = params_.logprobs ? params_.top_logprobs : -1;
  if (params_.greedy()) {  // the argmax, drawn only for its logprobs
    draw.draw = kRowArgmax;
    return draw;
  }
  draw.temperature = params_.temperature;
  draw.top_k = params_.top_k;
  draw.top_p = params_.top_p;
  draw.min_p = params_.min_p;
  draw.u = Uniform(num_output);
  draw.draw = kRowDrawn;
  return draw;
}

std::optional<RowDraw> Sampler::NextRowDraw(
    std::span<const int32_t> prompt_and_output_tokens) const {
  const size_t num_output = prompt_and_output_tokens.size() - num_prompt_tokens_;
  const SamplingParams& p = params_;
  if ((p.greedy() && !p.logprobs) || !ScoresAreLogits(p) ||
      (p.logprobs && p.logprobs_mode != LogprobsMode::kRaw) ||
      MaskActive(num_output))
    return std::nullopt;
  return DrawNumbers(num_output);
}

bool Sampler::NextPickedByBackend(std::span<const int32_t> prompt_and_output_tokens,
                                  bool backend_draws_rows, RowDraw* draw,
                                  std::vector<ScoreEdit>* edits) const {
  if (NextIsPlainArgmax(prompt_and_output_tokens)) return true;
  if (!backend_draws_rows) return false;
  if (const std::optional<RowDraw> next = NextRowDraw(prompt_and_output_tokens)) {
    *draw = *next;
    return true;
  }
  // What is left needs score edits (or processed logprobs).
  if (params_.logprobs) return false;
  *draw = params_.greedy()  // greedy: the edited row's argmax
              ? RowDraw{}
              : DrawNumbers(prompt_and_output_tokens.size() - num_prompt_tokens_);
  AppendScoreEdits(prompt_and_output_tokens, edits);
  return true;
}

bool Sampler::ScoresAreLogits(const SamplingParams& params) {
  return params.logit_bias.empty() && params.repetition_penalty == 1.0f &&
         params.presence_penalty == 0.0f && params.frequency_penalty == 0.0f;
}

bool Sampler::IsPlainArgmax(const SamplingParams& params, size_t num_output_tokens) {
  return params.greedy() && ScoresAreLogits(params) && !params.logprobs &&
         num_output_tokens >= static_cast<size_t>(params.min_tokens);
}

SampleResult Sampler::Sample(std::span<const float> logits,
                             std::span<const int32_t> prompt_and_output_tokens) {
  TANDEM_CHECK(logits.size() == static_cast<size_t>(vocab_size_), "logits size != vocab size");
  TANDEM_CHECK(prompt_and_output_tokens.size() >= num_prompt_tokens_,
               "fewer tokens than the prompt");
  SampleResult result;
  if (params_.greedy()) {
    ApplyPenalties(logits, prompt_and_output_tokens);
    const float* scores = ws_->scores.data();
    const int32_t best = ArgmaxRow({scores, static_cast<size_t>(vocab_size_)});
    TANDEM_CHECK(best >= 0, "no finite logit to sample from");
    result.token_id = best;
    if (params_.logprobs && params_.logprobs_mode == LogprobsMode::kProcessed) {
      std::copy(scores, scores + vocab_size_, ws_->logprob_src.begin());
    }
  } else {
    ApplyPenalties(logits, prompt_and_output_tokens);
    Warp();
    const int32_t* cand = ws_->candidates.data();
    const double* weights = ws_->probs.data();  // unnormalised: u scales to their sum instead
    const uint64_t step = prompt_and_output_tokens.size() - num_prompt_tokens_;
    const double target = Uniform(step) * kept_weight_;
    double cumulative = 0.0;
    // If rounding leaves the total a hair under the target, the last candidate takes it.
    result.token_id = cand[num_candidates_ - 1];
    for (size_t j = 0; j < num_candidates_; ++j) {
      cumulative += weights[j];
      if (target < cumulative) {
        result.token_id = cand[j];
        break;
      }
    }
    if (params_.logprobs && params_.logprobs_mode == LogprobsMode::kProcessed) {
      std::fill(ws_->logprob_src.begin(), ws_->logprob_src.end(), kNegInf);
      for (size_t j = 0; j < num_candidates_; ++j) ws_->logprob_src[cand[j]] = ws_->scores[cand[j]];
    }
  }
  if (params_.logprobs) FillLogprobs(logits, &result);
  return result;
}

SampleResult Sampler::Sample(std::span<const float> logits,
                             std::span<const int32_t> prompt_and_output_tokens,
                             SamplerWorkspace& workspace) {
  TANDEM_CHECK(workspace.vocab_size() == vocab_size_, "workspace of another vocabulary");
  SamplerWorkspace* const own = ws_;
  ws_ = &workspace;
  SampleResult result = Sample(logits, prompt_and_output_tokens);
  ws_ = own;
  return result;
}

void Sampler::FillLogprobs(std::span<const float> logits, SampleResult* result) {
  const float* src = params_.logprobs_mode == LogprobsMode::kRaw ? logits.data()
                                                                 : ws_->logprob_src.data();
  float max_value = kNegInf;
  for (int32_t i = 0; i < vocab_size_; ++i) {
    if (Usable(src[i])) max_value = std::max(max_value, src[i]);
  }
  double sum = 0.0;
  for (int32_t i = 0; i < vocab_size_; ++i) {
    if (Usable(src[i])) sum += std::exp(static_cast<double>(src[i]) - max_value);
  }
  const double log_z = max_value + std::log(sum);
  auto logprob = [&](int32_t t) {
    return Usable(src[t]) ? static_cast<float>(src[t] - log_z) : kNegInf;
  };
  result->logprob = logprob(result->token_id);

  const int32_t n = std::min(params_.top_logprobs, vocab_size_);
  if (n == 0) return;
  int32_t* order = ws_->order.data();
  std::iota(order, order + vocab_size_, 0);
  // NaN sorts as masked: treat it as -inf for ordering.
  auto key = [&](int32_t t) { return Usable(src[t]) ? src[t] : kNegInf; };
  std::partial_sort(order, order + n, order + vocab_size_, [&](int32_t a, int32_t b) {
    if (key(a) != key(b)) return key(a) > key(b);
    return a < b;
  });
  for (int32_t j = 0; j < n; ++j) result->top_logprobs[j] = {order[j], logprob(order[j])};
  result->num_top_logprobs = n;
}

SampleResult DrawnSample(int32_t token_id, const RowDraw& draw, const RowLogprobs& logprobs) {
  SampleResult result;
  result.token_id = token_id;
  if (draw.top_logprobs < 0) return result;
  result.logprob = logprobs.logprob;
  result.num_top_logprobs = std::min(logprobs.num_top, kMaxTopLogprobs);
  for (int32_t j = 0; j < result.num_top_logprobs; ++j)
    result.top_logprobs[j] = {logprobs.top_ids[j], logprobs.top_logprobs[j]};
  return result;
}

// ---- StopChecker ---------------------------------------------------------------------------

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
  }
  return "";
}

StopChecker::StopChecker(const SamplingParams& params, std::vector<int32_t> eos_token_ids)
    : stop_ids_(params.stop_token_ids),
      stop_strings_(params.stop),
      max_tokens_(params.max_tokens),
      min_tokens_(params.min_tokens),
      include_stop_(params.include_stop_str_in_output) {
  if (!params.ignore_eos) {
    stop_ids_.insert(stop_ids_.end(), eos_token_ids.begin(), eos_token_ids.end());
  }
}

bool StopChecker::IsStopToken(int32_t token_id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), token_id) != stop_ids_.end();
}

void StopChecker::Flush(StopUpdate* update) {
  update->text += held_;
  text_ += held_;
  held_.clear();
}

StopUpdate StopChecker::Append(int32_t token_id, std::string_view text_delta) {
  TANDEM_CHECK(finish_reason_ == FinishReason::kNone, "StopChecker::Append after finish");
  StopUpdate update;
  ++num_tokens_;
  // Before min_tokens, a stop token is an ordinary token and no stop string matches: the
  // min_tokens-th token is the first that may stop the output.
  const bool may_stop = num_tokens_ >= min_tokens_;

  if (may_stop && IsStopToken(token_id)) {
    if (include_stop_) held_.append(text_delta);
    Flush(&update);
    finish_reason_ = update.finish_reason = FinishReason::kStop;
    return update;
  }

  held_.append(text_delta);
  if (!may_stop) {
    Flush(&update);
    if (num_tokens_ >= max_tokens_) finish_reason_ = update.finish_reason = FinishReason::kLength;
    return update;
  }
  // The earliest stop string wins (on the same start, the first listed).
  size_t cut = std::string::npos;
  const std::string* matched = nullptr;
  for (const std::string& stop : stop_strings_) {
    size_t at = held_.find(stop);
    if (at < cut) {
      cut = at;
      matched = &stop;
    }
  }
  if (matched != nullptr) {
    update.text = held_.substr(0, include_stop_ ? cut + matched->size() : cut);
    text_ += update.text;
    held_.clear();
    matched_stop_ = *matched;
    finish_reason_ = update.finish_reason = FinishReason::kStop;
    return update;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string; no stop string
  // occurs in held_, so anything before that suffix can never become part of one.
  size_t hold = 0;
  for (const std::string& stop : stop_strings_) {
    size_t max_len = std::min(stop.size() - 1, held_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (held_.compare(held_.size() - len, len, stop, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  update.text = held_.substr(0, held_.size() - hold);
  text_ += update.text;
  held_.erase(0, held_.size() - hold);

  if (num_tokens_ >= max_tokens_) {
    Flush(&update);
    finish_reason_ = update.finish_reason = FinishReason::kLength;
  }
  return update;
}

}  // namespace tandem
