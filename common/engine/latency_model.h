// The latency model of an instance: how long a prefill batch and a decode step take, as a
// function of what is in the batch. Fitted by `tandem profile` from measurements on this
// hardware (cluster/profile.h), read by the router's goodput policy (router/placement.h) and by
// the cluster simulator and planner (cluster/simulator.h, cluster/planner.h).
//
// The form is DistServe's (OSDI'24, section 4 / appendix):
//   prefill batch seconds  = c1 + c2 * sum_i(l_i) + c3 * sum_i(l_i^2)      l_i: prompt lengths
//   decode step seconds    = c4 + c5 * batch + c6 * sum_i(context_i)
// c1/c4 hold the per-step fixed cost (on CPU: reading the weights once), c2 the per-token GEMM
// work, c3 attention over the prompt, c5 per-sequence overhead, c6 attention reads of the KV.
// A mixed step (colocated, chunked prefill: some sequences add a chunk of n_j new tokens on top
// of p_j already computed, the others decode one token) costs
//   max(c1, c4) + c2 * sum_j(n_j) + c3 * sum_j(n_j * (n_j + 2 p_j))
//               + c5 * decode_batch + c6 * sum_i(context_i)
// (n * (n + 2p) is the attention work of a chunk relative to a whole prompt's l^2).
//
// A file holds one entry per instance shape (device, threads, tensor and pipeline degree):
//
//   # written by tandem profile on <host>, <date>
//   latency_model:
//     - model: medium             # preset or path it was measured with
//       device: cpu               # cpu|cuda (or a free-form GPU name: h100)
//       threads: 1
//       tensor_parallel: 1
//       pipeline_parallel: 1
//       role: colocated           # optional: only for instances of this role (see below)
//       prefill: {c1: 0.004, c2: 0.0036, c3: 1.0e-7}
//       decode: {c4: 0.030, c5: 0.0011, c6: 2.0e-7}
//       kv_bytes_per_token: 24576  # KV of one token, all layers
//       max_batch_size: 64         # optional: what the profile covered
//       fit: {prefill_r2: 0.998, decode_r2: 0.995, prefill_max_rel_error: 0.06, ...}
//   transfer:                      # optional: the KV link between instances
//     latency_s: 0.0005
//     bytes_per_s: 2.0e9
//
// role (prefill|decode|colocated, optional): the same shape can run differently in different
// roles, because what a core can do depends on what its neighbours run (two cores decoding at
// once share the DRAM bandwidth that each decode step streams the weights with). An instance
// uses the entry of its shape and role, else the entry of its shape without a role.
//
// Loading validates like the cluster config: unknown keys and bad values are errors naming the
// file, line and field. Coefficients may be negative only where the fit says so (c3, c6 >= 0 is
// not enforced: a fit is a fit), but every prediction is clamped to >= 0.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tandem {

struct FitQuality {
  double prefill_r2 = 0;
  double decode_r2 = 0;
  double prefill_max_rel_error = 0;  // max |predicted - measured| / measured over the profile
  double decode_max_rel_error = 0;
};

struct LatencyModel {
  std::string model;
  std::string device = "cpu";
  std::string role;  // "" = any role; else prefill|decode|colocated (IsLatencyModelRole)
  int threads = 1;
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  double c1 = 0, c2 = 0, c3 = 0;  // prefill
  double c4 = 0, c5 = 0, c6 = 0;  // decode
  double kv_bytes_per_token = 0;
  int max_batch_size = 0;  // 0 = not recorded
  FitQuality fit;

  // One prefill batch of prompts with these lengths.
  double PrefillSeconds(std::span<const int64_t> prompt_lengths) const;
  // Same, from the sums (sum of l, sum of l^2).
  double PrefillSeconds(double sum_tokens, double sum_tokens_squared) const;
  // One decode step of `batch` sequences whose contexts add up to `sum_context` tokens. Linear,
  // so at a mean batch and mean context (fractional) it is the mean of the steps' times.
  double DecodeStepSeconds(double batch, double sum_context) const;

  // One mixed step (see the header comment). chunk_new[j] / chunk_past[j]: new and already
  // computed tokens of prefill chunk j; decode_batch sequences decoding with sum_context total.
  double MixedStepSeconds(std::span<const int64_t> chunk_new, std::span<const int64_t> chunk_past,
                          int64_t decode_batch, double sum_context) const;
};

struct TransferModel {
  double latency_s = 0;      // per transfer
  double bytes_per_s = 0;    // 0 = instantaneous
  double Seconds(double bytes) const;
};

struct LatencyModelFile {
  std::vector<LatencyModel> entries;
  TransferModel transfer;
  std::string source;  // file it came from, for messages

  // The entry for this shape and role (exactly: "" finds only an entry without a role), or
  // nullptr. device "" matches any device.
  const LatencyModel* Find(const std::string& device, int threads, int tensor_parallel = 1,
                           int pipeline_parallel = 1, const std::string& role = "") const;
  // The entry that predicts for an instance configured with this shape (a config section's
  // device/threads/tensor_parallel/pipeline_parallel), or nullptr. A GPU instance says device
  // "cuda" while a GPU latency model names the GPU ("h100"): "cuda" matches any non-cpu entry.
  // threads only distinguish CPU entries. An entry for `role` wins over one without a role.
  // The router and the simulator both use this rule.
  const LatencyModel* ForInstance(const std::string& device, int threads, int tensor_parallel,
                                  int pipeline_parallel, const std::string& role = "") const;
};

// A role an entry may name: prefill, decode or colocated ("" is no role, not a role).
bool IsLatencyModelRole(const std::string& role);

// Loads and validates (errors: "lm.yaml:7:9: latency_model[0].prefill.c2: must be a number").
StatusOr<LatencyModelFile> LoadLatencyModel(const std::string& path);
StatusOr<LatencyModelFile> ParseLatencyModel(const std::string& yaml_text,
                                             const std::string& source_name);
// YAML that ParseLatencyModel reads back exactly (round trip); `comment` goes on top as "# ...".
std::string LatencyModelToYaml(const LatencyModelFile& file, const std::string& comment = "");

// Least-squares fits (columns scaled for conditioning). Each sample is one measured batch/step.
// Prefill: ordinary least squares. Decode: least relative squared error (rows weighted by
// 1 / seconds), so that batch-1 steps are fitted as closely as batch-64 ones (an ordinary fit
// let the long steps set the line and overshot batch 1-2 by 10-15%). Returns the coefficients
// with R^2 and max relative error filled in.
struct PrefillSample {
  double sum_tokens = 0, sum_tokens_squared = 0, seconds = 0;
};
struct DecodeSample {
  double batch = 0, sum_context = 0, seconds = 0;
};
// Fill model.c1..c3 (and fit.prefill_*) / model.c4..c6 (and fit.decode_*). InvalidArgument when
// there are fewer samples than coefficients or the system is singular.
Status FitPrefill(std::span<const PrefillSample> samples, LatencyModel* model);
Status FitDecode(std::span<const DecodeSample> samples, LatencyModel* model);

}  // namespace tandem
