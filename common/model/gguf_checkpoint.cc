#include "common/model/gguf_checkpoint.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <limits>
#include <optional>
#include <system_error>
#include <vector>

#include "common/model/gguf_quants.h"

namespace tandem {
namespace {

constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();

struct Architecture {
  const char* gguf_name;
  ModelFamily family;
  const char* hf_name;
};
constexpr Architecture kArchitectures[] = {
    {"llama", ModelFamily::kLlama, "LlamaForCausalLM"},
    {"qwen2", ModelFamily::kQwen2, "Qwen2ForCausalLM"},
};

// The per-layer tensors ("blk.N." + suffix) of a config, with their GGUF dims (dims[0] is
// contiguous: a [rows, cols] matrix is {cols, rows}), in file order.
std::vector<std::pair<std::string, std::vector<int64_t>>> LayerTensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), inter = c.intermediate_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> t = {
      {"attn_norm.weight", {h}},         {"attn_q.weight", {h, q}},
      {"attn_k.weight", {h, kv}},        {"attn_v.weight", {h, kv}},
      {"attn_output.weight", {q, h}},    {"ffn_norm.weight", {h}},
      {"ffn_gate.weight", {h, inter}},   {"ffn_up.weight", {h, inter}},
      {"ffn_down.weight", {inter, h}}};
  if (c.qkv_bias) {
    t.push_back({"attn_q.bias", {q}});
    t.push_back({"attn_k.bias", {kv}});
    t.push_back({"attn_v.bias", {kv}});
  }
  if (c.o_bias) t.push_back({"attn_output.bias", {h}});
  return t;
}

// The GGUF dims tensor `name` has in a model of config `c`; nullopt when it has no such tensor.
std::optional<std::vector<int64_t>> ExpectedDims(
    const std::string& name, const ModelConfig& c,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& layer) {
  const int64_t h = c.hidden_size, vocab = c.vocab_size;
  if (name == "token_embd.weight") return std::vector<int64_t>{h, vocab};
  if (name == "output_norm.weight") return std::vector<int64_t>{h};
  if (name == "output.weight" && !c.tie_word_embeddings) return std::vector<int64_t>{h, vocab};
  if (name.rfind("blk.", 0) != 0) return std::nullopt;
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos) return std::nullopt;
  const std::string index = name.substr(4, dot - 4);
  if (index.empty() || index.size() > 6 || (index.size() > 1 && index[0] == '0') ||
      !std::all_of(index.begin(), index.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) ||
      std::stoi(index) >= c.num_layers)
    return std::nullopt;
  for (const auto& [suffix, dims] : layer) {
    if (name.compare(dot + 1, std::string::npos, suffix) == 0) return dims;
  }
  return std::nullopt;
}

