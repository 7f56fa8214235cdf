#include "cluster/workload.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

namespace tandem {
namespace {

// The three shapes. Medians are fractions of max_model_len; sigma is the log-normal spread.
// chatbot: ShareGPT's inputs and outputs are both broad (DistServe fig. 8: long tails);
// code: HumanEval prompts and completions are short and narrow; summarization: LongBench
// inputs are long and comparatively uniform, outputs short.
// chatbot-history: ShareGPT as DistServe prepared it (its artifact's 0-prepare-dataset.py:
// conversations of 3+ turns, each prompt the joined history of a random number of turns, pairs
// over 2048 tokens dropped). Fitted to the lengths of its OPT-13B ShareGPT requests
// (simdistserve/benchmarks/alignment/data-ground-truth/opt-13b-sharegpt-workload, first 219):
// input mean/median/p90 778/740/1521 of 2048, output 178/66/491 with 16% at <= 10 tokens; at
// max_model_len 2048 this shape gives 838/738/1525 and 172/66/505 with 12.5% at <= 10.
const WorkloadShape kShapes[] = {
    {"chatbot", {0.10, 0.8, 4}, {0.06, 0.8, 4}},
    {"chatbot-history", {0.36, 0.6, 4}, {0.032, 1.6, 4}},
    {"code", {0.04, 0.5, 8}, {0.03, 0.6, 4}},
    {"summarization", {0.40, 0.35, 16}, {0.03, 0.5, 4}},
};

// Portable sampling: the standard fixes mt19937_64's output sequence but not the algorithms of
// std::*_distribution, so the transforms are written out here (same workload on every machine).
class Sampler {
 public:
  explicit Sampler(uint64_t seed) : engine_(seed) {}

  // Uniform in (0, 1).
  double Uniform() {
    double u = static_cast<double>(engine_() >> 11) * 0x1.0p-53;
    return u > 0 ? u : 0x1.0p-54;
  }
  double Normal() {  // Box-Muller, one value per call (keeps the stream simple)
    double u1 = Uniform(), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  double Exponential(double rate) { return -std::log(Uniform()) / rate; }

 private:
  std::mt19937_64 engine_;
};

int32_t SampleLength(Sampler& sampler, const LengthDistribution& d, int32_t max_model_len,
                     int32_t upper) {
  double median = std::max(1.0, d.median_fraction * max_model_len);
  double x = median * std::exp(d.sigma * sampler.Normal());
  int64_t n = std::llround(x);
  n = std::clamp<int64_t>(n, d.min_tokens, std::max<int64_t>(d.min_tokens, upper));
  return static_cast<int32_t>(n);
}

std::string Where(const std::string& path, int line) {
  return path + ":" + std::to_string(line) + ": ";
}

}  // namespace

StatusOr<WorkloadShape> WorkloadShapeByName(std::string_view name) {
  for (const WorkloadShape& shape : kShapes)
    if (shape.name == name) return shape;
  return InvalidArgument("unknown workload '" + std::string(name) + "' (expected " +
                         WorkloadNameList() + ")");
}

std::string WorkloadNameList() {
  std::string names;
  for (const WorkloadShape& shape : kShapes) names += (names.empty() ? "" : "|") + shape.name;
  return names;
}

std::vector<std::string> WorkloadNames() {
  std::vector<std::string> names;
  for (const WorkloadShape& shape : kShapes) names.push_back(shape.name);
  return names;
}

std::vector<WorkloadRequest> GenerateWorkload(const WorkloadShape& shape,
                                              const WorkloadOptions& options) {
  Sampler sampler(options.seed);
  std::vector<WorkloadRequest> requests;
  requests.reserve(static_cast<size_t>(std::max<int64_t>(options.num_requests, 0)));
  const int32_t budget = std::max(options.max_model_len, 2);
  double t = 0;
  for (int64_t i = 0; i < options.num_requests; ++i) {
    WorkloadRequest r;
    r.id = i;
    if (options.rate > 0) {
      t += sampler.Exponential(options.rate);
      r.arrival_s = t;
    }
    // Output first (it is the shorter one), then the prompt gets what is left of the budget.
    r.max_tokens = SampleLength(sampler, shape.output, budget, budget / 2);
    r.prompt_tokens = SampleLength(sampler, shape.input, budget, budget - r.max_tokens);
    if (r.prompt_tokens + r.max_tokens > budget) r.prompt_tokens = budget - r.max_tokens;
    requests.push_back(std::move(r));
  }
  return requests;
}

StatusOr<std::vector<WorkloadRequest>> LoadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open trace file");
  std::vector<WorkloadRequest> requests;
  std::string text;
  int line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return InvalidArgument(Where(path, line) + "not a JSON object");
    WorkloadRequest r;
    r.id = static_cast<int64_t>(requests.size());
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& key = it.key();
      const nlohmann::json& v = it.value();
      if (key == "prompt") {
        if (!v.is_string()) return InvalidArgument(Where(path, line) + "prompt: must be a string");
        r.prompt_text = v.get<std::string>();
      } else if (key == "prompt_tokens") {
        if (v.is_number_integer()) {
          if (v.get<int64_t>() < 1 || v.get<int64_t>() > std::numeric_limits<int32_t>::max())
            return InvalidArgument(Where(path, line) + "prompt_tokens: must be >= 1");
          r.prompt_tokens = v.get<int32_t>();
        } else if (v.is_array() && !v.empty()) {
          for (const nlohmann::json& id : v) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
                id.get<int64_t>() > std::numeric_limits<int32_t>::max())
              return InvalidArgument(Where(path, line) +
                                     "prompt_tokens: list entries must be token ids >= 0");
            r.prompt_token_ids.push_back(id.get<int32_t>());
          }
          r.prompt_tokens = static_cast<int32_t>(r.prompt_token_ids.size());
        } else {
          return InvalidArgument(Where(path, line) +
                                 "prompt_tokens: must be a count or a non-empty list of ids");
        }
      } else if (key == "max_tokens") {
        if (!v.is_number_integer() || v.get<int64_t>() < 1 ||
            v.get<int64_t>() > std::numeric_limits<int32_t>::max())
          return InvalidArgument(Where(path, line) + "max_tokens: must be an integer >= 1");
        r.max_tokens = v.get<int32_t>();
      } else if (key == "arrival_s") {
        if (!v.is_number() || v.get<double>() < 0 || !std::isfinite(v.get<double>()))
          return InvalidArgument(Where(path, line) + "arrival_s: must be a number >= 0");
        r.arrival_s = v.get<double>();
      } else {
        return InvalidArgument(Where(path, line) + key + ": unknown field");
      }
    }
    bool has_text = j.contains("prompt"), has_tokens = j.contains("prompt_tokens");
    if (has_text == has_tokens)
      return InvalidArgument(Where(path, line) +
                             "prompt: exactly one of 'prompt' and 'prompt_tokens' is required");
    if (!j.contains("max_tokens"))
      return InvalidArgument(Where(path, line) + "max_tokens: missing");
    if (!j.contains("arrival_s"))
      return InvalidArgument(Where(path, line) + "arrival_s: missing");
    if (has_text) r.prompt_tokens = -1;
    if (!requests.empty() && r.arrival_s < requests.back().arrival_s)
      return InvalidArgument(Where(path, line) + "arrival_s: must not decrease (got " +
                             std::to_string(r.arrival_s) + " after " +
                             std::to_string(requests.back().arrival_s) + ")");
    requests.push_back(std::move(r));
  }
  return requests;
}

