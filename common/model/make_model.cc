#include "common/model/make_model.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/text/bpe_trainer.h"
#include "common/text/tokenizer.h"

namespace tandem {
namespace {

struct Preset {
  const char* name;
  int hidden, intermediate, layers, heads, kv_heads, vocab;
  bool tied = false;  // Llama family: tie_word_embeddings (Qwen2 always ties)
};

// Llama layouts with GQA. Parameter counts (Llama family, untied): tiny 0.92M, small 32M,
// medium 116M. smollm2 has SmolLM2-135M's shape (tied embeddings, 135M) with random weights:
// what benchmarks of that model need without its checkpoint.
constexpr Preset kPresets[] = {
    {"tiny", 128, 384, 2, 4, 2, 2048},
    {"small", 512, 1408, 8, 8, 4, 8000},
    {"medium", 768, 3072, 12, 12, 4, 8000},
    {"smollm2", 576, 1536, 30, 9, 3, 49152, true},
};

// Fills weights in a fixed order from one generator so a seed fixes every byte.
class WeightMaker {
 public:
  explicit WeightMaker(uint64_t seed) : rng_(seed) {}

  void Normal(const std::string& name, std::vector<int64_t> shape, float mean, float std) {
    size_t count = 1;
    for (int64_t d : shape) count *= static_cast<size_t>(d);
    std::vector<float> data(count);
    std::normal_distribution<float> dist(mean, std);
    for (float& v : data) v = dist(rng_);
    names_.push_back(name);
    shapes_.push_back(std::move(shape));
    data_.push_back(std::move(data));
  }
  void Matrix(const std::string& name, int64_t out, int64_t in) {
    Normal(name, {out, in}, 0.0f, 1.0f / std::sqrt(static_cast<float>(in)));
  }

  Status Write(const std::string& path, DType dtype) const {
    std::vector<TensorToWrite> tensors;
    for (size_t i = 0; i < names_.size(); ++i)
      tensors.push_back(TensorToWrite{names_[i], shapes_[i], data_[i], dtype});
    return WriteSafetensors(path, tensors);
  }

 private:
  std::mt19937_64 rng_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<std::vector<float>> data_;
};

std::string TorchDtypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
  }
  return "float32";
}

}  // namespace

StatusOr<ModelConfig> PresetConfig(const std::string& preset, ModelFamily family) {
  const Preset* p = nullptr;
  for (const Preset& candidate : kPresets)
    if (preset == candidate.name) p = &candidate;
  if (p == nullptr)
    return InvalidArgument("make-model: unknown preset '" + preset + "' (tiny, small, medium, smollm2)");
  ModelConfig c;
  c.family = family;
  c.hidden_size = p->hidden;
  c.intermediate_size = p->intermediate;
  c.num_layers = p->layers;
  c.num_heads = p->heads;
  c.num_kv_heads = p->kv_heads;
  c.head_dim = p->hidden / p->heads;
  c.vocab_size = p->vocab;
  c.max_position_embeddings = 4096;
  c.torch_dtype = "float32";
  switch (family) {
    case ModelFamily::kLlama:
      // Llama 3.1 style: llama3 RoPE scaling whose bands fall inside the head dims we use.
      c.architecture = "LlamaForCausalLM";
      c.rope_theta = 500000.0;
      c.rope_scaling = RopeScaling{RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 1024};
      c.rms_norm_eps = 1e-5;
      c.tie_word_embeddings = p->tied;
      if (std::string_view(p->name) == "smollm2") {  // SmolLM2's own RoPE: plain, theta 1e5
        c.rope_theta = 100000.0;
        c.rope_scaling = RopeScaling{};
        c.max_position_embeddings = 8192;
      }
      break;
    case ModelFamily::kQwen2:
      c.architecture = "Qwen2ForCausalLM";
      c.rope_theta = 1000000.0;
      c.rms_norm_eps = 1e-6;
      c.tie_word_embeddings = true;
      c.qkv_bias = true;
      break;
    case ModelFamily::kMistral:
      return InvalidArgument("make-model: family mistral is not offered (llama, qwen2)");
  }
  return c;
}

