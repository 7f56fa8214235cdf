#include "common/engine/device_memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstdio>

#include "common/engine/cuda/kernels.h"  // host-includable: the attention kernels' shapes
#include "common/engine/kv_cache.h"
#include "common/engine/row_draw.h"

namespace tandem {
namespace {

// Bytes as GiB, for the messages below (signed: start-up may take less than planned).
double Gib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }
double Gib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

}  // namespace

size_t CudaWorkspacePlan::device_bytes() const {
  size_t sum = 0;
  for (size_t bytes : {x, xn, qkv, attn, mlp, act, lowp, last, partials, logits, argmax, draws,
                       logprobs, edit_begin, inputs.bytes, cublas})
    sum += AlignUpCuda(bytes);
  return sum;
}

CudaWorkspacePlan PlanCudaWorkspaces(const ModelConfig& c, const ForwardOptions& options,
                                     bool low_precision, bool returns_logits) {
  CudaWorkspacePlan p;
  const size_t t = static_cast<size_t>(std::max(options.max_batch_tokens, 0));
  // Graph passes pad a decode batch up to a graph size <= max_batch_sequences tokens.
  const size_t s = static_cast<size_t>(std::max(options.max_batch_sequences, 0));
  const size_t rows = std::max(t, s);
  const size_t h = c.hidden_size, inter = c.intermediate_size;
  const size_t qkv_dim = c.q_dim() + 2 * c.kv_dim();
  const int64_t max_len =
      options.max_model_len > 0 ? options.max_model_len : c.max_position_embeddings;
  p.rows = rows;
  p.decode_partitions = cuda::DecodePartitions(max_len);
  p.x = rows * h * 4;
  p.xn = rows * h * 4;
  p.qkv = rows * qkv_dim * 4;
  p.attn = rows * c.q_dim() * 4;
  p.mlp = rows * 2 * inter * 4;
  p.act = rows * inter * 4;
  if (low_precision) p.lowp = rows * std::max({h, size_t(c.q_dim()), inter}) * 2;
  p.last = s * h * 4;
  p.partials = static_cast<size_t>(cuda::DecodePartialFloats(
                   static_cast<int32_t>(s), c.num_heads, c.head_dim, p.decode_partitions)) *
               4;
  if (returns_logits) {  // a rank whose logits nobody reads has no LM head output
    p.logits = s * c.vocab_size * 4;
    p.argmax = s * sizeof(int32_t);
    p.draws = s * sizeof(RowDraw);
    p.logprobs = s * sizeof(RowLogprobs);
    p.edit_begin = (s + 1) * sizeof(int32_t);
  }
  // Inputs: the block tables of graph passes span max_model_len; eager passes use less.
  const size_t max_tiles = t / cuda::kPrefillTileTokens + s + 1;
  // Block size 1: the most entries a table of max_model_len tokens can have.
  const size_t table_ints = s * static_cast<size_t>(BlocksForTokens(max_len, 1));
  CudaInputSlots& o = p.inputs;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t offset = at;
    at += AlignUpCuda(bytes);
    return offset;
  };
  o.token_ids = take(rows * 4);
  o.positions = take(rows * 4);
  o.slot_mapping = take(rows * 8);
  o.seq_lens = take(s * 4);
  o.last_token = take(s * 4);
  o.tiles = take(max_tiles * 3 * 4);
  o.block_tables = take(table_ints * 4);  // last: a step copies only the rows it uses
  o.bytes = at;
  return p;
}

Status CheckDeviceMemoryFits(const std::string& where, const std::string& field,
                             const std::string& name, int device, const DeviceMemoryNeed& need,
                             uint64_t free_bytes, uint64_t total_bytes) {
  if (need.total() + kDeviceMemoryMargin <= free_bytes) return Status::Ok();
  char text[512];
  std::snprintf(text, sizeof text,
                "the %s instance needs %.2f GiB on GPU %d (KV pool %.2f, weights %.2f, forward "
                "buffers %.2f, KV transfer buffers %.2f) and %.2f GiB to spare, but the GPU has "
                "%.2f GiB free of %.2f GiB",
                name.c_str(), Gib(need.total()), device, Gib(need.kv_pool), Gib(need.weights),
                Gib(need.workspaces), Gib(need.transfer), Gib(kDeviceMemoryMargin),
                Gib(free_bytes), Gib(total_bytes));
  std::string advice =
      field == "kv_cache.memory_fraction"
          ? ": lower kv_cache.memory_fraction (instances that share a GPU share its memory) or "
            "give each instance GPUs of its own (S.cuda_devices)"
          : ": lower " + field + " or free the GPU";
  if (need.besides_kv() + kDeviceMemoryMargin > free_bytes)
    advice = ": even without a KV pool the instance does not fit; free the GPU, use a GPU with "
             "more memory, or split the model over more GPUs (S.tensor_parallel)";
  return ResourceExhausted(where + ": " + field + ": " + text + advice);
}

std::string DescribeDeviceMemoryUse(const DeviceMemoryPlan& plan, int rank, uint64_t free_now,
                                    bool* over_margin) {
  const uint64_t before = rank >= 0 && static_cast<size_t>(rank) < plan.free_before.size()
                              ? plan.free_before[rank]
                              : 0;
  const int64_t took = static_cast<int64_t>(before) - static_cast<int64_t>(free_now);
  const int64_t extra = took - static_cast<int64_t>(plan.need.total());
  *over_margin = extra > static_cast<int64_t>(kDeviceMemoryMargin);
  char text[512];
  std::snprintf(text, sizeof text,
                "GPU %d: start-up took %.2f GiB, %.2f GiB %s than planned (KV pool %.2f, weights "
                "%.2f, forward buffers %.2f, KV transfer buffers %.2f; the rest is what CUDA, "
                "cuBLAS and NCCL keep for themselves, %s the %.2f GiB margin)",
                rank, Gib(took), Gib(std::abs(extra)), extra >= 0 ? "more" : "less",
                Gib(plan.need.kv_pool), Gib(plan.need.weights), Gib(plan.need.workspaces),
                Gib(plan.need.transfer), *over_margin ? "beyond" : "within",
                Gib(kDeviceMemoryMargin));
  return text;
}

}  // namespace tandem