// The file's tensors are exactly the ones the config implies, of the shapes it implies and of
// types Tandem dequantizes: anything else is a variant Tandem would mis-run, and checking here
// refuses it before Model::Load allocates for the config's sizes.
Status CheckTensors(const GgufFile& file, const ModelConfig& c) {
  const auto layer = LayerTensors(c);
  for (const GgufTensorInfo& t : file.tensors()) {
    const std::string where = file.path() + ": tensor '" + t.name + "'";
    if (t.name == "rope_freqs.weight")
      return InvalidArgument(where + " (llama3 RoPE frequency scaling) is not supported");
    std::optional<std::vector<int64_t>> dims = ExpectedDims(t.name, c, layer);
    if (!dims)
      return InvalidArgument(where + " is not part of a " + std::string(ModelFamilyName(c.family)) +
                             " model with " + std::to_string(c.num_layers) +
                             " layers (an architecture variant Tandem does not support)");
    if (t.dims != *dims) {
      const std::vector<int64_t> want(dims->rbegin(), dims->rend());
      return InvalidArgument(where + " has shape " + ShapeToString(t.Shape()) + ", expected " +
                             ShapeToString(want) + " from the metadata");
    }
    if (!CanDequantize(t.type))
      return InvalidArgument(where + " has type " +
                             std::string(FindGgmlType(static_cast<uint32_t>(t.type))->name) +
                             ", which Tandem cannot dequantize (supported: " +
                             DequantizableTypeNames() + ")");
  }
  // Every file tensor is an expected one (names are unique): all are there when the counts agree.
  const size_t expected = 2 + (c.tie_word_embeddings ? 0 : 1) +
                          static_cast<size_t>(c.num_layers) * layer.size();
  if (file.tensors().size() == expected) return Status::Ok();
  // Else name the first missing one (the search stops there, so it is bounded by the file).
  std::vector<std::string> names = {"token_embd.weight", "output_norm.weight"};
  for (const std::string& n : names) {
    if (file.FindTensor(n) == nullptr) return NotFound(file.path() + ": tensor '" + n + "' is missing");
  }
  for (int i = 0; i < c.num_layers; ++i) {
    for (const auto& [suffix, dims] : layer) {
      const std::string n = "blk." + std::to_string(i) + "." + suffix;
      if (file.FindTensor(n) == nullptr)
        return NotFound(file.path() + ": tensor '" + n + "' is missing");
    }
  }
  return Internal(file.path() + ": tensor count " + std::to_string(file.tensors().size()) +
                  " disagrees with the expected " + std::to_string(expected));
}

Status ReadRopeScaling(const GgufFile& file, const std::string& p, ModelConfig* c) {
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> type,
                          file.GetOptionalString(p + "rope.scaling.type"));
  // Older files say linear scaling with rope.scale_linear alone.
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> scale_linear,
                          file.GetOptionalFloat(p + "rope.scale_linear"));
  if (!type && scale_linear && *scale_linear != 1.0) {
    if (*scale_linear <= 0) return file.KeyError(p + "rope.scale_linear", "must be positive");
    c->rope_scaling.type = RopeScalingType::kLinear;
    c->rope_scaling.factor = *scale_linear;
    return Status::Ok();
  }
  if (!type || *type == "none") return Status::Ok();
  if (*type != "linear")
    return file.KeyError(p + "rope.scaling.type",
                         "is '" + *type + "', which is not supported (supported: none, linear)");
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> factor,
                          file.GetOptionalFloat(p + "rope.scaling.factor"));
  if (!factor) return file.KeyError(p + "rope.scaling.factor", "is missing (scaling type linear)");
  if (*factor <= 0) return file.KeyError(p + "rope.scaling.factor", "must be positive");
  c->rope_scaling.type = RopeScalingType::kLinear;
  c->rope_scaling.factor = *factor;
  return Status::Ok();
}

// An array-valued key of the given element kind (strings, integers or floats); nullptr when
// absent.
enum class ArrayKind { kString, kInt, kFloat };
StatusOr<const GgufValue*> OptionalArray(const GgufFile& file, const std::string& key,
                                         ArrayKind kind) {
  const GgufValue* v = file.Find(key);
  if (v == nullptr) return static_cast<const GgufValue*>(nullptr);
  const char* want = kind == ArrayKind::kString ? "strings"
                     : kind == ArrayKind::kInt  ? "integers"
                                                : "floats";
  bool ok = v->is_array();
  if (ok) {
    const GgufValueType t = v->array_type();
    switch (kind) {
      case ArrayKind::kString: ok = t == GgufValueType::kString; break;
      case ArrayKind::kFloat:
        ok = t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
        break;
      case ArrayKind::kInt:
        ok = t != GgufValueType::kString && t != GgufValueType::kFloat32 &&
             t != GgufValueType::kFloat64 && t != GgufValueType::kBool;
        break;
    }
  }
  if (!ok)
    return file.KeyError(key, std::string("must be an array of ") + want + ", not " +
                                  (v->is_array() ? "an array of " + GgufValueTypeName(v->array_type())
                                                 : GgufValueTypeName(v->type())));
  return v;
}

