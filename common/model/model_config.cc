#include "common/model/model_config.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/model/gguf.h"
#include "common/model/gguf_checkpoint.h"

namespace tandem {
namespace {

using Json = nlohmann::json;

// Field readers: each says the file and field in its error. They never throw (type checks come
// before every get<>).
class FieldReader {
 public:
  FieldReader(const Json& json, std::string_view file) : json_(json), file_(file) {}

  Status Error(std::string_view field, std::string_view what) const {
    return InvalidArgument(std::string(file_) + ": field '" + std::string(field) + "' " +
                           std::string(what));
  }
  bool Has(const char* field) const { return json_.contains(field) && !json_[field].is_null(); }

  Status Int(const char* field, bool required, int* out, int min_value = 1) const {
    if (!Has(field)) return required ? Error(field, "is missing") : Status::Ok();
    const Json& v = json_[field];
    if (!v.is_number_integer()) return Error(field, "must be an integer");
    int64_t x = v.get<int64_t>();
    if (x < min_value || x > std::numeric_limits<int>::max())
      return Error(field, "must be an integer >= " + std::to_string(min_value));
    *out = static_cast<int>(x);
    return Status::Ok();
  }
  Status Double(const char* field, bool required, double* out) const {
    if (!Has(field)) return required ? Error(field, "is missing") : Status::Ok();
    const Json& v = json_[field];
    if (!v.is_number()) return Error(field, "must be a number");
    *out = v.get<double>();
    if (!std::isfinite(*out)) return Error(field, "must be finite");
    return Status::Ok();
  }
  Status Bool(const char* field, bool* out) const {
    if (!Has(field)) return Status::Ok();
    const Json& v = json_[field];
    if (!v.is_boolean()) return Error(field, "must be true or false");
    *out = v.get<bool>();
    return Status::Ok();
  }
  Status String(const char* field, std::string* out) const {
    if (!Has(field)) return Status::Ok();
    const Json& v = json_[field];
    if (!v.is_string()) return Error(field, "must be a string");
    *out = v.get<std::string>();
    return Status::Ok();
  }
  // An id or a list of ids (HF allows both for eos_token_id).
  Status IdList(const char* field, std::vector<int>* out) const {
    if (!Has(field)) return Status::Ok();
    const Json& v = json_[field];
    std::vector<int> ids;
    auto add = [&](const Json& item) -> Status {
      if (!item.is_number_integer() || item.get<int64_t>() < 0 ||
          item.get<int64_t>() > std::numeric_limits<int>::max())
        return Error(field, "must be a non-negative integer or a list of them");
      ids.push_back(static_cast<int>(item.get<int64_t>()));
      return Status::Ok();
    };
    if (v.is_array()) {
      for (const Json& item : v) TANDEM_RETURN_IF_ERROR(add(item));
    } else {
      TANDEM_RETURN_IF_ERROR(add(v));
    }
    *out = std::move(ids);
    return Status::Ok();
  }

 private:
  const Json& json_;
  std::string_view file_;
};

StatusOr<Json> ParseJsonObject(std::string_view text, std::string_view file_name) {
  Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return InvalidArgument(std::string(file_name) + ": not valid JSON");
  if (!json.is_object()) return InvalidArgument(std::string(file_name) + ": not a JSON object");
  return json;
}

Status ParseRopeScaling(const Json& json, std::string_view file, RopeScaling* out) {
  if (!json.contains("rope_scaling") || json["rope_scaling"].is_null()) return Status::Ok();
  const Json& rs = json["rope_scaling"];
  std::string where = std::string(file) + ": rope_scaling";
  if (!rs.is_object()) return InvalidArgument(where + " must be an object or null");
  FieldReader reader(rs, where);
  std::string type;
  TANDEM_RETURN_IF_ERROR(reader.String("rope_type", &type));
  if (type.empty()) TANDEM_RETURN_IF_ERROR(reader.String("type", &type));
  if (type.empty() || type == "default") return Status::Ok();
  if (type == "linear") {
    out->type = RopeScalingType::kLinear;
  } else if (type == "llama3") {
    out->type = RopeScalingType::kLlama3;
  } else {
    return InvalidArgument(where + ": rope_type '" + type +
                           "' is not supported (supported: default, linear, llama3)");
  }
  TANDEM_RETURN_IF_ERROR(reader.Double("factor", true, &out->factor));
  if (out->factor <= 0) return reader.Error("factor", "must be positive");
  if (out->type == RopeScalingType::kLlama3) {
    TANDEM_RETURN_IF_ERROR(reader.Double("low_freq_factor", true, &out->low_freq_factor));
    TANDEM_RETURN_IF_ERROR(reader.Double("high_freq_factor", true, &out->high_freq_factor));
    TANDEM_RETURN_IF_ERROR(reader.Int("original_max_position_embeddings", true,
                                      &out->original_max_position_embeddings));
    if (out->high_freq_factor <= out->low_freq_factor)
      return reader.Error("high_freq_factor", "must be greater than low_freq_factor");
  }
  return Status::Ok();
}

}  // namespace

std::string_view ModelFamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama: return "llama";
    case ModelFamily::kQwen2: return "qwen2";
    case ModelFamily::kMistral: return "mistral";
  }
  return "unknown";
}

