// `tandem make-model`: writes a small Hugging Face checkpoint (config.json, model.safetensors,
// tokenizer.json, tokenizer_config.json, generation_config.json) with seeded random weights and
// a real byte-level BPE tokenizer. It is the embedded default model and what tests run on.
// The files are exactly what transformers writes, so AutoModelForCausalLM.from_pretrained(DIR)
// and AutoTokenizer.from_pretrained(DIR) load them unmodified.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "common/base/status.h"

namespace tandem {

struct MakeModelOptions {
  std::string preset = "tiny";  // tiny (~1M params), small (~30M), medium (~120M)
  ModelFamily family = ModelFamily::kLlama;  // kLlama or kQwen2
  DType dtype = DType::kF32;    // dtype of model.safetensors
  uint64_t seed = 0;
  bool with_tokenizer = true;   // false: weights and configs only (faster, for unit tests)
};

// The config of a preset (before the tokenizer fixes the special token ids).
// InvalidArgument for an unknown preset or family.
StatusOr<ModelConfig> PresetConfig(const std::string& preset, ModelFamily family);

// Writes the checkpoint into `out_dir` (created if needed; existing files are overwritten).
// Weights: N(0, 1/sqrt(fan_in)) for projections and embeddings, so attention scores and logits
// have unit scale and tests see position and masking errors; norms 1 + N(0, 0.05); biases
// N(0, 0.1). The same options give byte-identical files. On error some files may have been
// written.
Status MakeModel(const MakeModelOptions& options, const std::string& out_dir);

}  // namespace tandem