Status ReadTokenId(const GgufFile& file, const std::string& key, size_t vocab,
                   std::optional<int32_t>* out) {
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> id,
                          file.GetOptionalInt(key, 0, static_cast<int64_t>(vocab) - 1));
  if (id) *out = static_cast<int32_t>(*id);
  return Status::Ok();
}

}  // namespace

bool IsGgufPath(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return std::tolower(ch); });
  std::error_code ec;
  return ext == ".gguf" && !std::filesystem::is_directory(path, ec);
}

StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& file) {
  TANDEM_ASSIGN_OR_RETURN(std::string arch, file.GetString("general.architecture"));
  const Architecture* found = nullptr;
  for (const Architecture& a : kArchitectures) {
    if (arch == a.gguf_name) found = &a;
  }
  if (found == nullptr)
    return file.KeyError("general.architecture",
                         "is '" + arch + "', which is not supported (supported: llama, qwen2)");
  ModelConfig c;
  c.family = found->family;
  c.architecture = found->hf_name;
  const std::string p = arch + ".";

  TANDEM_ASSIGN_OR_RETURN(int64_t layers, file.GetInt(p + "block_count", 1, 1 << 16));
  TANDEM_ASSIGN_OR_RETURN(int64_t hidden, file.GetInt(p + "embedding_length", 1, 1 << 20));
  TANDEM_ASSIGN_OR_RETURN(int64_t inter, file.GetInt(p + "feed_forward_length", 1, 1 << 22));
  TANDEM_ASSIGN_OR_RETURN(int64_t heads, file.GetInt(p + "attention.head_count", 1, 1 << 14));
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads,
                          file.GetOptionalInt(p + "attention.head_count_kv", 1, heads));
  TANDEM_ASSIGN_OR_RETURN(int64_t context, file.GetInt(p + "context_length", 1, kIntMax));
  c.num_layers = static_cast<int>(layers);
  c.hidden_size = static_cast<int>(hidden);
  c.intermediate_size = static_cast<int>(inter);
  c.num_heads = static_cast<int>(heads);
  c.num_kv_heads = static_cast<int>(kv_heads.value_or(heads));
  c.max_position_embeddings = static_cast<int>(context);
  if (c.num_heads % c.num_kv_heads != 0)
    return file.KeyError(p + "attention.head_count_kv",
                         "(" + std::to_string(c.num_kv_heads) + ") must divide " + p +
                             "attention.head_count (" + std::to_string(c.num_heads) + ")");

  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> key_length,
                          file.GetOptionalInt(p + "attention.key_length", 1, 1 << 16));
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> value_length,
                          file.GetOptionalInt(p + "attention.value_length", 1, 1 << 16));
  if (key_length) {
    c.head_dim = static_cast<int>(*key_length);
  } else {
    if (c.hidden_size % c.num_heads != 0)
      return file.KeyError(p + "attention.head_count",
                           "must divide " + p + "embedding_length when " + p +
                               "attention.key_length is absent");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (value_length && *value_length != c.head_dim)
    return file.KeyError(p + "attention.value_length",
                         "(" + std::to_string(*value_length) + ") differs from the key length (" +
                             std::to_string(c.head_dim) + "), which is not supported");
  if (c.head_dim % 2 != 0) return file.KeyError(p + "attention.key_length", "must be even (RoPE)");
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> rope_dims,
                          file.GetOptionalInt(p + "rope.dimension_count", 0, 1 << 16));
  if (rope_dims && *rope_dims != c.head_dim)
    return file.KeyError(p + "rope.dimension_count",
                         "(" + std::to_string(*rope_dims) + ") differs from the head size (" +
                             std::to_string(c.head_dim) + "): partial RoPE is not supported");
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> theta, file.GetOptionalFloat(p + "rope.freq_base"));
  if (theta) {
    if (*theta <= 0) return file.KeyError(p + "rope.freq_base", "must be positive");
    c.rope_theta = *theta;
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> eps,
                          file.GetOptionalFloat(p + "attention.layer_norm_rms_epsilon"));
  if (!eps) return file.KeyError(p + "attention.layer_norm_rms_epsilon", "is missing");
  if (*eps < 0) return file.KeyError(p + "attention.layer_norm_rms_epsilon", "must not be negative");
  c.rms_norm_eps = *eps;
  TANDEM_RETURN_IF_ERROR(ReadRopeScaling(file, p, &c));
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> experts,
                          file.GetOptionalInt(p + "expert_count", 0, kIntMax));
  if (experts && *experts > 0)
    return file.KeyError(p + "expert_count", "is " + std::to_string(*experts) +
                                                 ": mixture-of-experts models are not supported");

  // The vocabulary: the key, else the embedding's rows (the weights decide; a padded embedding
  // has more rows than tokens), else the token table.
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> vocab,
                          file.GetOptionalInt(p + "vocab_size", 1, kIntMax));
  if (!vocab) {
    if (const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
        embd != nullptr && embd->dims.size() == 2 && embd->dims[1] > 0) {
      vocab = std::min<int64_t>(embd->dims[1], kIntMax);
    } else if (const GgufValue* tokens = file.Find("tokenizer.ggml.tokens");
               tokens != nullptr && tokens->is_array() && tokens->array_size() > 0) {
      vocab = static_cast<int64_t>(std::min<size_t>(tokens->array_size(), kIntMax));
    } else {
      return file.KeyError(p + "vocab_size",
                           "is missing and there is neither a 2-D token_embd.weight nor "
                           "tokenizer.ggml.tokens to take the vocabulary size from");
    }
  }
  c.vocab_size = static_cast<int>(*vocab);

  c.tie_word_embeddings = file.FindTensor("output.weight") == nullptr;
  if (c.family == ModelFamily::kQwen2) {
    c.qkv_bias = true;  // Qwen2Attention: q/k/v bias, no o bias
  } else {
    // Llama with attention_bias: the biases are there (all of them, or Load names the missing).
    c.qkv_bias = file.FindTensor("blk.0.attn_q.bias") != nullptr;
    c.o_bias = file.FindTensor("blk.0.attn_output.bias") != nullptr;
  }
  TANDEM_RETURN_IF_ERROR(CheckTensors(file, c));

  const size_t vocab_size = static_cast<size_t>(c.vocab_size);
  std::optional<int32_t> bos, eos, eot, eom;
  TANDEM_RETURN_IF_ERROR(ReadTokenId(file, "tokenizer.ggml.bos_token_id", vocab_size, &bos));
  TANDEM_RETURN_IF_ERROR(ReadTokenId(file, "tokenizer.ggml.eos_token_id", vocab_size, &eos));
  TANDEM_RETURN_IF_ERROR(ReadTokenId(file, "tokenizer.ggml.eot_token_id", vocab_size, &eot));
  TANDEM_RETURN_IF_ERROR(ReadTokenId(file, "tokenizer.ggml.eom_token_id", vocab_size, &eom));
  if (bos) c.bos_token_id = *bos;
  // Generation stops at any of them, as llama.cpp does (HF lists them in generation_config).
  for (const std::optional<int32_t>& id : {eos, eot, eom}) {
    if (id && std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), *id) ==
                  c.eos_token_ids.end())
      c.eos_token_ids.push_back(*id);
  }
  return c;
}

