// Opening a checkpoint, whichever format it is in: a Hugging Face directory (config.json,
// safetensors, tokenizer.json) or a GGUF file (common/model/gguf_checkpoint.h). `path` names the
// directory or the .gguf file (IsGgufPath tells them apart). Thread-safe (no shared state).
#pragma once

#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/model/model_config.h"
#include "common/model/tensor_source.h"
#include "common/text/tokenizer.h"

namespace tandem {

struct Checkpoint {
  ModelConfig config;
  std::unique_ptr<TensorSource> tensors;  // the weights under their HF names
};

// The config and the weights of the checkpoint at `path`. Errors as LoadModelConfig's and the
// readers' (each names the file and the field, key or tensor).
StatusOr<Checkpoint> OpenCheckpoint(const std::string& path);

// The checkpoint's tokenizer: tokenizer.json (+ tokenizer_config.json) of a directory, or the
// tokenizer.ggml.* metadata and tokenizer.chat_template of a GGUF file.
StatusOr<Tokenizer> LoadCheckpointTokenizer(const std::string& path);

}  // namespace tandem
