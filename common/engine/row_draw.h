// Sampling a row where its logits are: the draw of Sampler::Sample (common/engine/sampling.h)
// for the rows that need nothing but the logits and a few numbers (temperature, top-k, top-p,
// min-p and the position's uniform), so that a device backend can sample them without copying
// the logits back (cuda::DrawRows, common/engine/cuda/kernels.h). The host function here,
// DrawRow, is that kernel's algorithm and its reference: the CPU tests check it against the
// Sampler, cuda_kernels_check checks the kernel against it. The draw's steps are the same on
// both; the top logprobs' ids are found by a sort on the host and by a count descent on the
// device (the same ids: the key order is total). Rows with logit_bias, penalties or a
// min_tokens mask get their score edits first (common/engine/score_edits.h).
//
// The algorithm needs no sort, so that one thread block can do a row of any vocabulary: every
// question about the row is a "radix descent" over 8-bit digits of a unique 64-bit key per
// token. A pass builds a 256-bin histogram (a count or a probability mass) of the tokens whose
// key starts with the digits chosen so far and picks the next digit from it; after the last
// pass the key, and so the token, is known.
//   1. scores s = logit / temperature (float, as the Sampler), max over the usable ones
//      (NaN and -inf are not);
//   2. top-k: the k-th largest score (a descent by counts over the score's bits); kept: s >= it;
//   3. weights w = exp(s - max) in double (RowWeight), summed as integers of 2^-40
//      (FixedMass): exact in any order, so the device's sums (atomics, in no fixed order) do not
//      depend on the order either, and a row draws the same token on every run and batch;
//   4. top-p: the last kept token in score order (higher first, lower id on ties) is where the
//      mass from the top first reaches top_p * (mass of what top-k kept): kept are the tokens
//      whose mass before them is below that, as the Sampler's ascending cut (HF's) keeps;
//   5. min-p: kept w >= min_p (the top token's w is 1);
//   6. the draw: the first kept token, in the Sampler's order (score order when top_p < 1,
//      else token id order), where the cumulative mass exceeds u * (the kept mass); if
//      rounding leaves none, the last kept token.
// The device's is cuda::DrawRows (common/engine/cuda/draw_rows.cu), the same stages with block
// reductions and shared-memory histograms.
// Equal to Sampler::Sample's token except where a cut or the draw's u falls within about 2^-40
// of the total mass of a boundary (the Sampler sums doubles): never seen in the tests' rows.
// The device's token is the host's except where its exp (within 1 ulp) rounds a weight to
// another 2^-40 unit than glibc's and the draw lands in that unit (odds ~1e-14 a row).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

#include "common/engine/sampling_params.h"

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

namespace tandem {

// RowDraw::draw: what the backend does with the row.
inline constexpr int32_t kRowNotDrawn = 0;  // its logits go to the host, or it is plain greedy
inline constexpr int32_t kRowDrawn = 1;     // the draw below
inline constexpr int32_t kRowArgmax = 2;    // greedy with logprobs: its argmax (ArgmaxRow's:
                                            // lowest id among the largest) and its logprobs

// What a row's draw needs (Sampler::NextRowDraw). `draw` kRowNotDrawn: the row is not drawn
// here; kRowArgmax: only top_logprobs counts (temperature 1, no warpers).
struct RowDraw {
  float temperature = 1.0f;  // > 0
  int32_t top_k = 0;         // <= 0: off
  float top_p = 1.0f;        // (0, 1]
  float min_p = 0.0f;        // [0, 1]
  double u = 0.0;            // the position's uniform in [0, 1) (Sampler::Uniform)
  int32_t draw = kRowNotDrawn;
  // -1: no logprobs; else the drawn token's logprob and this many top ones (<=
  // kMaxTopLogprobs), of the raw distribution (log-softmax of the logits as given: the
  // Sampler's default LogprobsMode::kRaw).
  int32_t top_logprobs = -1;
};

// A drawn row's logprobs (RowDraw::top_logprobs >= 0), as Sampler::Sample reports them: the
// token's, and the top ones most likely first (ties: lower id first; masked: -inf).
struct RowLogprobs {
  float logprob = 0.0f;
  int32_t num_top = 0;
  int32_t top_ids[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};
};

// The token DrawRow picks (kRowDrawn: the draw; kRowArgmax: the argmax), -1 when no logit is
// usable. With draw.top_logprobs >= 0 and `logprobs` given, also its logprobs.
int32_t DrawRow(std::span<const float> logits, const RowDraw& draw,
                RowLogprobs* logprobs = nullptr);

namespace row_draw {

inline constexpr int kDigits = 256;  // a pass's bins (8 bits)

// The score's bits as an unsigned integer whose order is the scores' (IEEE order); -0 is +0,
// as the Sampler's comparisons have it.
TANDEM_HOST_DEVICE inline uint32_t ScoreKey(float score) {
  if (score == 0.0f) score = 0.0f;
  uint32_t bits;
  memcpy(&bits, &score, sizeof bits);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// Ascending = the Sampler's score order: higher score first, then lower id.
TANDEM_HOST_DEVICE inline uint64_t ScoreOrderKey(float score, int32_t id) {
  return (static_cast<uint64_t>(~ScoreKey(score)) << 32) | static_cast<uint32_t>(id);
}

// A token's weight exp(s - max) in double; where the largest score is +inf (an overflowed row),
// the +inf tokens share the row and the rest weigh nothing (not inf - inf = NaN).
TANDEM_HOST_DEVICE inline double RowWeight(float s, float max_score) {
  if (max_score == static_cast<float>(INFINITY)) return s == max_score ? 1.0 : 0.0;
  return exp(static_cast<double>(s) - static_cast<double>(max_score));
}

// A weight in [0, 1] as an integer of 2^-40: a row's total (at most 2^18 tokens) fits 58 bits.
TANDEM_HOST_DEVICE inline uint64_t FixedMass(double w) {
  if (!(w > 0)) return 0;  // NaN too
  return static_cast<uint64_t>((w < 1 ? w : 1) * 0x1p40 + 0.5);
}

// The top-p target: the least integer mass >= top_p * total.
TANDEM_HOST_DEVICE inline uint64_t TopPReach(float top_p, uint64_t total) {
  const double reach = static_cast<double>(top_p) * static_cast<double>(total);
  const uint64_t floor = static_cast<uint64_t>(reach);
  return static_cast<double>(floor) < reach ? floor + 1 : floor;
}

// The draw's target: the cumulative mass must exceed u * kept (floor: integers exceed it
// exactly when they exceed its floor).
TANDEM_HOST_DEVICE inline uint64_t DrawTarget(double u, uint64_t kept) {
  return static_cast<uint64_t>(u * static_cast<double>(kept));
}

// One pass of a descent that looks for the first key (ascending) at which a running total
// of the bins reaches `target`: `hist` holds the mass (or count) of this pass's bins, `below`
// the total of every key under the bins. Returns the digit, with `below` advanced past the
// bins under it, or -1 when the bins' total stays short of target. `inclusive`: reaching
// means >= target, else > target.
TANDEM_HOST_DEVICE inline int ChooseDigit(const unsigned long long* hist, uint64_t* below,
                                          uint64_t target, bool inclusive) {
  uint64_t total = *below;
  for (int d = 0; d < kDigits; ++d) {
    const uint64_t next = total + hist[d];
    if (hist[d] > 0 && (inclusive ? next >= target : next > target)) {
      *below = total;
      return d;
    }
    total = next;
  }
  return -1;
}

}  // namespace row_draw
}  // namespace tandem
