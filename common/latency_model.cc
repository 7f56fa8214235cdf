#include "common/latency_model.h"

#include <algorithm>

namespace tandem {

double LatencyModel::PrefillSeconds(std::span<const int64_t> prompt_lengths) const {
  double sum = 0, sum_sq = 0;
  for (int64_t l : prompt_lengths) {
    sum += static_cast<double>(l);
    sum_sq += static_cast<double>(l) * static_cast<double>(l);
  }
  return PrefillSeconds(sum, sum_sq);
}

double LatencyModel::PrefillSeconds(double sum_tokens, double sum_tokens_squared) const {
  return std::max(0.0, c1 + c2 * sum_tokens + c3 * sum_tokens_squared);
}

double LatencyModel::DecodeStepSeconds(int64_t batch, double sum_context) const {
  return std::max(0.0, c4 + c5 * static_cast<double>(batch) + c6 * sum_context);
}

double LatencyModel::MixedStepSeconds(std::span<const int64_t> chunk_new,
                                      std::span<const int64_t> chunk_past, int64_t decode_batch,
                                      double sum_context) const {
  double tokens = 0, attention = 0;
  for (size_t j = 0; j < chunk_new.size(); ++j) {
    double n = static_cast<double>(chunk_new[j]);
    double p = j < chunk_past.size() ? static_cast<double>(chunk_past[j]) : 0.0;
    tokens += n;
    attention += n * (n + 2.0 * p);
  }
  double fixed = chunk_new.empty() ? c4 : (decode_batch > 0 ? std::max(c1, c4) : c1);
  return std::max(0.0, fixed + c2 * tokens + c3 * attention +
                           c5 * static_cast<double>(decode_batch) + c6 * sum_context);
}

double TransferModel::Seconds(double bytes) const {
  return latency_s + (bytes_per_s > 0 ? bytes / bytes_per_s : 0.0);
}

const LatencyModel* LatencyModelFile::Find(const std::string& device, int threads,
                                           int tensor_parallel, int pipeline_parallel) const {
  for (const LatencyModel& m : entries) {
    if (!device.empty() && m.device != device) continue;
    if (m.threads == threads && m.tensor_parallel == tensor_parallel &&
        m.pipeline_parallel == pipeline_parallel)
      return &m;
  }
  return nullptr;
}

}  // namespace tandem
