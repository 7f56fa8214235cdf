// `tandem make-model`: writes a small Hugging Face checkpoint (config.json, model.safetensors,
// tokenizer.json, tokenizer_config.json, generation_config.json) with seeded random weights and
// a real byte-level BPE tokenizer. It is the embedded default model and what tests run on.
#pragma once

#include <string>
#include <vector>

namespace tandem {

// Entry point of the subcommand; args exclude "tandem make-model". Returns a process exit code.
int MakeModelMain(const std::vector<std::string>& args);

}  // namespace tandem
