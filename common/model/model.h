// The fp32 weights of a Llama-family decoder (Llama 2/3, Qwen2, Mistral), loaded from a
// Hugging Face checkpoint directory (config.json + model.safetensors or a sharded index) or a
// GGUF file (dequantized on load; common/model/gguf_checkpoint.h).
//
// All weights live in ONE 64-byte-aligned allocation owned by the Model (RAII); the per-layer
// pointers below point into it. Matrices keep the HF layout [out_features, in_features], row
// major, so y = x W^T. Two matrices are fused at load so a layer needs fewer GEMMs:
//   qkv_proj = [q_proj; k_proj; v_proj]   shape [q_dim + 2 kv_dim, hidden]
//   gate_up  = [gate_proj; up_proj]        shape [2 intermediate, hidden]
// A Model is immutable after Load: any number of threads may read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/model/model_config.h"
#include "common/base/status.h"

namespace tandem {

struct LayerWeights {
  const float* input_norm = nullptr;  // [hidden]
  const float* qkv_proj = nullptr;    // [q_dim + 2 kv_dim, hidden]
  const float* qkv_bias = nullptr;    // [q_dim + 2 kv_dim] or nullptr
  const float* o_proj = nullptr;      // [hidden, q_dim]
  const float* o_bias = nullptr;      // [hidden] or nullptr
  const float* post_norm = nullptr;   // [hidden]
  const float* gate_up = nullptr;     // [2 intermediate, hidden]
  const float* down_proj = nullptr;   // [hidden, intermediate]
};

class Model {
 public:
  // Loads DIR, or a .gguf file. Errors: NotFound (no config/weights), InvalidArgument
  // (unsupported config or tensor type, a
  // tensor of the wrong shape: the message names the tensor, its shape and the expected one),
  // NotFound naming a missing tensor, DataLoss (corrupt file). Nothing is returned on error.
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& dir);

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const LayerWeights& layer(int i) const { return layers_[i]; }
  const float* embed_tokens() const { return embed_tokens_; }  // [vocab, hidden]
  const float* final_norm() const { return final_norm_; }      // [hidden]
  const float* lm_head() const { return lm_head_; }  // [vocab, hidden]; == embed when tied
  // Bytes of weights one decode step reads (everything but the embedding table, which is
  // gathered by row, unless it doubles as lm_head).
  size_t step_weight_bytes() const;
  size_t total_bytes() const { return num_floats_ * sizeof(float); }

 private:
  struct FreeDeleter {
    void operator()(float* p) const;
  };
  Model() = default;

  ModelConfig config_;
  std::unique_ptr<float[], FreeDeleter> storage_;
  size_t num_floats_ = 0;
  std::unique_ptr<LayerWeights[]> layers_;
  const float* embed_tokens_ = nullptr;
  const float* final_norm_ = nullptr;
  const float* lm_head_ = nullptr;
};

}  // namespace tandem