int64_t ModelConfig::NumParameters() const {
  int64_t h = hidden_size;
  int64_t per_layer = 2 * h                                        // norms
                      + h * q_dim() + 2 * h * kv_dim() + q_dim() * h  // q, k, v, o
                      + 3 * h * intermediate_size;                 // gate, up, down
  if (qkv_bias) per_layer += q_dim() + 2 * kv_dim();
  if (o_bias) per_layer += h;
  int64_t total = per_layer * num_layers + h + int64_t{vocab_size} * h;
  if (!tie_word_embeddings) total += int64_t{vocab_size} * h;
  return total;
}

StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view file_name) {
  TANDEM_ASSIGN_OR_RETURN(Json json, ParseJsonObject(json_text, file_name));
  FieldReader reader(json, file_name);
  ModelConfig config;

  // The architecture decides the family; model_type is the fallback HF also accepts.
  if (reader.Has("architectures")) {
    const Json& archs = json["architectures"];
    if (!archs.is_array() || archs.empty() || !archs[0].is_string())
      return reader.Error("architectures", "must be a non-empty list of strings");
    config.architecture = archs[0].get<std::string>();
  }
  std::string model_type;
  TANDEM_RETURN_IF_ERROR(reader.String("model_type", &model_type));
  if (config.architecture == "LlamaForCausalLM" || (config.architecture.empty() && model_type == "llama")) {
    config.family = ModelFamily::kLlama;
  } else if (config.architecture == "Qwen2ForCausalLM" ||
             (config.architecture.empty() && model_type == "qwen2")) {
    config.family = ModelFamily::kQwen2;
  } else if (config.architecture == "MistralForCausalLM" ||
             (config.architecture.empty() && model_type == "mistral")) {
    config.family = ModelFamily::kMistral;
  } else {
    return reader.Error("architectures",
                        "'" + config.architecture + "' (model_type '" + model_type +
                            "') is not supported (supported: LlamaForCausalLM, "
                            "Qwen2ForCausalLM, MistralForCausalLM)");
  }
  if (config.architecture.empty()) {
    static const char* const kArch[] = {"LlamaForCausalLM", "Qwen2ForCausalLM",
                                        "MistralForCausalLM"};
    config.architecture = kArch[static_cast<int>(config.family)];
  }

  TANDEM_RETURN_IF_ERROR(reader.Int("hidden_size", true, &config.hidden_size));
  TANDEM_RETURN_IF_ERROR(reader.Int("intermediate_size", true, &config.intermediate_size));
  TANDEM_RETURN_IF_ERROR(reader.Int("num_hidden_layers", true, &config.num_layers));
  TANDEM_RETURN_IF_ERROR(reader.Int("num_attention_heads", true, &config.num_heads));
  config.num_kv_heads = config.num_heads;
  TANDEM_RETURN_IF_ERROR(reader.Int("num_key_value_heads", false, &config.num_kv_heads));
  TANDEM_RETURN_IF_ERROR(reader.Int("vocab_size", true, &config.vocab_size));
  config.max_position_embeddings = 2048;
  TANDEM_RETURN_IF_ERROR(
      reader.Int("max_position_embeddings", false, &config.max_position_embeddings));
  TANDEM_RETURN_IF_ERROR(reader.Double("rope_theta", false, &config.rope_theta));
  if (config.rope_theta <= 0) return reader.Error("rope_theta", "must be positive");
  TANDEM_RETURN_IF_ERROR(reader.Double("rms_norm_eps", false, &config.rms_norm_eps));
  if (config.rms_norm_eps < 0) return reader.Error("rms_norm_eps", "must not be negative");
  TANDEM_RETURN_IF_ERROR(reader.Bool("tie_word_embeddings", &config.tie_word_embeddings));
  TANDEM_RETURN_IF_ERROR(reader.String("torch_dtype", &config.torch_dtype));
  TANDEM_RETURN_IF_ERROR(reader.Int("bos_token_id", false, &config.bos_token_id, 0));
  TANDEM_RETURN_IF_ERROR(reader.IdList("eos_token_id", &config.eos_token_ids));
  TANDEM_RETURN_IF_ERROR(ParseRopeScaling(json, file_name, &config.rope_scaling));

  if (config.num_heads % config.num_kv_heads != 0)
    return reader.Error("num_key_value_heads", "must divide num_attention_heads (" +
                                                   std::to_string(config.num_heads) + ")");
  if (reader.Has("head_dim")) {
    TANDEM_RETURN_IF_ERROR(reader.Int("head_dim", true, &config.head_dim));
  } else {
    if (config.hidden_size % config.num_heads != 0)
      return reader.Error("num_attention_heads", "must divide hidden_size when head_dim is absent");
    config.head_dim = config.hidden_size / config.num_heads;
  }
  if (config.head_dim % 2 != 0) return reader.Error("head_dim", "must be even (RoPE)");

  std::string act = "silu";
  TANDEM_RETURN_IF_ERROR(reader.String("hidden_act", &act));
  if (act != "silu") return reader.Error("hidden_act", "'" + act + "' is not supported (silu)");
  bool mlp_bias = false;
  TANDEM_RETURN_IF_ERROR(reader.Bool("mlp_bias", &mlp_bias));
  if (mlp_bias) return reader.Error("mlp_bias", "true is not supported");

  switch (config.family) {
    case ModelFamily::kLlama: {
      bool attention_bias = false;
      TANDEM_RETURN_IF_ERROR(reader.Bool("attention_bias", &attention_bias));
      config.qkv_bias = config.o_bias = attention_bias;
      int tp = 1;
      TANDEM_RETURN_IF_ERROR(reader.Int("pretraining_tp", false, &tp));
      break;
    }
    case ModelFamily::kQwen2: {
      config.qkv_bias = true;  // Qwen2Attention always has q/k/v bias, never o bias
      bool use_sliding_window = false;
      TANDEM_RETURN_IF_ERROR(reader.Bool("use_sliding_window", &use_sliding_window));
      if (use_sliding_window) return reader.Error("use_sliding_window", "true is not supported");
      break;
    }
    case ModelFamily::kMistral:
      TANDEM_RETURN_IF_ERROR(reader.Int("sliding_window", false, &config.sliding_window));
      break;
  }
  return config;
}

