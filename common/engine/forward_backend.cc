#include "common/engine/forward_backend.h"

#include <cmath>
#include <string>

#include "common/config/serving_config.h"
#include "common/engine/forward.h"
#if TANDEM_HAVE_CUDA
#include "common/engine/cuda/cuda_backend.h"  // TANDEM_HAVE_CUDA: set for this file only
#endif

namespace tandem {

namespace {

// The error for a device this build cannot compute on.
Status UnsupportedDevice(std::string_view device) {
  if (device == "cuda")
    return InvalidArgument(
        "device cuda: this build has no CUDA backend (configure with -DTANDEM_CUDA=ON on a "
        "machine with nvcc); use device cpu");
  return InvalidArgument("device '" + std::string(device) + "': expected cpu or cuda");
}

}  // namespace

bool ForwardBackendHasCuda() {
#if TANDEM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::optional<WeightDType> LoadDTypeFor(std::string_view configured, std::string_view device) {
  if (std::optional<WeightDType> named = ParseWeightDType(configured)) return named;
  if (device == "cuda") return WeightDType::kBF16;
  return std::nullopt;
}

StatusOr<std::unique_ptr<ForwardBackend>> CreateForwardBackend(const Model& model,
                                                               const ForwardOptions& options,
                                                               std::string_view device) {
  if (options.tensor_parallel < 1)
    return InvalidArgument("tensor_parallel must be at least 1, not " +
                           std::to_string(options.tensor_parallel));
  if (device == "cpu") {
    if (options.tensor_parallel > 1)
      return InvalidArgument("tensor_parallel " + std::to_string(options.tensor_parallel) +
                             " on device cpu: a CPU instance is one CpuForward (use threads; "
                             "CreateTpCpuForward is the test reference of the GPU ranks)");
    if (options.kv_dtype != KvDType::kFloat32)
      return InvalidArgument(std::string("kv_cache.dtype ") + KvDTypeName(options.kv_dtype) +
                             " on device cpu: the CPU backend keeps KV in float32");
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CpuForward> cpu, CpuForward::Create(model, options));
    return std::unique_ptr<ForwardBackend>(std::move(cpu));
  }
  if (device == "cuda") {
#if TANDEM_HAVE_CUDA
    return cuda::CreateCudaBackend(model, options);
#endif
  }
  return UnsupportedDevice(device);
}

StatusOr<uint64_t> KvMemoryBudgetBytes(std::string_view device, uint64_t device_reserved_bytes) {
  if (device == "cpu") return MachineMemoryBytes();
#if TANDEM_HAVE_CUDA
  if (device == "cuda") {
    TANDEM_ASSIGN_OR_RETURN(uint64_t total, cuda::CudaDeviceMemoryBytes());
    return total > device_reserved_bytes ? total - device_reserved_bytes : 0;
  }
#endif
  static_cast<void>(device_reserved_bytes);  // a device pool shares its memory with the rest
  return UnsupportedDevice(device);
}

StatusOr<DeviceMemoryNow> DeviceMemoryOf(std::string_view device, int index) {
  if (device == "cpu")
    return InvalidArgument("device cpu: its KV pools are checked against the machine's memory");
#if TANDEM_HAVE_CUDA
  if (device == "cuda") {
    TANDEM_ASSIGN_OR_RETURN(auto free_and_total, cuda::CudaDeviceFreeAndTotalBytes(index));
    return DeviceMemoryNow{free_and_total.first, free_and_total.second};
  }
#endif
  static_cast<void>(index);
  return UnsupportedDevice(device);
}

StatusOr<KvPoolMemory> ForwardBackend::AdoptKvPools(std::vector<KvPoolMemory> pools) {
  if (pools.size() != 1)
    return InvalidArgument(std::to_string(pools.size()) + " KV pools for a backend of one rank");
  return std::move(pools[0]);
}

StatusOr<std::unique_ptr<KvCache>> CreateKvCacheFor(ForwardBackend& backend, int block_size,
                                                    int num_blocks,
                                                    std::vector<KvPoolMemory> pools) {
  const KvLayout layout = backend.MakeKvLayout(block_size);
  KvPoolMemory memory;
  if (pools.empty()) {
    TANDEM_ASSIGN_OR_RETURN(memory, backend.AllocateKvPool(KvPoolBytes(layout, num_blocks)));
  } else {
    TANDEM_ASSIGN_OR_RETURN(memory, backend.AdoptKvPools(std::move(pools)));
  }
  return KvCache::Create(layout, num_blocks, std::move(memory));
}

bool GreedyRows::all_wanted() const {
  for (uint8_t w : wanted)
    if (w == 0) return false;
  return true;
}

bool GreedyRows::wants_logprobs(size_t i) const {
  return drawn(i) && draws[i].top_logprobs >= 0;
}

std::span<const ScoreEdit> GreedyRows::edits_of(size_t i) const {
  if (edit_begin.empty()) return {};
  return edits.subspan(edit_begin[i], edit_begin[i + 1] - edit_begin[i]);
}

