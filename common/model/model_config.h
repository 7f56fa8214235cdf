// The shape of a Llama-family decoder, read from a Hugging Face checkpoint's `config.json` and
// `generation_config.json`.
//
// Supported architectures: LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM. Every error
// names the file and the field ("config.json: field 'hidden_size' must be a positive integer").
// Parsing never throws. The structs are plain values; copy them freely.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace tandem {

enum class ModelFamily { kLlama, kQwen2, kMistral };

// "llama", "qwen2", "mistral" (the HF model_type).
std::string_view ModelFamilyName(ModelFamily family);

// RoPE frequency scaling. kNone keeps the plain inverse frequencies.
enum class RopeScalingType { kNone, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3 only
  double high_freq_factor = 4.0;  // llama3 only
  int original_max_position_embeddings = 8192;  // llama3 only
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  ModelFamily family = ModelFamily::kLlama;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;  // num_hidden_layers
  int num_heads = 0;   // num_attention_heads
  int num_kv_heads = 0;  // num_key_value_heads; num_heads when absent (no GQA)
  int head_dim = 0;      // hidden_size / num_heads when absent
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2 always; Llama when attention_bias
  bool o_bias = false;    // Llama when attention_bias
  int sliding_window = 0;  // Mistral; 0 = full attention
  std::string torch_dtype;  // informational
  int bos_token_id = -1;    // -1 when absent
  std::vector<int> eos_token_ids;

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  // Number of parameters of the weights this config describes.
  int64_t NumParameters() const;
};

// Sampling defaults from generation_config.json. Absent fields keep these values.
struct GenerationConfig {
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  bool do_sample = false;
  double temperature = 1.0;
  double top_p = 1.0;
  int top_k = 0;  // 0 = off
  double repetition_penalty = 1.0;
};

// Parses the text of a config.json; `file_name` prefixes every error message.
StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view file_name);
StatusOr<GenerationConfig> ParseGenerationConfig(std::string_view json_text,
                                                 std::string_view file_name);

// Reads DIR/config.json, and DIR/generation_config.json when present: its eos ids, when given,
// replace the config's (HF generate does the same). NotFound when config.json is missing.
// A .gguf file instead of DIR: the config from its metadata (common/model/gguf_checkpoint.h).
StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);
// Reads DIR/generation_config.json; defaults (with the config's bos/eos) when it is absent, and
// for a .gguf file.
StatusOr<GenerationConfig> LoadGenerationConfig(const std::string& model_dir,
                                                const ModelConfig& config);

// The config.json text Hugging Face transformers writes for this config (used by make-model).
std::string ModelConfigToJson(const ModelConfig& config);

// Reads a whole file. NotFound names the path when it cannot be opened.
StatusOr<std::string> ReadFileToString(const std::string& path);
// Writes a whole file (truncating). Internal names the path on failure.
Status WriteStringToFile(const std::string& path, std::string_view contents);

}  // namespace tandem