StatusOr<GgufVocab> GgufVocabFromFile(const GgufFile& file) {
  GgufVocab v;
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> model,
                          file.GetOptionalString("tokenizer.ggml.model"));
  if (!model) return file.KeyError("tokenizer.ggml.model", "is missing: the file has no tokenizer");
  v.model = *model;
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> pre,
                          file.GetOptionalString("tokenizer.ggml.pre"));
  v.pre = pre.value_or("default");

  TANDEM_ASSIGN_OR_RETURN(const GgufValue* tokens,
                          OptionalArray(file, "tokenizer.ggml.tokens", ArrayKind::kString));
  if (tokens == nullptr || tokens->array_size() == 0)
    return file.KeyError("tokenizer.ggml.tokens", "is missing or empty");
  if (tokens->array_size() > static_cast<size_t>(kIntMax))
    return file.KeyError("tokenizer.ggml.tokens", "has more tokens than ids can number");
  const size_t n = tokens->array_size();
  v.tokens.reserve(n);
  for (size_t i = 0; i < n; ++i) v.tokens.emplace_back(*tokens->StringAt(i));

  TANDEM_ASSIGN_OR_RETURN(const GgufValue* types,
                          OptionalArray(file, "tokenizer.ggml.token_type", ArrayKind::kInt));
  if (types != nullptr) {
    if (types->array_size() != n)
      return file.KeyError("tokenizer.ggml.token_type",
                           "has " + std::to_string(types->array_size()) + " entries for " +
                               std::to_string(n) + " tokens");
    v.token_types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      std::optional<int64_t> t = types->IntAt(i);
      if (!t || *t < 0 || *t > static_cast<int64_t>(GgufTokenType::kByte))
        return file.KeyError("tokenizer.ggml.token_type",
                             "has type " + (t ? std::to_string(*t) : std::string("?")) +
                                 " for token " + std::to_string(i) + " (types are 0 to 6)");
      v.token_types.push_back(static_cast<GgufTokenType>(*t));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* scores,
                          OptionalArray(file, "tokenizer.ggml.scores", ArrayKind::kFloat));
  if (scores != nullptr) {
    if (scores->array_size() != n)
      return file.KeyError("tokenizer.ggml.scores", "has " + std::to_string(scores->array_size()) +
                                                        " entries for " + std::to_string(n) +
                                                        " tokens");
    v.scores.reserve(n);
    for (size_t i = 0; i < n; ++i) v.scores.push_back(static_cast<float>(*scores->FloatAt(i)));
  }
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* merges,
                          OptionalArray(file, "tokenizer.ggml.merges", ArrayKind::kString));
  if (merges != nullptr) {
    v.merges.reserve(merges->array_size());
    for (size_t i = 0; i < merges->array_size(); ++i) v.merges.emplace_back(*merges->StringAt(i));
  }
  TANDEM_RETURN_IF_ERROR(ReadTokenId(file, "tokenizer.ggml.bos_token_id", n, &v.bos_id));
  TANDEM_RETURN_IF_ERROR(ReadTokenId(file, "tokenizer.ggml.eos_token_id", n, &v.eos_id));
  TANDEM_RETURN_IF_ERROR(ReadTokenId(file, "tokenizer.ggml.unknown_token_id", n, &v.unk_id));
  TANDEM_RETURN_IF_ERROR(ReadTokenId(file, "tokenizer.ggml.padding_token_id", n, &v.pad_id));
  TANDEM_ASSIGN_OR_RETURN(v.add_bos, file.GetOptionalBool("tokenizer.ggml.add_bos_token"));
  TANDEM_ASSIGN_OR_RETURN(v.add_eos, file.GetOptionalBool("tokenizer.ggml.add_eos_token"));
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> chat_template,
                          file.GetOptionalString("tokenizer.chat_template"));
  v.chat_template = chat_template.value_or("");
  return v;
}

