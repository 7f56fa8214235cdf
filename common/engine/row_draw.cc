#include "common/engine/row_draw.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "common/engine/sampling.h"  // ArgmaxRow

namespace tandem {
namespace {

using namespace row_draw;  // the steps both sides share

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The row as every pass sees it; the stages' results narrow what later passes include.
struct RowView {
  std::span<const float> logits;
  const RowDraw& d;
  float max_score = kNegInf;
  bool top_k_on = false;
  uint32_t kth_desc = 0;  // ~ScoreKey of the k-th largest score: kept are keys <= it
  bool cut_on = false;
  uint64_t cut_key = 0;  // top-p: kept are ScoreOrderKeys <= it

  float Score(size_t i) const { return logits[i] / d.temperature; }
  static bool Usable(float s) { return s > kNegInf; }  // NaN is not
  double Weight(float s) const { return RowWeight(s, max_score); }
  uint64_t Mass(float s) const { return FixedMass(Weight(s)); }
  // Kept by top-k (and usable): what top-p weighs.
  bool KeptTopK(float s) const { return Usable(s) && (!top_k_on || ~ScoreKey(s) <= kth_desc); }
  // Kept by every warper: what the draw weighs.
  bool Kept(float s, size_t i) const {
    if (!KeptTopK(s)) return false;
    if (cut_on && ScoreOrderKey(s, static_cast<int32_t>(i)) > cut_key) return false;
    return d.min_p <= 0.0f || Weight(s) >= static_cast<double>(d.min_p);
  }
};

// A descent over the low `bits` bits of key(i) (unique per included token): the first key,
// ascending, at which the running total of mass(i) reaches target (ChooseDigit). `mass` 0
// leaves a token out.
template <typename KeyFn, typename MassFn>
std::optional<uint64_t> Descend(size_t n, int bits, KeyFn key, MassFn mass, uint64_t target,
                                bool inclusive) {
  uint64_t prefix = 0;  // the digits chosen so far, in place
  uint64_t below = 0;
  for (int shift = bits - 8; shift >= 0; shift -= 8) {
    std::array<unsigned long long, kDigits> hist{};
    const uint64_t high_mask = shift + 8 >= 64 ? 0 : ~uint64_t{0} << (shift + 8);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t m = mass(i);
      if (m == 0) continue;
      const uint64_t k = key(i);
      if ((k & high_mask) != (prefix & high_mask)) continue;
      hist[(k >> shift) & 0xff] += m;
    }
    const int digit = ChooseDigit(hist.data(), &below, target, inclusive);
    if (digit < 0) return std::nullopt;
    prefix |= static_cast<uint64_t>(digit) << shift;
  }
  return prefix;
}

// Sampler::FillLogprobs in its raw mode: log-softmax of the logits as given (usable ones; the
// rest -inf), the token's and the top `top` by (logit, lower id), most likely first.
void RawLogprobs(std::span<const float> logits, int32_t token, int32_t top, RowLogprobs* out) {
  float max_value = kNegInf;
  for (float v : logits)
    if (RowView::Usable(v)) max_value = std::max(max_value, v);
  double sum = 0.0;
  for (float v : logits)
    if (RowView::Usable(v)) sum += std::exp(static_cast<double>(v) - max_value);
  const double log_z = max_value + std::log(sum);
  auto logprob = [&](size_t t) {
    return RowView::Usable(logits[t]) ? static_cast<float>(logits[t] - log_z) : kNegInf;
  };
  out->logprob = logprob(static_cast<size_t>(token));
  const size_t n = std::min<size_t>(static_cast<size_t>(std::max(top, 0)), logits.size());
  std::vector<uint64_t> keys(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    keys[i] = ScoreOrderKey(RowView::Usable(logits[i]) ? logits[i] : kNegInf, int32_t(i));
  std::partial_sort(keys.begin(), keys.begin() + n, keys.end());
  out->num_top = static_cast<int32_t>(n);
  for (size_t j = 0; j < n; ++j) {
    out->top_ids[j] = static_cast<int32_t>(keys[j] & 0xffffffffu);
    out->top_logprobs[j] = logprob(keys[j] & 0xffffffffu);
  }
}

// The draw itself (DrawRow without the logprobs).
int32_t DrawToken(std::span<const float> logits, const RowDraw& draw) {
  RowView row{logits, draw};
  const size_t n = logits.size();
  size_t usable = 0;
  for (size_t i = 0; i < n; ++i) {
    const float s = row.Score(i);
    if (!RowView::Usable(s)) continue;
    ++usable;
    row.max_score = std::max(row.max_score, s);
  }
  if (usable == 0) return -1;

  // 2. top-k: the k-th key of the usable ones, higher score first (counts).
  if (draw.top_k > 0 && static_cast<size_t>(draw.top_k) < usable) {
    const std::optional<uint64_t> kth = Descend(
        n, 32, [&](size_t i) { return uint64_t{~ScoreKey(row.Score(i))}; },
        [&](size_t i) { return uint64_t{RowView::Usable(row.Score(i))}; },
        static_cast<uint64_t>(draw.top_k), true);
    row.top_k_on = kth.has_value();  // always found: top_k < usable
    row.kth_desc = static_cast<uint32_t>(kth.value_or(0));
  }

  // 4. top-p: where the mass from the top first reaches top_p of what top-k kept.
  auto score_order = [&](size_t i) { return ScoreOrderKey(row.Score(i), int32_t(i)); };
  if (draw.top_p < 1.0f) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      const float s = row.Score(i);
      if (row.KeptTopK(s)) total += row.Mass(s);
    }
    const std::optional<uint64_t> cut = Descend(
        n, 64, score_order,
        [&](size_t i) {
          const float s = row.Score(i);
          return row.KeptTopK(s) ? row.Mass(s) : 0;
        },
        TopPReach(draw.top_p, total), true);
    row.cut_on = cut.has_value();  // not found (rounding, top_p near 1): nothing cut
    row.cut_key = cut.value_or(0);
  }

