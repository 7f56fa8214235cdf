// Token sampling: request parameters, a per-request sampler, and stop conditions.
//
// Processing order (the same as Hugging Face transformers' `generate`, with OpenAI's
// presence/frequency penalties slotted in after the repetition penalty, as vLLM does):
//   0. logit_bias added to the raw logits; while fewer than min_tokens tokens were generated,
//      eos (unless ignore_eos) and stop_token_ids are masked to -inf (as vLLM's min_tokens
//      processor; skipped if that would leave no usable token)
//   1. repetition penalty (HF semantics: for every token seen in prompt or output, a positive
//      logit is divided by the penalty and a negative one multiplied by it)
//   2. presence and frequency penalties (OpenAI semantics, output tokens only:
//      logit -= presence_penalty * [count > 0] + frequency_penalty * count)
//   3. temperature (logit / temperature); temperature 0 (or below 1e-5, as vLLM) means greedy:
//      argmax after 1-2, steps 3-6 are skipped, lowest token id wins a tie (as torch.argmax)
//   4. top-k (keeps every token whose logit is >= the k-th largest, so ties at the edge stay)
//   5. top-p (HF: drop the tokens whose ascending cumulative probability is <= 1 - top_p;
//      the most likely token always stays)
//   6. min-p (drop tokens whose probability is < min_p * the largest probability)
// then one draw from the softmax of what is left: the first token, in score order (higher
// first, lower id on ties) when top-p applies and in token id order otherwise, at which the
// cumulative probability exceeds the position's uniform.
//
// Randomness is counter-based: the draw for output position i is a pure function of
// (seed, i). The same seed gives the same tokens whatever the batch composition, and a request
// that moves from a prefill instance to a decode instance keeps its stream if the seed moves
// with it (Sampler::seed() reports the seed chosen for an unseeded request).
//
// Logprobs: by default reported from the RAW model distribution (log-softmax of the logits as
// given, before any penalty or warper), as OpenAI and vLLM (V1 default) do. LogprobsMode::
// kProcessed reports log-softmax of the distribution actually sampled from instead (tokens cut by
// top-k/p/min-p get -inf; under greedy, the distribution after penalties).
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/engine/row_draw.h"
#include "common/engine/sampling_params.h"
#include "common/engine/score_edits.h"

namespace tandem {

// What one Sample() call returns. Fixed size: returning it allocates nothing.
struct SampleResult {
  int32_t token_id = -1;
  float logprob = 0.0f;  // of token_id; 0 when params.logprobs is false
  int32_t num_top_logprobs = 0;
  // The top params.top_logprobs tokens, most likely first (ties: lower id first).
  std::array<TokenLogprob, kMaxTopLogprobs> top_logprobs{};

  std::span<const TokenLogprob> top() const {
    return {top_logprobs.data(), static_cast<size_t>(num_top_logprobs)};
  }
};

// Scratch memory sized to the vocabulary (about 60 bytes per vocab entry). Samplers that run
// on the same thread one after another may share one, so that a batch of many requests does not
// hold one each. Its contents mean nothing between calls.
class SamplerWorkspace {
 public:
  explicit SamplerWorkspace(int32_t vocab_size);
  int32_t vocab_size() const { return static_cast<int32_t>(scores.size()); }

