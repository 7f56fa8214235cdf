#include "common/model/model_config.h"

#include <catch2/catch.hpp>

#include <filesystem>

#include "common/model/make_model.h"
#include "common/model/model.h"
#include "common/model/safetensors.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

// Llama 3.1 8B's config.json, as published.
constexpr const char* kLlama31 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

constexpr const char* kQwen2 = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

constexpr const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false,
  "vocab_size": 32768, "head_dim": 128})";

TEST_CASE("real Llama 3.1, Qwen2 and Mistral configs parse", "[model_config]") {
  auto llama = ParseModelConfig(kLlama31, "config.json");
  REQUIRE(llama.ok());
  CHECK(llama->family == ModelFamily::kLlama);
  CHECK(llama->num_kv_heads == 8);
  CHECK(llama->head_dim == 128);
  CHECK(llama->rope_scaling.type == RopeScalingType::kLlama3);
  CHECK(llama->rope_scaling.original_max_position_embeddings == 8192);
  CHECK(llama->eos_token_ids == std::vector<int>{128001, 128008, 128009});
  CHECK_FALSE(llama->qkv_bias);
  CHECK(llama->NumParameters() == 8030261248);

  auto qwen = ParseModelConfig(kQwen2, "config.json");
  REQUIRE(qwen.ok());
  CHECK(qwen->qkv_bias);
  CHECK_FALSE(qwen->o_bias);
  CHECK(qwen->tie_word_embeddings);
  CHECK(qwen->eos_token_ids == std::vector<int>{151645});
  CHECK(qwen->NumParameters() == 494032768);

  auto mistral = ParseModelConfig(kMistral, "config.json");
  REQUIRE(mistral.ok());
  CHECK(mistral->family == ModelFamily::kMistral);
  CHECK(mistral->head_dim == 128);
  CHECK(mistral->sliding_window == 0);
}

TEST_CASE("config errors name the file and the field", "[model_config]") {
  auto error = [](const std::string& text) {
    auto c = ParseModelConfig(text, "/m/config.json");
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().message().rfind("/m/config.json", 0) == 0);
    return c.status().message();
  };
  std::string base = kLlama31;
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = base;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  CHECK(error("{") .find("not valid JSON") != std::string::npos);
  CHECK(error(replace("\"hidden_size\": 4096,", "")).find("'hidden_size' is missing") !=
        std::string::npos);
  CHECK(error(replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5"))
            .find("num_key_value_heads") != std::string::npos);
  CHECK(error(replace("\"hidden_size\": 4096", "\"hidden_size\": \"big\""))
            .find("'hidden_size' must be an integer") != std::string::npos);
  CHECK(error(replace("\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"")).find("yarn") !=
        std::string::npos);
  CHECK(error(replace("LlamaForCausalLM", "GPT2LMHeadModel")).find("GPT2LMHeadModel") !=
        std::string::npos);
  CHECK(error(replace("[128001, 128008, 128009]", "[\"x\"]")).find("eos_token_id") !=
        std::string::npos);
}

TEST_CASE("generation_config eos ids override config.json", "[model_config]") {
  test::TempDir dir;
  dir.Write("config.json", kQwen2);
  dir.Write("generation_config.json", R"({"bos_token_id": 151643, "eos_token_id": [151645, 151643],
    "do_sample": true, "temperature": 0.7, "top_p": 0.8, "top_k": 20})");
  auto config = LoadModelConfig(dir.path().string());
  REQUIRE(config.ok());
  CHECK(config->eos_token_ids == std::vector<int>{151645, 151643});
  auto gen = LoadGenerationConfig(dir.path().string(), *config);
  REQUIRE(gen.ok());
  CHECK(gen->do_sample);
  CHECK(gen->top_k == 20);
  dir.Write("generation_config.json", R"({"top_p": 2})");
  auto bad = LoadGenerationConfig(dir.path().string(), *config);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("generation_config.json: field 'top_p'") != std::string::npos);
}

TEST_CASE("make-model configs round trip and Model::Load names bad tensors", "[model_config]") {
  test::TempDir dir;
  MakeModelOptions options;
  options.with_tokenizer = false;
  std::string path = (dir.path() / "m").string();
  REQUIRE(MakeModel(options, path).ok());
  auto config = LoadModelConfig(path);
  REQUIRE(config.ok());
  CHECK(config->NumParameters() > 800000);
  CHECK(config->NumParameters() < 1200000);
  REQUIRE(Model::Load(path).ok());

  // Replace the weights by a file missing one tensor and mis-shaping another.
  auto reader = SafetensorsReader::OpenDir(path);
  REQUIRE(reader.ok());
  std::vector<std::vector<float>> keep;
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, view] : reader->tensors()) {
    if (name == "model.layers.1.mlp.up_proj.weight") continue;
    keep.emplace_back(view.NumElements());
    ConvertToF32(view.dtype, view.data, keep.back().size(), keep.back().data());
    tensors.push_back({name, view.shape, keep.back(), DType::kF32});
  }
  std::string broken = (dir.path() / "broken").string();
  std::filesystem::create_directories(broken);
  std::filesystem::copy(path + "/config.json", broken + "/config.json");
  REQUIRE(WriteSafetensors(broken + "/model.safetensors", tensors).ok());
  auto missing = Model::Load(broken);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("model.layers.1.mlp.up_proj.weight") != std::string::npos);
  CHECK(missing.status().message().find("[384, 128]") != std::string::npos);

  for (auto& t : tensors)
    if (t.name == "model.norm.weight") t.shape = {2, 64};
  std::vector<float> up(384 * 128);
  tensors.push_back({"model.layers.1.mlp.up_proj.weight", {384, 128}, up, DType::kF32});
  REQUIRE(WriteSafetensors(broken + "/model.safetensors", tensors).ok());
  auto shaped = Model::Load(broken);
  REQUIRE_FALSE(shaped.ok());
  CHECK(shaped.status().message().find("'model.norm.weight' has shape [2, 64], expected [128]") !=
        std::string::npos);
}

}  // namespace
}  // namespace tandem