  // 6. the draw, over what every warper kept.
  uint64_t kept_mass = 0;
  for (size_t i = 0; i < n; ++i) {
    const float s = row.Score(i);
    if (row.Kept(s, i)) kept_mass += row.Mass(s);
  }
  auto kept_weight = [&](size_t i) {
    const float s = row.Score(i);
    return row.Kept(s, i) ? row.Mass(s) : 0;
  };
  // The Sampler walks its candidates in score order after top-p, else in token id order.
  const bool score_walk = draw.top_p < 1.0f;
  const uint64_t target = DrawTarget(draw.u, kept_mass);
  std::optional<uint64_t> chosen =
      score_walk ? Descend(n, 64, score_order, kept_weight, target, false)
                 : Descend(n, 32, [](size_t i) { return uint64_t{i}; }, kept_weight, target, false);
  if (chosen) return static_cast<int32_t>(*chosen & 0xffffffffu);
  // Rounding left the total a hair under u: the last kept token in the walk's order.
  int32_t last = -1;
  uint64_t last_key = 0;
  for (size_t i = 0; i < n; ++i) {
    const float s = row.Score(i);
    if (!row.Kept(s, i)) continue;
    const uint64_t k = score_walk ? score_order(i) : uint64_t{i};
    if (last < 0 || k > last_key) {
      last = static_cast<int32_t>(i);
      last_key = k;
    }
  }
  return last;
}

}  // namespace

int32_t DrawRow(std::span<const float> logits, const RowDraw& draw, RowLogprobs* logprobs) {
  const int32_t token =
      draw.draw == kRowArgmax ? ArgmaxRow(logits) : DrawToken(logits, draw);
  if (token >= 0 && logprobs != nullptr && draw.top_logprobs >= 0)
    RawLogprobs(logits, token, draw.top_logprobs, logprobs);
  return token;
}

}  // namespace tandem
