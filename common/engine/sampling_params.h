// What a request asks of sampling, and what one sampled token is: plain data shared by the
// sampler (common/engine/sampling.h), the control wire (common/net/control_wire.h) and the
// router, so that none of them needs the others. SamplingParams::Validate and ValidateForVocab
// are defined in sampling.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tandem {

// The most top-n logprobs a request may ask for (OpenAI's limit).
inline constexpr int32_t kMaxTopLogprobs = 20;
// The most stop strings a request may give (OpenAI's limit).
inline constexpr size_t kMaxStopStrings = 4;
// The most logit_bias entries a request may give, and the bias range (OpenAI's).
inline constexpr size_t kMaxLogitBiasEntries = 1024;
inline constexpr float kMaxLogitBias = 100.0f;

// One logit_bias entry: `bias` is added to the token's logit before anything else.
struct TokenBias {
  int32_t token_id = -1;
  float bias = 0.0f;
};

enum class LogprobsMode {
  kRaw,        // log-softmax of the model's logits (default; OpenAI/vLLM behaviour)
  kProcessed,  // log-softmax of the distribution after penalties and warpers
};

// Per-request sampling parameters, named as in the OpenAI API (plus vLLM's extensions).
// Neutral defaults: a default-constructed value samples from the plain softmax.
struct SamplingParams {
  float temperature = 1.0f;          // [0, 2]; below kGreedyTemperature (0 too) = greedy
  int32_t top_k = 0;                 // 0 or -1 = off; else >= 1
  float top_p = 1.0f;                // (0, 1]; 1 = off
  float min_p = 0.0f;                // [0, 1]; 0 = off
  float repetition_penalty = 1.0f;   // (0, 2]; 1 = off
  float presence_penalty = 0.0f;     // [-2, 2]
  float frequency_penalty = 0.0f;    // [-2, 2]
  std::optional<uint64_t> seed;      // unset: the Sampler picks one at random
  int32_t max_tokens = 16;           // >= 1; output tokens, the stop token included
  // [0, max_tokens]: before this many output tokens, eos and stop_token_ids are masked out of
  // the sampled distribution, and no stop (token or string) ends the output.
  int32_t min_tokens = 0;
  // Added to the raw logits first (before penalties); unique ids, bias in [-kMaxLogitBias,
  // kMaxLogitBias], at most kMaxLogitBiasEntries entries.
  std::vector<TokenBias> logit_bias;
  std::vector<int32_t> stop_token_ids;  // extra stop tokens besides the model's eos
  std::vector<std::string> stop;        // stop strings, at most kMaxStopStrings, non-empty
  bool ignore_eos = false;           // keep generating past eos (stop_token_ids still stop)
  // A matched stop string, or a stop token's text, stays at the end of the output. Like `stop`,
  // this is the router's business (its StopChecker) and is not sent to instances.
  bool include_stop_str_in_output = false;
  bool logprobs = false;             // report the sampled token's logprob
  int32_t top_logprobs = 0;          // [0, kMaxTopLogprobs]; needs logprobs
  LogprobsMode logprobs_mode = LogprobsMode::kRaw;

  // Temperatures below this sample greedily, as vLLM's do: the distribution is the argmax's
  // anyway, and logit / temperature would overflow float for tiny ones (every logit -inf, or
  // NaN weights, where a model's logits are all negative or some positive).
  static constexpr float kGreedyTemperature = 1e-5f;
  bool greedy() const { return temperature < kGreedyTemperature; }

  // InvalidArgument naming the first bad field, e.g. "temperature must be in [0, 2], got 3".
  Status Validate() const;
  // Validate() plus the checks that need the model: token ids (stop_token_ids, logit_bias) in
  // [0, vocab_size).
  Status ValidateForVocab(int32_t vocab_size) const;
};

struct TokenLogprob {
  int32_t token_id = -1;
  float logprob = 0.0f;
};

// One generated token as it travels from the engine that sampled it, over the control wire,
// to the router: the id, its logprob (meaningful when SamplingParams::logprobs) and the
// SamplingParams::top_logprobs most likely alternatives, best first.
struct GeneratedToken {
  int32_t token_id = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;
};

}  // namespace tandem