std::string TraceToJsonl(const std::vector<WorkloadRequest>& requests) {
  std::string out;
  for (const WorkloadRequest& r : requests) {
    nlohmann::json j;
    if (!r.prompt_text.empty()) {
      j["prompt"] = r.prompt_text;
    } else if (!r.prompt_token_ids.empty()) {
      j["prompt_tokens"] = r.prompt_token_ids;
    } else {
      j["prompt_tokens"] = r.prompt_tokens;
    }
    j["max_tokens"] = r.max_tokens;
    j["arrival_s"] = r.arrival_s;
    out += j.dump() + "\n";
  }
  return out;
}

double TpotSeconds(double e2e_s, double ttft_s, int32_t output_tokens) {
  if (output_tokens <= 1) return 0;
  return std::max(0.0, e2e_s - ttft_s) / static_cast<double>(output_tokens - 1);
}

namespace {
bool MeetsTtft(const RequestOutcome& o, const Slo& slo) {
  return o.ok && (slo.ttft_s <= 0 || o.ttft_s <= slo.ttft_s);
}
bool MeetsTpot(const RequestOutcome& o, const Slo& slo) {
  return o.ok && (slo.tpot_s <= 0 || o.tpot_s <= slo.tpot_s);
}
}  // namespace

bool MeetsSlo(const RequestOutcome& outcome, const Slo& slo) {
  return MeetsTtft(outcome, slo) && MeetsTpot(outcome, slo);
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(rank));
  size_t hi = std::min(lo + 1, values.size() - 1);
  double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

