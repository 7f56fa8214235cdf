// GPU memory planned on the host (common/engine/device_memory.h, kvtransfer/factory.h's
// TransferDeviceBytes): what a CUDA rank's forward pass allocates besides its weights and KV
// pool, what the KV transfer stages on the GPU, and start-up's check that it all fits.
#include "common/engine/device_memory.h"

#include <catch2/catch.hpp>

#include <string>

#include "common/config/config.h"
#include "common/engine/row_draw.h"
#include "common/model/make_model.h"
#include "kvtransfer/factory.h"
#include "kvtransfer/nccl_packing.h"

namespace tandem {
namespace {

// SmolLM2-135M's shape (hidden 576, intermediate 1536, 9 query and 3 KV heads of 64, vocabulary
// 49152, 8192 positions): make-model's smollm2 preset.
ModelConfig SmolLm2Shape() {
  StatusOr<ModelConfig> c = PresetConfig("smollm2", ModelFamily::kLlama);
  REQUIRE(c.ok());
  return *c;
}

constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST_CASE("device memory: a rank's forward buffers are tokens x widths and sequences x vocab",
          "[device_memory]") {
  const ModelConfig c = SmolLm2Shape();
  ForwardOptions o;
  o.max_batch_tokens = 2048;
  o.max_batch_sequences = 64;
  o.max_model_len = 2048;
  const CudaWorkspacePlan p = PlanCudaWorkspaces(c, o, /*low_precision=*/true, true);
  CHECK(p.rows == 2048);
  CHECK(p.x == 2048u * 576 * 4);
  CHECK(p.qkv == 2048u * (576 + 2 * 192) * 4);
  CHECK(p.mlp == 2048u * 2 * 1536 * 4);
  CHECK(p.act == 2048u * 1536 * 4);
  CHECK(p.lowp == 2048u * 1536 * 2);  // the widest GEMM input, bf16
  CHECK(p.last == 64u * 576 * 4);
  CHECK(p.decode_partitions == 4);  // 2048 tokens in partitions of 512
  CHECK(p.partials == 64u * 9 * 4 * (64 + 2) * 4);
  CHECK(p.logits == 64u * 49152 * 4);
  CHECK(p.draws == 64 * sizeof(RowDraw));
  CHECK(p.edit_begin == 65u * 4);
  // Inputs: 3 token-sized arrays, 2 sequence-sized, the tile list, then block tables of
  // max_model_len entries a sequence (block size 1, the most), each aligned.
  CHECK(p.inputs.token_ids == 0);
  CHECK(p.inputs.block_tables % kCudaBufferAlign == 0);
  CHECK(p.inputs.bytes == p.inputs.block_tables + AlignUpCuda(64u * 2048 * 4));
  size_t sum = 0;
  for (size_t b : {p.x, p.xn, p.qkv, p.attn, p.mlp, p.act, p.lowp, p.last, p.partials, p.logits,
                   p.argmax, p.draws, p.logprobs, p.edit_begin, p.inputs.bytes, p.cublas})
    sum += AlignUpCuda(b);
  CHECK(p.device_bytes() == sum);
  CHECK(p.cublas == kCublasWorkspaceBytes);

  // fp32 weights stage nothing in bf16; a rank without the LM head has no logits buffers.
  const CudaWorkspacePlan other = PlanCudaWorkspaces(c, o, /*low_precision=*/false, false);
  CHECK(other.lowp == 0);
  CHECK(other.logits == 0);
  CHECK(other.draws == 0);
  CHECK(other.device_bytes() ==
        p.device_bytes() - AlignUpCuda(p.lowp) - AlignUpCuda(p.logits) - AlignUpCuda(p.argmax) -
            AlignUpCuda(p.draws) - AlignUpCuda(p.logprobs) - AlignUpCuda(p.edit_begin));

  // A decode batch of more sequences than tokens sizes the activations by sequences.
  o.max_batch_tokens = 16;
  o.max_batch_sequences = 256;
  CHECK(PlanCudaWorkspaces(c, o, true, true).rows == 256);
  // max_model_len 0: the model's positions bound the graphs' block tables and partitions.
  o.max_model_len = 0;
  CHECK(PlanCudaWorkspaces(c, o, true, true).decode_partitions == 16);
}

TEST_CASE("device memory: a Llama-3-8B rank at 8192 tokens plans about 2.3 GiB of buffers",
          "[device_memory]") {
  ModelConfig c;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.vocab_size = 128256;
  c.max_position_embeddings = 8192;
  ForwardOptions o;
  o.max_batch_tokens = 8192;
  o.max_batch_sequences = 256;
  o.max_model_len = 8192;
  const double gib = static_cast<double>(PlanCudaWorkspaces(c, o, true, true).device_bytes()) /
                     static_cast<double>(kGiB);
  // 8192 rows x (2 x 4096 + 6144 + 4096 + 3 x 14336) fp32 = 1.875 GiB, bf16 staging 0.22,
  // logits 0.12, decode partials 0.06, block tables 8 MiB, cuBLAS 32 MiB: 2.32 GiB.
  CHECK(gib > 2.2);
  CHECK(gib < 2.4);
}

TEST_CASE("device memory: start-up says what does not fit on which GPU, and what to change",
          "[device_memory]") {
  DeviceMemoryNeed need;
  need.kv_pool = 60 * kGiB;
  need.weights = kGiB / 4;
  need.workspaces = kGiB;
  need.transfer = 32 << 20;
  CHECK(need.total() == 60 * kGiB + kGiB / 4 + kGiB + (32 << 20));
  CHECK(CheckDeviceMemoryFits("c.yaml:3:5", "kv_cache.memory_fraction", "decode", 0, need,
                              70 * kGiB, 80 * kGiB)
            .ok());
  // Another instance on the GPU took most of it.
  const Status s = CheckDeviceMemoryFits("c.yaml:3:5", "kv_cache.memory_fraction", "decode", 1,
                                         need, 30 * kGiB, 80 * kGiB);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  const std::string m = s.message();
  CHECK_THAT(m, Catch::StartsWith("c.yaml:3:5: kv_cache.memory_fraction: the decode instance "
                                  "needs 61.28 GiB on GPU 1 (KV pool 60.00, weights 0.25"));
  CHECK_THAT(m, Catch::Contains("the GPU has 30.00 GiB free of 80.00 GiB"));
  CHECK_THAT(m, Catch::Contains("lower kv_cache.memory_fraction"));
  // Within the margin: refused too (CUDA and NCCL allocate beyond the plan).
  CHECK_FALSE(CheckDeviceMemoryFits("w", "f", "prefill", 0, need, need.total() + 1, 80 * kGiB)
                  .ok());
  // An explicit pool size is named as such.
  CHECK_THAT(CheckDeviceMemoryFits("c.yaml:9:3", "prefill.kv_blocks", "prefill", 0, need,
                                   10 * kGiB, 80 * kGiB)
                 .message(),
             Catch::Contains(": lower prefill.kv_blocks"));
  // Not even the weights and buffers fit: a smaller pool would not help.
  need.weights = 79 * kGiB;
  CHECK_THAT(CheckDeviceMemoryFits("w", "kv_cache.memory_fraction", "prefill", 0, need,
                                   78 * kGiB, 80 * kGiB)
                 .message(),
             Catch::Contains("even without a KV pool the instance does not fit"));
}

TEST_CASE("device memory: once up, an instance says what its GPUs took against the plan",
          "[device_memory]") {
  DeviceMemoryPlan plan;
  plan.need.kv_pool = 56 * kGiB;
  plan.need.weights = kGiB / 4;
  plan.need.workspaces = kGiB;
  plan.free_before = {70 * kGiB, 72 * kGiB};
  bool over = true;
  // GPU 0 lost 57.25 GiB plus 128 MiB that CUDA and cuBLAS kept: within the margin.
  const std::string line =
      DescribeDeviceMemoryUse(plan, 0, 70 * kGiB - plan.need.total() - (128 << 20), &over);
  CHECK_FALSE(over);
  CHECK(line == "GPU 0: start-up took 57.38 GiB, 0.12 GiB more than planned (KV pool 56.00, "
                "weights 0.25, forward buffers 1.00, KV transfer buffers 0.00; the rest is what "
                "CUDA, cuBLAS and NCCL keep for themselves, within the 0.25 GiB margin)");
  // GPU 1 lost 1 GiB more than planned: the start-up check would pass instances that do not fit.
  CHECK_THAT(DescribeDeviceMemoryUse(plan, 1, 72 * kGiB - plan.need.total() - kGiB, &over),
             Catch::StartsWith("GPU 1: start-up took 58.25 GiB, 1.00 GiB more than planned"));
  CHECK(over);
  CHECK_THAT(DescribeDeviceMemoryUse(plan, 1, 72 * kGiB - plan.need.total() + kGiB / 2, &over),
             Catch::Contains("0.50 GiB less than planned"));
  CHECK_FALSE(over);
}

ClusterConfig Parse(const std::string& yaml) {
  StatusOr<ClusterConfig> config = ParseConfig(yaml, "t.yaml");
  REQUIRE(config.ok());
  return *config;
}

TEST_CASE("device memory: nccl stages 16 MiB on a GPU for each link it may have",
          "[device_memory]") {
  const ClusterConfig nccl = Parse(
      "transfer: {backend: nccl}\n"
      "prefill: {device: cuda, instances: 2, cuda_devices: [0, 1]}\n"
      "decode: {device: cuda, instances: 3, tensor_parallel: 2,\n"
      "         cuda_devices: [2, 3, 4, 5, 6, 7]}\n");
  // A prefill GPU links with both ranks of each of the 3 decode instances.
  CHECK(TransferDeviceBytes(nccl, "prefill") == 3 * 2 * kLinkStagingBytes);
  // A decode rank holds half the KV heads: one prefill GPU of each of the 2 instances.
  CHECK(TransferDeviceBytes(nccl, "decode") == 2 * kLinkStagingBytes);
  // The other transports stage nothing on the GPU; a colocated instance moves no KV.
  const ClusterConfig ipc = Parse("transfer: {backend: cuda_ipc}\n"
                                  "prefill: {device: cuda}\ndecode: {device: cuda}\n");
  CHECK(TransferDeviceBytes(ipc, "prefill") == 0);
  CHECK(TransferDeviceBytes(nccl, "colocated") == 0);
}

}  // namespace
}  // namespace tandem