 private:
  friend class Sampler;
  std::vector<float> scores;        // processed logits
  std::vector<float> logprob_src;   // what logprobs are computed from (processed mode)
  std::vector<int32_t> candidates;  // token ids still in play
  std::vector<int32_t> order;       // top-n selection
  std::vector<double> probs;        // probabilities of candidates[0..n)
  std::vector<uint64_t> keys;       // top-p: candidates as packed sort keys
  std::vector<int32_t> counts;      // output-token counts; all zero between calls
  std::vector<int32_t> edit_of;     // token -> index of its score edit; all -1 between calls
  std::vector<ScoreEdit> edits;     // this call's score edits (capacity: the vocabulary)
};

// A set of token ids in [0, vocab_size): a bitmap with each 64-bit word's rank, so that
// membership and a member's index in id order are O(1), and the members are listed in id order
// in O(vocab_size / 64 + size). 12 bytes per 64 vocabulary entries. The Sampler keeps the
// prompt's distinct tokens in one (the repetition penalty's prompt part, which never changes).
class TokenIdSet {
 public:
  TokenIdSet() = default;
  // Aborts on an id outside [0, vocab_size) (ids come from the tokenizer or a validated request).
  TokenIdSet(std::span<const int32_t> tokens, int32_t vocab_size);

  size_t size() const { return size_; }
  bool Contains(int32_t t) const {
    return t >= 0 && static_cast<size_t>(t) < bits_.size() * 64 &&
           (bits_[t >> 6] >> (t & 63) & 1u);
  }
  // How many members are below t: a member's index in id order.
  size_t IndexOf(int32_t t) const {
    const uint64_t below = bits_[t >> 6] & ((uint64_t{1} << (t & 63)) - 1);
    return rank_[t >> 6] + static_cast<size_t>(std::popcount(below));
  }
  // Calls visit(id) for every member, in increasing id order.
  template <class Visit>
  void ForEach(Visit visit) const {
    for (size_t w = 0; w < bits_.size(); ++w)
      for (uint64_t word = bits_[w]; word != 0; word &= word - 1)
        visit(static_cast<int32_t>(w * 64 + std::countr_zero(word)));
  }

 private:
  std::vector<uint64_t> bits_;  // bit t % 64 of word t / 64: t is a member
  std::vector<int32_t> rank_;   // per word: the members in the words before it
  size_t size_ = 0;
};

// The plain argmax of one row, the token greedy sampling picks: the lowest id among the
// largest values; NaN and -inf never win; -1 when no entry is a number above -inf.
int32_t ArgmaxRow(std::span<const float> logits);

// One request's sampler. Not thread-safe; owned by whoever owns the request (the engine
// thread). Scratch is allocated at construction, so Sample() allocates nothing.
class Sampler {
 public:
  // params must be valid (Validate() OK; checked). num_prompt_tokens says how many leading
  // entries of the token lists passed to Sample() are prompt (presence/frequency penalties
  // apply only to what follows). eos_token_ids: the model's, masked with stop_token_ids until
  // params.min_tokens (ignored when min_tokens is 0). This one owns its workspace.
  Sampler(const SamplingParams& params, int32_t vocab_size, size_t num_prompt_tokens,
          std::span<const int32_t> eos_token_ids = {});
  // Uses a shared workspace, which must outlive the sampler and not be used concurrently.
  Sampler(const SamplingParams& params, SamplerWorkspace* workspace, size_t num_prompt_tokens,
          std::span<const int32_t> eos_token_ids = {});

  // Whether Sample() at output position `num_output_tokens` would return the plain argmax of
  // the logits it is given and nothing else: greedy, no logit_bias, no penalties, no logprobs,
  // no min_tokens mask at this position. Then the engine may take the argmax from where the
  // logits are (GreedyRows, common/engine/forward_backend.h) instead of calling Sample().
  static bool IsPlainArgmax(const SamplingParams& params, size_t num_output_tokens);
  // IsPlainArgmax for this sampler's next Sample() given every token so far.
  bool NextIsPlainArgmax(std::span<const int32_t> prompt_and_output_tokens) const {
    return IsPlainArgmax(params_, prompt_and_output_tokens.size() - num_prompt_tokens_);
  }

  // The next Sample()'s draw as RowDraw's few numbers (common/engine/row_draw.h), when that
  // is all it needs: no logit_bias, penalties or min_tokens mask at this position, logprobs
  // (if any) of the raw distribution; not greedy, or greedy with logprobs (kRowArgmax). Then
  // a device backend may draw the token where the logits are (GreedyRows' draws) and
  // DrawRow(logits, *draw, &logprobs) is Sample()'s token (up to rounding at a cut) with its
  // logprobs (up to summation order).
  std::optional<RowDraw> NextRowDraw(std::span<const int32_t> prompt_and_output_tokens) const;

