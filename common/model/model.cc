#include "common/model/model.h"

#include <cmath>
#include <cstdlib>
#include <span>
#include <vector>

#include "common/model/checkpoint.h"
#include "common/model/safetensors.h"

namespace tandem {
namespace {

constexpr size_t kAlignBytes = 64;  // every tensor starts on a cache line

size_t RoundUp(size_t n) { return (n + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }

// float16's largest finite value: a weight beyond it would become inf.
constexpr float kF16Max = 65504.0f;

// One tensor's place in the allocation.
struct Slot {
  std::string name;
  std::vector<int64_t> shape;
  WeightDType dtype;
  size_t offset;  // in bytes
  size_t count;   // elements
  size_t bytes() const { return count * WeightDTypeSize(dtype); }
};

// Reads one tensor into base + slot.offset at the slot's dtype. A tensor stored as bf16/f16 is
// read as fp32 into `scratch` (one tensor at a time, so loading needs the storage plus the
// largest tensor in fp32) and rounded into place.
Status ReadSlot(const TensorSource& reader, const Slot& slot, char* base,
                std::vector<float>& scratch, const std::string& dir) {
  if (slot.dtype == WeightDType::kF32) {
    Status s = reader.ReadF32(slot.name, slot.shape,
                              std::span<float>(reinterpret_cast<float*>(base + slot.offset), slot.count));
    return s.ok() ? s : s.WithContext(dir);
  }
  scratch.resize(slot.count);
  Status s = reader.ReadF32(slot.name, slot.shape, std::span<float>(scratch.data(), slot.count));
  if (!s.ok()) return s.WithContext(dir);
  if (slot.dtype == WeightDType::kF16) {
    for (float v : scratch) {
      if (std::isfinite(v) && std::fabs(v) > kF16Max)
        return InvalidArgument(dir + ": tensor '" + slot.name + "' holds " + std::to_string(v) +
                               ", outside float16's range: set model.dtype to bfloat16 or float32");
    }
  }
  ConvertFromF32(scratch.data(), slot.count, slot.dtype, base + slot.offset);
  return Status::Ok();
}

}  // namespace

WeightDType ResolveWeightDType(std::optional<WeightDType> requested,
                               std::string_view checkpoint_dtype) {
  if (requested) return *requested;
  return ParseWeightDType(checkpoint_dtype).value_or(WeightDType::kF32);
}

void Model::FreeDeleter::operator()(char* p) const { std::free(p); }

size_t Model::step_weight_bytes() const {
  const ModelConfig& c = config_;
  const size_t h = c.hidden_size;
  const size_t matrix = h * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * h + 3 * h * c.intermediate_size;
  size_t vectors = 2 * h;
  if (c.qkv_bias) vectors += c.q_dim() + 2 * c.kv_dim();
  if (c.o_bias) vectors += h;
  const size_t head = static_cast<size_t>(c.vocab_size) * h;
  return (matrix * c.num_layers + head) * WeightDTypeSize(dtype_) +
         (vectors * c.num_layers + h) * sizeof(float);
}

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                             const ModelLoadOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(Checkpoint checkpoint, OpenCheckpoint(dir));
  // auto: the checkpoint's torch_dtype; a GGUF file has none, so its dequantized weights stay
  // float32 unless model.dtype asks for bfloat16/float16.
  const WeightDType dtype = ResolveWeightDType(options.dtype, checkpoint.config.torch_dtype);
  return FromTensors(checkpoint.config, *checkpoint.tensors, dtype, dir);
}

StatusOr<std::unique_ptr<Model>> Model::FromTensors(const ModelConfig& config,
                                                    const TensorSource& reader, WeightDType dtype,
                                                    const std::string& dir) {
  const int64_t h = config.hidden_size, q = config.q_dim(), kv = config.kv_dim(),
                inter = config.intermediate_size, vocab = config.vocab_size;
  // Tied models may still ship lm_head.weight (some exports do); untied ones must.
  const bool has_lm_head = reader.Has("lm_head.weight");
  if (!config.tie_word_embeddings && !has_lm_head)
    return NotFound("tensor 'lm_head.weight' (expected shape " +
                    ShapeToString(std::vector<int64_t>{vocab, h}) +
                    ") is missing and tie_word_embeddings is false");
  const bool own_lm_head = !config.tie_word_embeddings;

  // Plan the single allocation: matrices at the storage dtype, norms and biases in fp32.
  std::vector<Slot> slots;
  size_t total = 0;
  auto plan_as = [&](std::string name, std::vector<int64_t> shape, WeightDType slot_dtype) {
    size_t count = 1;
    for (int64_t d : shape) count *= static_cast<size_t>(d);
    slots.push_back(Slot{std::move(name), std::move(shape), slot_dtype, total, count});
    total += RoundUp(slots.back().bytes());
    return slots.size() - 1;
  };
  auto plan = [&](std::string name, std::vector<int64_t> shape) {  // a norm or a bias
    return plan_as(std::move(name), std::move(shape), WeightDType::kF32);
  };
  auto plan_matrix = [&](std::string name, std::vector<int64_t> shape) {
    return plan_as(std::move(name), std::move(shape), dtype);
  };
  // Parts of a fused matrix follow each other with no padding.
  auto unpad = [&] { total -= RoundUp(slots.back().bytes()) - slots.back().bytes(); };
  // Fused tensors are planned as a region; the parts are read into consecutive sub-ranges.
  struct LayerSlots {
    size_t input_norm, q, k, v, qb = 0, kb = 0, vb = 0, o, ob = 0, post_norm, gate, up, down;
  };
  size_t embed_slot = plan_matrix("model.embed_tokens.weight", {vocab, h});
  std::vector<LayerSlots> layer_slots(config.num_layers);
  for (int i = 0; i < config.num_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    LayerSlots& s = layer_slots[i];
    s.input_norm = plan(p + "input_layernorm.weight", {h});
    // q, k, v back to back (no padding between them) so they form one [q+2kv, h] matrix.
    s.q = plan_matrix(p + "self_attn.q_proj.weight", {q, h});
    unpad();
    s.k = plan_matrix(p + "self_attn.k_proj.weight", {kv, h});
    unpad();
    s.v = plan_matrix(p + "self_attn.v_proj.weight", {kv, h});
    if (config.qkv_bias) {
      s.qb = plan(p + "self_attn.q_proj.bias", {q});
      unpad();
      s.kb = plan(p + "self_attn.k_proj.bias", {kv});
      unpad();
      s.vb = plan(p + "self_attn.v_proj.bias", {kv});
    }
    s.o = plan_matrix(p + "self_attn.o_proj.weight", {h, q});
    if (config.o_bias) s.ob = plan(p + "self_attn.o_proj.bias", {h});
    s.post_norm = plan(p + "post_attention_layernorm.weight", {h});
    s.gate = plan_matrix(p + "mlp.gate_proj.weight", {inter, h});
    unpad();
    s.up = plan_matrix(p + "mlp.up_proj.weight", {inter, h});
    s.down = plan_matrix(p + "mlp.down_proj.weight", {h, inter});
  }
  size_t norm_slot = plan("model.norm.weight", {h});
  size_t head_slot = own_lm_head ? plan_matrix("lm_head.weight", {vocab, h}) : 0;

  auto model = std::unique_ptr<Model>(new Model());
  model->config_ = config;
  model->dtype_ = dtype;
  model->num_bytes_ = total;
  char* base = static_cast<char*>(std::aligned_alloc(kAlignBytes, RoundUp(total)));
  if (base == nullptr)
    return ResourceExhausted("cannot allocate " + std::to_string(total) + " bytes of weights");
  model->storage_.reset(base);

  std::vector<float> scratch;
  for (const Slot& slot : slots) TANDEM_RETURN_IF_ERROR(ReadSlot(reader, slot, base, scratch, dir));

  auto f32 = [&](size_t slot) { return reinterpret_cast<const float*>(base + slots[slot].offset); };
  auto matrix = [&](size_t slot, int64_t rows, int64_t cols) {
    return WeightMatrix{dtype, base + slots[slot].offset, static_cast<int>(rows),
                        static_cast<int>(cols)};
  };
  model->embed_tokens_ = matrix(embed_slot, vocab, h);
  model->final_norm_ = f32(norm_slot);
  model->lm_head_ = own_lm_head ? matrix(head_slot, vocab, h) : model->embed_tokens_;
  model->layers_ = std::make_unique<LayerWeights[]>(config.num_layers);
  for (int i = 0; i < config.num_layers; ++i) {
    const LayerSlots& s = layer_slots[i];
    LayerWeights& w = model->layers_[i];
    w.input_norm = f32(s.input_norm);
    w.qkv_proj = matrix(s.q, q + 2 * kv, h);
    w.qkv_bias = config.qkv_bias ? f32(s.qb) : nullptr;
    w.o_proj = matrix(s.o, h, q);
    w.o_bias = config.o_bias ? f32(s.ob) : nullptr;
    w.post_norm = f32(s.post_norm);
    w.gate_up = matrix(s.gate, 2 * inter, h);
    w.down_proj = matrix(s.down, h, inter);
  }
  return model;
}

}  // namespace tandem