Status ValidateGreedyRows(const GreedyRows* greedy, size_t batch_size, LogitsMode mode,
                          int32_t vocab_size) {
  if (greedy == nullptr) return Status::Ok();
  if (mode != LogitsMode::kLastToken)
    return InvalidArgument("forward: greedy rows need LogitsMode::kLastToken");
  if (greedy->wanted.size() != batch_size || greedy->argmax.size() != batch_size ||
      (!greedy->draws.empty() && greedy->draws.size() != batch_size) ||
      (!greedy->logprobs.empty() && greedy->logprobs.size() != batch_size))
    return InvalidArgument("forward: greedy rows do not match the batch");
  for (size_t i = 0; i < greedy->draws.size(); ++i) {
    // The draw kernels hold top_logprobs entries in fixed arrays and divide by the temperature.
    const RowDraw& d = greedy->draws[i];
    if (d.draw != kRowNotDrawn && d.draw != kRowDrawn && d.draw != kRowArgmax)
      return InvalidArgument("forward: row " + std::to_string(i) + " has an unknown draw kind");
    if (d.draw != kRowNotDrawn && (d.top_logprobs < -1 || d.top_logprobs > kMaxTopLogprobs))
      return InvalidArgument("forward: row " + std::to_string(i) + " asks for " +
                             std::to_string(d.top_logprobs) + " top logprobs (at most " +
                             std::to_string(kMaxTopLogprobs) + ")");
    if (d.draw == kRowDrawn && !(d.temperature > 0.0f && d.top_p > 0.0f && d.top_p <= 1.0f &&
                                 d.min_p >= 0.0f && d.min_p <= 1.0f && d.u >= 0.0 && d.u < 1.0))
      return InvalidArgument("forward: row " + std::to_string(i) +
                             " has draw numbers outside their ranges (common/engine/row_draw.h)");
    if (greedy->wants_logprobs(i) && greedy->logprobs.empty())
      return InvalidArgument("forward: a drawn row wants logprobs and GreedyRows has none");
  }
  TANDEM_RETURN_IF_ERROR(
      ValidateScoreEdits(greedy->edits, greedy->edit_begin, batch_size, vocab_size));
  for (size_t i = 0; i + 1 < greedy->edit_begin.size(); ++i) {
    if (greedy->edits_of(i).empty()) continue;
    if (!greedy->wanted[i])
      return InvalidArgument("forward: score edits for a row that is not wanted");
    if (greedy->wants_logprobs(i))
      return InvalidArgument("forward: score edits for a row that wants logprobs (of the "
                             "unedited logits: sample it on the host)");
  }
  return Status::Ok();
}

Status ValidateForwardBatch(const ModelConfig& c, const ForwardOptions& options,
                            std::span<const SequenceInput> batch, const KvLayout& layout,
                            int num_blocks) {
  if (layout.num_layers != c.num_layers || layout.num_kv_heads != c.num_kv_heads ||
      layout.head_dim != c.head_dim)
    return InvalidArgument("forward: KV cache layout (" + layout.ToString() +
                           ") does not match the model");
  if (batch.empty()) return InvalidArgument("forward: empty batch");
  if (static_cast<int>(batch.size()) > options.max_batch_sequences)
    return TooLarge("forward: " + std::to_string(batch.size()) + " sequences exceed " +
                    "max_batch_sequences " + std::to_string(options.max_batch_sequences));
  size_t total = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& seq = batch[i];
    // Built only on error: the steady-state step allocates nothing.
    auto where = [i] { return "forward: sequence " + std::to_string(i); };
    if (seq.tokens.empty()) return InvalidArgument(where() + " has no tokens");
    if (seq.start_position < 0) return InvalidArgument(where() + " has a negative position");
    total += seq.tokens.size();
    for (int32_t token : seq.tokens) {
      if (token < 0 || token >= c.vocab_size)
        return InvalidArgument(where() + ": token id " + std::to_string(token) +
                               " outside the vocabulary of " + std::to_string(c.vocab_size));
    }
    const int64_t end = int64_t{seq.start_position} + static_cast<int64_t>(seq.tokens.size());
    const int64_t blocks_needed = (end + layout.block_size - 1) / layout.block_size;
    if (static_cast<int64_t>(seq.block_table.size()) < blocks_needed)
      return InvalidArgument(where() + ": block table has " + std::to_string(seq.block_table.size()) +
                             " blocks, positions up to " + std::to_string(end) + " need " +
                             std::to_string(blocks_needed));
    for (int64_t b = 0; b < blocks_needed; ++b) {
      if (seq.block_table[b] < 0 || seq.block_table[b] >= num_blocks)
        return InvalidArgument(where() + ": block id " + std::to_string(seq.block_table[b]) +
                               " outside the pool of " + std::to_string(num_blocks));
    }
  }
  if (total > static_cast<size_t>(options.max_batch_tokens))
    return TooLarge("forward: " + std::to_string(total) + " tokens exceed max_batch_tokens " +
                    std::to_string(options.max_batch_tokens));
  return Status::Ok();
}

std::vector<float> RopeInvFreq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    float base_pow = static_cast<float>(std::pow(c.rope_theta, static_cast<double>(exponent)));
    inv_freq[i] = 1.0f / base_pow;
  }
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScalingType::kLinear) {
    for (float& v : inv_freq) v /= static_cast<float>(rs.factor);
  } else if (rs.type == RopeScalingType::kLlama3) {
    const float factor = static_cast<float>(rs.factor);
    const float old_len = static_cast<float>(rs.original_max_position_embeddings);
    const float low = static_cast<float>(rs.low_freq_factor);
    const float high = static_cast<float>(rs.high_freq_factor);
    const float low_freq_wavelen = old_len / low;
    const float high_freq_wavelen = old_len / high;
    for (float& v : inv_freq) {
      const float wavelen = static_cast<float>(2.0 * M_PI) / v;
      float scaled = wavelen > low_freq_wavelen ? v / factor : v;
      if (!(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)) {
        const float smooth = (old_len / wavelen - low) / (high - low);
        scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
      }
      v = scaled;
    }
  }
  return inv_freq;
}

}  // namespace tandem
