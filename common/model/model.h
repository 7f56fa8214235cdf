// The weights of a Llama-family decoder (Llama 2/3, Qwen2, Mistral), loaded from a Hugging Face
// checkpoint directory (config.json + model.safetensors or a sharded index) or a GGUF file
// (dequantized on load; common/model/gguf_checkpoint.h).
//
// Storage dtype (model.dtype): the matrices (projections, embedding, LM head) are stored as
// fp32, bf16 or f16 (WeightMatrix); norms and biases are always fp32. Whatever the checkpoint
// holds is read as fp32 and rounded to the storage dtype at load (round to nearest even). The
// engine's arithmetic is fp32 either way: bf16/f16 halve the bytes a decode step reads.
//
// All weights live in ONE 64-byte-aligned allocation owned by the Model (RAII); the per-layer
// views below point into it. Matrices keep the HF layout [out_features, in_features], row
// major, so y = x W^T. Two matrices are fused at load so a layer needs fewer GEMMs:
//   qkv_proj = [q_proj; k_proj; v_proj]   shape [q_dim + 2 kv_dim, hidden]
//   gate_up  = [gate_proj; up_proj]        shape [2 intermediate, hidden]
// A Model is immutable after Load: any number of threads may read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/model/model_config.h"
#include "common/model/tensor_source.h"
#include "common/model/weight_matrix.h"
#include "common/base/status.h"

namespace tandem {

struct LayerWeights {
  const float* input_norm = nullptr;  // [hidden]
  WeightMatrix qkv_proj;              // [q_dim + 2 kv_dim, hidden]
  const float* qkv_bias = nullptr;    // [q_dim + 2 kv_dim] or nullptr
  WeightMatrix o_proj;                // [hidden, q_dim]
  const float* o_bias = nullptr;      // [hidden] or nullptr
  const float* post_norm = nullptr;   // [hidden]
  WeightMatrix gate_up;               // [2 intermediate, hidden]
  WeightMatrix down_proj;             // [hidden, intermediate]
};

struct ModelLoadOptions {
  // Storage dtype of the matrices; nullopt = auto: ResolveWeightDType(nullopt, checkpoint).
  std::optional<WeightDType> dtype;
};

// The storage dtype for `requested` (model.dtype; nullopt = auto) and a checkpoint whose weights
// are `checkpoint_dtype` (config.json's torch_dtype, or what a GGUF's tensors are, as a torch
// name). Auto keeps the checkpoint's dtype when it is float32, bfloat16 or float16, else
// (absent, unknown) float32.
WeightDType ResolveWeightDType(std::optional<WeightDType> requested,
                               std::string_view checkpoint_dtype);

class Model {
 public:
  // Loads DIR, or a .gguf file. Errors: NotFound (no config/weights), InvalidArgument
  // (unsupported config or tensor type, a tensor of the wrong shape: the message names the
  // tensor, its shape and the expected one; a weight outside float16's range when storing
  // float16), NotFound naming a missing tensor, DataLoss (corrupt file). Nothing is returned on
  // error.
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                               const ModelLoadOptions& options = {});
  // Builds the model `config` describes from `tensors` (HF names and shapes), its matrices
  // stored as `dtype`; `source_name` (a path) prefixes errors, which are Load's. Load is
  // OpenCheckpoint + this. It exists on its own so that a model can be made from weights that
  // are not a checkpoint on disk: a tensor-parallel shard reads its slices of a loaded model
  // through a TensorSource (common/engine/tensor_parallel.h).
  static StatusOr<std::unique_ptr<Model>> FromTensors(const ModelConfig& config,
                                                      const TensorSource& tensors,
                                                      WeightDType dtype,
                                                      const std::string& source_name);

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const LayerWeights& layer(int i) const { return layers_[i]; }
  const WeightMatrix& embed_tokens() const { return embed_tokens_; }  // [vocab, hidden]
  const float* final_norm() const { return final_norm_; }             // [hidden]
  // [vocab, hidden]; the same storage as embed_tokens when tied.
  const WeightMatrix& lm_head() const { return lm_head_; }
  WeightDType dtype() const { return dtype_; }  // storage dtype of the matrices
  // Bytes of weights one decode step reads (everything but the embedding table, which is
  // gathered by row, unless it doubles as lm_head), at the storage dtype.
  size_t step_weight_bytes() const;
  size_t total_bytes() const { return num_bytes_; }

 private:
  struct FreeDeleter {
    void operator()(char* p) const;
  };
  Model() = default;

  ModelConfig config_;
  WeightDType dtype_ = WeightDType::kF32;
  std::unique_ptr<char[], FreeDeleter> storage_;
  size_t num_bytes_ = 0;
  std::unique_ptr<LayerWeights[]> layers_;
  WeightMatrix embed_tokens_;
  const float* final_norm_ = nullptr;
  WeightMatrix lm_head_;
};

}  // namespace tandem
