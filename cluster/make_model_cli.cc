#include "cluster/make_model_cli.h"

#include <cstdio>

#include "common/base/flags.h"
#include "common/model/make_model.h"

namespace tandem {

int MakeModelMain(const std::vector<std::string>& args) {
  FlagParser flags("tandem make-model --out DIR [flags]",
                   "Writes a small Hugging Face checkpoint with seeded random weights and a "
                   "trained byte-level BPE tokenizer.");
  flags.AddString("preset", "tiny",
                  "tiny (~1M params), small (~30M), medium (~120M), smollm2 (SmolLM2-135M's shape)");
  flags.AddString("family", "llama", "llama (Llama 3 layout, GQA, llama3 RoPE) or qwen2 (qkv bias, tied)");
  flags.AddString("out", "", "output directory (created if needed)");
  flags.AddInt("seed", 0, "seed for weights and tokenizer corpus");
  flags.AddString("dtype", "f32", "dtype of model.safetensors: f32, bf16, f16");
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "tandem make-model: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  MakeModelOptions options;
  options.preset = flags.GetString("preset");
  const std::string& family = flags.GetString("family");
  if (family == "llama") {
    options.family = ModelFamily::kLlama;
  } else if (family == "qwen2") {
    options.family = ModelFamily::kQwen2;
  } else {
    std::fprintf(stderr, "tandem make-model: --family must be llama or qwen2, not '%s'\n",
                 family.c_str());
    return kExitUsage;
  }
  const std::string& dtype = flags.GetString("dtype");
  if (dtype == "f32") {
    options.dtype = DType::kF32;
  } else if (dtype == "bf16") {
    options.dtype = DType::kBF16;
  } else if (dtype == "f16") {
    options.dtype = DType::kF16;
  } else {
    std::fprintf(stderr, "tandem make-model: --dtype must be f32, bf16 or f16, not '%s'\n",
                 dtype.c_str());
    return kExitUsage;
  }
  if (flags.GetInt("seed") < 0) {
    std::fprintf(stderr, "tandem make-model: --seed must not be negative\n");
    return kExitUsage;
  }
  options.seed = static_cast<uint64_t>(flags.GetInt("seed"));
  const std::string& out = flags.GetString("out");
  if (out.empty()) {
    std::fprintf(stderr, "tandem make-model: --out DIR is required\n");
    return kExitUsage;
  }
  if (Status s = MakeModel(options, out); !s.ok()) {
    std::fprintf(stderr, "tandem make-model: %s\n", s.ToString().c_str());
    return kExitFailure;
  }
  StatusOr<ModelConfig> config = LoadModelConfig(out);
  std::printf("wrote %s (%s %s, %.2fM parameters, %s)\n", out.c_str(), family.c_str(),
              options.preset.c_str(),
              config.ok() ? static_cast<double>(config->NumParameters()) / 1e6 : 0.0,
              dtype.c_str());
  return kExitOk;
}

}  // namespace tandem