  // Steps 0-2 of the next Sample() (logit_bias, the min_tokens mask, the penalties) as score
  // edits (common/engine/score_edits.h), appended to *edits: ApplyScoreEdits(logits, them) is
  // the scores Sample() warps or takes the argmax of. None when ScoresAreLogits and no mask.
  // Under the repetition penalty the prompt's tokens come first, in id order, then the other
  // tokens touched, in the order first touched. The prompt (the first num_prompt_tokens) must
  // be the same in every call: the first call under the repetition penalty keeps its distinct
  // tokens (a pass over the prompt, once), later calls list them without walking it again.
  void AppendScoreEdits(std::span<const int32_t> prompt_and_output_tokens,
                        std::vector<ScoreEdit>* edits) const;

  // Whether a backend may pick the next token where the logits are (GreedyRows): the plain
  // argmax; or, where the backend draws rows (ForwardBackend::draws_rows), a draw (into
  // *draw); or, for a row with logit_bias, penalties or a min_tokens mask and no logprobs,
  // the argmax (greedy) or the draw of its scores after its score edits, appended to *edits
  // (AppendScoreEdits). Rows with logprobs and edits, and rows with processed logprobs, stay on
  // the host (raw logprobs need the unedited logits; processed ones the warped distribution).
  // The engines' one question per row.
  bool NextPickedByBackend(std::span<const int32_t> prompt_and_output_tokens,
                           bool backend_draws_rows, RowDraw* draw,
                           std::vector<ScoreEdit>* edits) const;

  // Samples the next token from logits[vocab_size] given every token so far (prompt first,
  // then output; at least num_prompt_tokens of them). The draw depends only on the seed and
  // prompt_and_output_tokens.size(), so calling twice with the same inputs gives the same
  // token. Aborts if no logit is finite (a broken model, not a request error).
  SampleResult Sample(std::span<const float> logits,
                      std::span<const int32_t> prompt_and_output_tokens);
  // The same with `workspace` as scratch for this call (of this sampler's vocabulary): for
  // samplers that share one workspace but are run on several threads at once (BatchSampling,
  // common/engine/batch_sampling.h), each thread with its own.
  SampleResult Sample(std::span<const float> logits,
                      std::span<const int32_t> prompt_and_output_tokens,
                      SamplerWorkspace& workspace);

  // The distribution Sample() draws from for non-greedy params: the kept token ids and their
  // renormalised probabilities, in no particular order. The spans stay valid until the next
  // call on this sampler or its workspace. Exposed for tests against Hugging Face.
  struct Distribution {
    std::span<const int32_t> token_ids;
    std::span<const double> probs;
  };
  Distribution Process(std::span<const float> logits,
                       std::span<const int32_t> prompt_and_output_tokens);

  uint64_t seed() const { return seed_; }
  const SamplingParams& params() const { return params_; }

 private:
  // No logit_bias and no penalties: the scores are the logits (before temperature).
  static bool ScoresAreLogits(const SamplingParams& params);
  // Copies logits into scores_ and applies logit_bias, the min_tokens mask and the penalties
  // (steps 0-2) through AppendScoreEdits and ApplyScoreEdits.
  void ApplyPenalties(std::span<const float> logits, std::span<const int32_t> tokens);
  // Whether the min_tokens mask applies at output position `num_output`: a stop id or eos to
  // mask, and fewer than min_tokens tokens generated.
  bool MaskActive(size_t num_output) const {
    return !min_tokens_masked_.empty() && num_output < static_cast<size_t>(params_.min_tokens);
  }
  // RowDraw's numbers for output position `num_output` (kRowArgmax for greedy params).
  RowDraw DrawNumbers(size_t num_output) const;
  // Steps 3-6 on scores_; fills the workspace's candidates and their weights exp(s - max)
  // (probs, unnormalised), num_candidates_ and kept_weight_ (the weights' sum).
  void Warp();
  // A uniform double in [0, 1) for output position `step`.
  double Uniform(uint64_t step) const;
  void FillLogprobs(std::span<const float> logits, SampleResult* result);