StatusOr<GenerationConfig> ParseGenerationConfig(std::string_view json_text,
                                                 std::string_view file_name) {
  TANDEM_ASSIGN_OR_RETURN(Json json, ParseJsonObject(json_text, file_name));
  FieldReader reader(json, file_name);
  GenerationConfig gen;
  TANDEM_RETURN_IF_ERROR(reader.Int("bos_token_id", false, &gen.bos_token_id, 0));
  TANDEM_RETURN_IF_ERROR(reader.IdList("eos_token_id", &gen.eos_token_ids));
  TANDEM_RETURN_IF_ERROR(reader.Bool("do_sample", &gen.do_sample));
  TANDEM_RETURN_IF_ERROR(reader.Double("temperature", false, &gen.temperature));
  TANDEM_RETURN_IF_ERROR(reader.Double("top_p", false, &gen.top_p));
  TANDEM_RETURN_IF_ERROR(reader.Int("top_k", false, &gen.top_k, 0));
  TANDEM_RETURN_IF_ERROR(reader.Double("repetition_penalty", false, &gen.repetition_penalty));
  if (gen.temperature < 0) return reader.Error("temperature", "must not be negative");
  if (gen.top_p <= 0 || gen.top_p > 1) return reader.Error("top_p", "must be in (0, 1]");
  return gen;
}

StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return DataLoss(path + ": read error");
  return text.str();
}