GgufTensorSource::GgufTensorSource(GgufFile file, const ModelConfig& config)
    : file_(std::move(file)), config_(config) {}

std::string GgufTensorSource::GgufName(const std::string& name, int* permuted_heads) const {
  *permuted_heads = 0;
  if (name == "model.embed_tokens.weight") return "token_embd.weight";
  if (name == "model.norm.weight") return "output_norm.weight";
  if (name == "lm_head.weight") return "output.weight";
  static const std::string kLayers = "model.layers.";
  if (name.rfind(kLayers, 0) != 0) return "";
  const size_t dot = name.find('.', kLayers.size());
  if (dot == std::string::npos) return "";
  const std::string layer = name.substr(kLayers.size(), dot - kLayers.size());
  const std::string rest = name.substr(dot + 1);
  struct Part {
    const char* hf;
    const char* gguf;
    int permute;  // 1: query heads, 2: key/value heads (llama only)
  };
  static const Part kParts[] = {
      {"input_layernorm.weight", "attn_norm.weight", 0},
      {"self_attn.q_proj.weight", "attn_q.weight", 1},
      {"self_attn.q_proj.bias", "attn_q.bias", 1},
      {"self_attn.k_proj.weight", "attn_k.weight", 2},
      {"self_attn.k_proj.bias", "attn_k.bias", 2},
      {"self_attn.v_proj.weight", "attn_v.weight", 0},
      {"self_attn.v_proj.bias", "attn_v.bias", 0},
      {"self_attn.o_proj.weight", "attn_output.weight", 0},
      {"self_attn.o_proj.bias", "attn_output.bias", 0},
      {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
      {"mlp.gate_proj.weight", "ffn_gate.weight", 0},
      {"mlp.up_proj.weight", "ffn_up.weight", 0},
      {"mlp.down_proj.weight", "ffn_down.weight", 0},
  };
  for (const Part& part : kParts) {
    if (rest != part.hf) continue;
    if (config_.family == ModelFamily::kLlama && part.permute != 0)
      *permuted_heads = part.permute == 1 ? config_.num_heads : config_.num_kv_heads;
    return "blk." + layer + "." + part.gguf;
  }
  return "";
}

bool GgufTensorSource::Has(const std::string& name) const {
  int heads;
  const std::string gguf = GgufName(name, &heads);
  return !gguf.empty() && file_.FindTensor(gguf) != nullptr;
}

Status GgufTensorSource::ReadF32(const std::string& name, std::span<const int64_t> expected_shape,
                                 std::span<float> out) const {
  int heads = 0;
  const std::string gguf = GgufName(name, &heads);
  const GgufTensorInfo* t = gguf.empty() ? nullptr : file_.FindTensor(gguf);
  if (t == nullptr)
    return NotFound("tensor '" + (gguf.empty() ? name : gguf) + "' (" + name +
                    ", expected shape " + ShapeToString(expected_shape) + ") is missing");
  const std::vector<int64_t> shape = t->Shape();
  if (!std::equal(shape.begin(), shape.end(), expected_shape.begin(), expected_shape.end()))
    return InvalidArgument("tensor '" + gguf + "' has shape " + ShapeToString(shape) +
                           ", expected " + ShapeToString(expected_shape) + " (" + name + ")");
  if (!CanDequantize(t->type))
    return InvalidArgument("tensor '" + gguf + "' has type " +
                           std::string(FindGgmlType(static_cast<uint32_t>(t->type))->name) +
                           ", which Tandem cannot dequantize (supported: " +
                           DequantizableTypeNames() + ")");
  TANDEM_CHECK(out.size() == t->num_elements, gguf);
  DequantizeToF32(t->type, t->data, out.size(), out.data());
  if (heads == 0) return Status::Ok();

  // Undo convert_hf_to_gguf.py's permute: per head, GGUF row 2*i + j holds HF row j*half + i
  // (j: which half of the head, i < half).
  const size_t rows = static_cast<size_t>(expected_shape[0]);
  const size_t cols = rows == 0 ? 0 : out.size() / rows;
  if (rows % static_cast<size_t>(heads) != 0 || (rows / heads) % 2 != 0)
    return InvalidArgument("tensor '" + gguf + "' has " + std::to_string(rows) +
                           " rows, which do not split into " + std::to_string(heads) +
                           " heads of an even size");
  const size_t head_dim = rows / heads, half = head_dim / 2;
  std::vector<float> permuted(out.begin(), out.end());
  for (size_t h = 0; h < static_cast<size_t>(heads); ++h) {
    for (size_t j = 0; j < 2; ++j) {
      for (size_t i = 0; i < half; ++i) {
        const float* src = permuted.data() + (h * head_dim + 2 * i + j) * cols;
        std::copy(src, src + cols, out.data() + (h * head_dim + j * half + i) * cols);
      }
    }
  }
  return Status::Ok();
}

}  // namespace tandem