Status MakeModel(const MakeModelOptions& options, const std::string& out_dir) {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig config, PresetConfig(options.preset, options.family));
  config.torch_dtype = TorchDtypeName(options.dtype);

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Internal(out_dir + ": cannot create directory: " + ec.message());

  // Tokenizer first: its special tokens decide bos/eos, and its size may set the vocabulary.
  std::vector<int> gen_eos;
  if (options.with_tokenizer) {
    TokenizerFamily tok_family =
        options.family == ModelFamily::kQwen2 ? TokenizerFamily::kQwen2 : TokenizerFamily::kLlama3;
    TANDEM_ASSIGN_OR_RETURN(TokenizerFiles files,
                            TrainTokenizer(tok_family, config.vocab_size, options.seed));
    TANDEM_ASSIGN_OR_RETURN(Tokenizer tokenizer,
                            Tokenizer::FromJson(files.tokenizer_json, files.tokenizer_config_json,
                                                "make-model tokenizer"));
    config.vocab_size = std::max(config.vocab_size, static_cast<int>(tokenizer.vocab_size()));
    auto id = [&](const char* token) {
      std::optional<int32_t> v = tokenizer.TokenToId(token);
      return v ? static_cast<int>(*v) : -1;
    };
    if (options.family == ModelFamily::kQwen2) {
      // Qwen2-Instruct: bos = eos-of-text in config, eos = <|im_end|>, generation adds both.
      config.bos_token_id = id("<|endoftext|>");
      int im_end = id("<|im_end|>");
      if (im_end >= 0) config.eos_token_ids = {im_end};
      gen_eos = config.eos_token_ids;
      if (config.bos_token_id >= 0) gen_eos.push_back(config.bos_token_id);
    } else {
      config.bos_token_id = id("<|begin_of_text|>");
      int end_of_text = id("<|end_of_text|>");
      int eot = id("<|eot_id|>");
      if (end_of_text >= 0) config.eos_token_ids = {end_of_text};
      gen_eos = config.eos_token_ids;
      if (eot >= 0) gen_eos.push_back(eot);
    }
    TANDEM_RETURN_IF_ERROR(WriteStringToFile(out_dir + "/tokenizer.json", files.tokenizer_json));
    TANDEM_RETURN_IF_ERROR(
        WriteStringToFile(out_dir + "/tokenizer_config.json", files.tokenizer_config_json));
  } else {
    config.bos_token_id = config.vocab_size - 2;
    config.eos_token_ids = {config.vocab_size - 1};
    gen_eos = config.eos_token_ids;
  }

  TANDEM_RETURN_IF_ERROR(WriteStringToFile(out_dir + "/config.json", ModelConfigToJson(config)));
  nlohmann::json gen;
  if (config.bos_token_id >= 0) gen["bos_token_id"] = config.bos_token_id;
  if (gen_eos.size() == 1) {
    gen["eos_token_id"] = gen_eos[0];
  } else if (!gen_eos.empty()) {
    gen["eos_token_id"] = gen_eos;
  }
  gen["do_sample"] = false;
  gen["transformers_version"] = "4.44.2";
  TANDEM_RETURN_IF_ERROR(
      WriteStringToFile(out_dir + "/generation_config.json", gen.dump(2) + "\n"));

  // Weights, in HF's parameter order.
  const int64_t h = config.hidden_size, q = config.q_dim(), kv = config.kv_dim(),
                inter = config.intermediate_size, vocab = config.vocab_size;
  WeightMaker w(options.seed);
  w.Normal("model.embed_tokens.weight", {vocab, h}, 0.0f, 1.0f / std::sqrt(static_cast<float>(h)));
  for (int i = 0; i < config.num_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    w.Matrix(p + "self_attn.q_proj.weight", q, h);
    w.Matrix(p + "self_attn.k_proj.weight", kv, h);
    w.Matrix(p + "self_attn.v_proj.weight", kv, h);
    if (config.qkv_bias) {
      w.Normal(p + "self_attn.q_proj.bias", {q}, 0.0f, 0.1f);
      w.Normal(p + "self_attn.k_proj.bias", {kv}, 0.0f, 0.1f);
      w.Normal(p + "self_attn.v_proj.bias", {kv}, 0.0f, 0.1f);
    }
    w.Matrix(p + "self_attn.o_proj.weight", h, q);
    if (config.o_bias) w.Normal(p + "self_attn.o_proj.bias", {h}, 0.0f, 0.1f);
    w.Matrix(p + "mlp.gate_proj.weight", inter, h);
    w.Matrix(p + "mlp.up_proj.weight", inter, h);
    w.Matrix(p + "mlp.down_proj.weight", h, inter);
    w.Normal(p + "input_layernorm.weight", {h}, 1.0f, 0.05f);
    w.Normal(p + "post_attention_layernorm.weight", {h}, 1.0f, 0.05f);
  }
  w.Normal("model.norm.weight", {h}, 1.0f, 0.05f);
  if (!config.tie_word_embeddings) w.Matrix("lm_head.weight", vocab, h);
  return w.Write(out_dir + "/model.safetensors", options.dtype);
}

}  // namespace tandem