Status WriteStringToFile(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Internal(path + ": cannot open for writing");
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  if (!out) return Internal(path + ": write failed");
  return Status::Ok();
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  if (IsGgufPath(model_dir)) {
    TANDEM_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(model_dir));
    return ModelConfigFromGguf(file);
  }
  std::string path = model_dir + "/config.json";
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  TANDEM_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(text, path));
  std::string gen_path = model_dir + "/generation_config.json";
  StatusOr<std::string> gen_text = ReadFileToString(gen_path);
  if (gen_text.ok()) {
    TANDEM_ASSIGN_OR_RETURN(GenerationConfig gen, ParseGenerationConfig(*gen_text, gen_path));
    if (!gen.eos_token_ids.empty()) config.eos_token_ids = gen.eos_token_ids;
    if (gen.bos_token_id >= 0) config.bos_token_id = gen.bos_token_id;
  }
  return config;
}

StatusOr<GenerationConfig> LoadGenerationConfig(const std::string& model_dir,
                                                const ModelConfig& config) {
  std::string gen_path = model_dir + "/generation_config.json";
  GenerationConfig gen;
  // A GGUF file carries no sampling defaults: the config's bos/eos ids only.
  StatusOr<std::string> gen_text =
      IsGgufPath(model_dir) ? StatusOr<std::string>(NotFound("")) : ReadFileToString(gen_path);
  if (gen_text.ok()) {
    TANDEM_ASSIGN_OR_RETURN(gen, ParseGenerationConfig(*gen_text, gen_path));
  }
  if (gen.eos_token_ids.empty()) gen.eos_token_ids = config.eos_token_ids;
  if (gen.bos_token_id < 0) gen.bos_token_id = config.bos_token_id;
  return gen;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  // nlohmann::json keeps keys sorted, as HF's to_json_string(sort_keys=True) does.
  Json json;
  json["architectures"] = Json::array({c.architecture});
  json["attention_dropout"] = 0.0;
  if (c.bos_token_id >= 0) json["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) {
    json["eos_token_id"] = c.eos_token_ids[0];
  } else if (!c.eos_token_ids.empty()) {
    json["eos_token_id"] = c.eos_token_ids;
  }
  json["hidden_act"] = "silu";
  json["hidden_size"] = c.hidden_size;
  json["initializer_range"] = 0.02;
  json["intermediate_size"] = c.intermediate_size;
  json["max_position_embeddings"] = c.max_position_embeddings;
  json["model_type"] = std::string(ModelFamilyName(c.family));
  json["num_attention_heads"] = c.num_heads;
  json["num_hidden_layers"] = c.num_layers;
  json["num_key_value_heads"] = c.num_kv_heads;
  if (c.head_dim * c.num_heads != c.hidden_size) json["head_dim"] = c.head_dim;
  json["rms_norm_eps"] = c.rms_norm_eps;
  json["rope_theta"] = c.rope_theta;
  switch (c.rope_scaling.type) {
    case RopeScalingType::kNone: json["rope_scaling"] = nullptr; break;
    case RopeScalingType::kLinear:
      json["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
      break;
    case RopeScalingType::kLlama3:
      json["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", c.rope_scaling.factor},
          {"low_freq_factor", c.rope_scaling.low_freq_factor},
          {"high_freq_factor", c.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
      break;
  }
  json["tie_word_embeddings"] = c.tie_word_embeddings;
  json["torch_dtype"] = c.torch_dtype.empty() ? "float32" : c.torch_dtype;
  json["transformers_version"] = "4.44.2";
  json["use_cache"] = true;
  json["vocab_size"] = c.vocab_size;
  switch (c.family) {
    case ModelFamily::kLlama:
      json["attention_bias"] = c.qkv_bias;
      json["mlp_bias"] = false;
      json["pretraining_tp"] = 1;
      break;
    case ModelFamily::kQwen2:
      json["max_window_layers"] = c.num_layers;
      json["sliding_window"] = c.max_position_embeddings;
      json["use_sliding_window"] = false;
      break;
    case ModelFamily::kMistral:
      if (c.sliding_window > 0) {
        json["sliding_window"] = c.sliding_window;
      } else {
        json["sliding_window"] = nullptr;
      }
      break;
  }
  return json.dump(2) + "\n";
}

}  // namespace tandem