  SamplingParams params_;
  std::unique_ptr<SamplerWorkspace> owned_workspace_;
  SamplerWorkspace* ws_;
  int32_t vocab_size_;
  size_t num_prompt_tokens_;
  std::vector<int32_t> min_tokens_masked_;  // stop ids masked before min_tokens; empty: none
  // The prompt's distinct tokens, under the repetition penalty only: built by the first
  // AppendScoreEdits (hence mutable: a Sampler is used by one thread at a time), so that each
  // step's repetition edits are the set's members in id order and the prompt is walked once
  // per request, not once per step (perf/README.md, Score edits).
  mutable std::optional<TokenIdSet> prompt_set_;
  uint64_t seed_;
  size_t num_candidates_ = 0;
  double kept_weight_ = 0;
};

// What Sample() returns for a row drawn where its logits are (GreedyRows::draws): the token
// and, when the draw asked for them, its logprobs.
SampleResult DrawnSample(int32_t token_id, const RowDraw& draw, const RowLogprobs& logprobs);

enum class FinishReason {
  kNone,    // still generating
  kStop,    // eos, a stop token id, or a stop string
  kLength,  // max_tokens reached
};

// "stop", "length", or "" for kNone (OpenAI's finish_reason values).
std::string_view FinishReasonName(FinishReason reason);

// What StopChecker::Append says about one token.
struct StopUpdate {
  std::string text;  // what may be sent to the client now (may be empty)
  FinishReason finish_reason = FinishReason::kNone;
  bool finished() const { return finish_reason != FinishReason::kNone; }
};

// Decides when a request stops, and what of its streamed text may be shown.
//
// Feed it each sampled token with the text that detokenizing it added (complete UTF-8).
// Text that could be the start of a stop string is held back until it is known not to be one,
// so a stop string never reaches the client; on a stop string the output is cut right before
// it. An eos or stop token's own text is never emitted. With include_stop_str_in_output, the
// matched stop string and a stop token's text are emitted (the output ends with them). Before
// params.min_tokens tokens, nothing stops the output (stop tokens and strings are ordinary
// text). On finish, held text that turned out not to be a stop string is released. After
// finishing, Append() must not be called (checked).
// Not thread-safe.
class StopChecker {
 public:
  // eos_token_ids: the model's end-of-sequence ids (ignored when params.ignore_eos).
  StopChecker(const SamplingParams& params, std::vector<int32_t> eos_token_ids);

  StopUpdate Append(int32_t token_id, std::string_view text_delta);

  // Everything emitted so far: once finished, the final (truncated) text.
  const std::string& text() const { return text_; }
  int32_t num_tokens() const { return num_tokens_; }
  FinishReason finish_reason() const { return finish_reason_; }
  // The stop string that ended the request, if one did.
  std::optional<std::string> matched_stop() const { return matched_stop_; }

 private:
  bool IsStopToken(int32_t token_id) const;
  // Emits held_ (all of it) into update; used when finishing without a stop string.
  void Flush(StopUpdate* update);

  std::vector<int32_t> stop_ids_;
  std::vector<std::string> stop_strings_;
  int32_t max_tokens_;
  int32_t min_tokens_;
  bool include_stop_;
  int32_t num_tokens_ = 0;
  std::string held_;  // text not yet emitted: a possible start of a stop string
  std::string text_;
  FinishReason finish_reason_ = FinishReason::kNone;
  std::optional<std::string> matched_stop_;
};

}  // namespace tandem
