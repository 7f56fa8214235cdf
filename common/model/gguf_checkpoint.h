// A GGUF file as a checkpoint (common/model/gguf.h reads the format; this maps it onto what
// Tandem loads): the model config from the metadata, the weights under their Hugging Face names,
// and the tokenizer's vocabulary.
//
// Architectures: `llama` (Llama 2/3, Mistral, SmolLM2 as llama.cpp converts them) and `qwen2`.
// Config keys (ARCH = general.architecture): ARCH.block_count, .embedding_length,
// .feed_forward_length, .attention.head_count, .attention.head_count_kv (default: head_count),
// .attention.key_length / .value_length (default: embedding_length / head_count),
// .rope.dimension_count (must be the head size), .rope.freq_base (default 10000),
// .attention.layer_norm_rms_epsilon, .context_length, .vocab_size (default: the token table's
// length), .rope.scaling.type none|linear with .rope.scaling.factor. No `output.weight` tensor
// means tied embeddings; qwen2 has q/k/v biases. What Tandem cannot run is refused naming the key
// or tensor: another architecture, llama3 RoPE frequency factors (tensor rope_freqs.weight), YaRN,
// experts, partial rotary, a tensor the architecture does not have.
//
// Tensor names: token_embd, output_norm, output, blk.N.{attn_norm, attn_q, attn_k, attn_v,
// attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}. llama.cpp's converter permutes the rows of
// llama's attn_q and attn_k (and their biases) per head from HF's [first half; second half] RoPE
// order to interleaved pairs; GgufTensorSource permutes them back. qwen2 is stored unpermuted.
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/model/gguf.h"
#include "common/model/model_config.h"
#include "common/model/tensor_source.h"
#include "common/text/gguf_vocab.h"

namespace tandem {

// True when `path` names a GGUF checkpoint: not a directory, and its name ends in ".gguf" (any
// case). Says nothing about whether the file exists or is valid.
bool IsGgufPath(const std::string& path);

// The model config from the file's metadata (see the header comment). Errors start with the
// file's path and name the key or tensor.
StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& file);

// The tokenizer.ggml.* keys and tokenizer.chat_template. Errors name the key: a missing
// tokenizer.ggml.model or tokens, a token_type or scores array whose length differs from the
// tokens', a token id out of range.
StatusOr<GgufVocab> GgufVocabFromFile(const GgufFile& file);

// The weights of a GGUF file under their Hugging Face names, dequantized to fp32, Q/K rows back in
// HF order. Owns the file (its mapping); immutable, so any thread may read.
class GgufTensorSource : public TensorSource {
 public:
  GgufTensorSource(GgufFile file, const ModelConfig& config);

  bool Has(const std::string& name) const override;
  Status ReadF32(const std::string& name, std::span<const int64_t> expected_shape,
                 std::span<float> out) const override;

  const GgufFile& file() const { return file_; }

 private:
  // The GGUF tensor holding HF tensor `name` ("" when the name has no GGUF counterpart), and
  // the number of heads whose rows llama.cpp permuted (0: none).
  std::string GgufName(const std::string& name, int* permuted_heads) const;

  GgufFile file_;
  ModelConfig config_;
};

}  // namespace tandem