RunSummary Summarize(const std::vector<RequestOutcome>& outcomes, const Slo& slo,
                     double duration_s) {
  RunSummary s;
  s.requests = static_cast<int64_t>(outcomes.size());
  if (outcomes.empty()) return s;
  std::vector<double> ttft, tpot, e2e;
  int64_t met = 0, met_ttft = 0, met_tpot = 0, output_tokens = 0;
  double first = std::numeric_limits<double>::infinity(), last = 0;
  for (const RequestOutcome& o : outcomes) {
    first = std::min(first, o.arrival_s);
    if (o.rejected) {
      ++s.rejected;
    } else if (!o.ok) {
      ++s.failed;
    } else {
      ++s.completed;
      ttft.push_back(o.ttft_s);
      tpot.push_back(o.tpot_s);
      e2e.push_back(o.e2e_s);
      output_tokens += o.output_tokens;
      last = std::max(last, o.arrival_s + o.e2e_s);
    }
    met += MeetsSlo(o, slo);
    met_ttft += MeetsTtft(o, slo);
    met_tpot += MeetsTpot(o, slo);
  }
  s.duration_s = duration_s > 0 ? duration_s : std::max(0.0, last - first);
  if (s.duration_s > 0) {
    s.throughput_rps = static_cast<double>(s.completed) / s.duration_s;
    s.output_tokens_per_s = static_cast<double>(output_tokens) / s.duration_s;
  }
  s.ttft_p50 = Percentile(ttft, 50), s.ttft_p90 = Percentile(ttft, 90);
  s.ttft_p99 = Percentile(ttft, 99);
  s.tpot_p50 = Percentile(tpot, 50), s.tpot_p90 = Percentile(tpot, 90);
  s.tpot_p99 = Percentile(tpot, 99);
  s.e2e_p50 = Percentile(e2e, 50), s.e2e_p90 = Percentile(e2e, 90);
  s.e2e_p99 = Percentile(e2e, 99);
  double n = static_cast<double>(s.requests);
  s.attainment = static_cast<double>(met) / n;
  s.ttft_attainment = static_cast<double>(met_ttft) / n;
  s.tpot_attainment = static_cast<double>(met_tpot) / n;
  return s;
}

nlohmann::json SummaryToJson(const RunSummary& s) {
  return {{"requests", s.requests},
          {"completed", s.completed},
          {"rejected", s.rejected},
          {"failed", s.failed},
          {"duration_s", s.duration_s},
          {"throughput_rps", s.throughput_rps},
          {"output_tokens_per_s", s.output_tokens_per_s},
          {"ttft_p50", s.ttft_p50},
          {"ttft_p90", s.ttft_p90},
          {"ttft_p99", s.ttft_p99},
          {"tpot_p50", s.tpot_p50},
          {"tpot_p90", s.tpot_p90},
          {"tpot_p99", s.tpot_p99},
          {"e2e_p50", s.e2e_p50},
          {"e2e_p90", s.e2e_p90},
          {"e2e_p99", s.e2e_p99},
          {"attainment", s.attainment},
          {"ttft_attainment", s.ttft_attainment},
          {"tpot_attainment", s.tpot_attainment}};
}

nlohmann::json OutcomesToJson(const std::vector<RequestOutcome>& outcomes,
                              const std::vector<int32_t>& max_tokens) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const RequestOutcome& o = outcomes[i];
    nlohmann::json j = {{"id", o.id},
                        {"arrival_s", o.arrival_s},
                        {"prompt_tokens", o.prompt_tokens},
                        {"output_tokens", o.output_tokens},
                        {"ok", o.ok},
                        {"rejected", o.rejected},
                        {"error", o.error},
                        {"ttft_s", o.ttft_s},
                        {"tpot_s", o.tpot_s},
                        {"e2e_s", o.e2e_s}};
    if (i < max_tokens.size()) j["max_tokens"] = max_tokens[i];
    if (!o.placed_on.empty()) j["placed_on"] = o.placed_on;
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<RequestOutcome> OutcomesFromJson(const nlohmann::json& requests) {
  std::vector<RequestOutcome> out;
  if (!requests.is_array()) return out;
  for (const nlohmann::json& j : requests) {
    RequestOutcome o;
    o.id = j.value("id", int64_t{0});
    o.arrival_s = j.value("arrival_s", 0.0);
    o.prompt_tokens = j.value("prompt_tokens", 0);
    o.output_tokens = j.value("output_tokens", 0);
    o.ok = j.value("ok", false);
    o.rejected = j.value("rejected", false);
    o.error = j.value("error", std::string());
    o.ttft_s = j.value("ttft_s", 0.0);
    o.tpot_s = j.value("tpot_s", 0.0);
    o.e2e_s = j.value("e2e_s", 0.0);
    o.placed_on = j.value("placed_on", std::string());
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace tandem
