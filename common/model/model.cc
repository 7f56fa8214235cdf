#include "common/model/model.h"

#include <cstdlib>
#include <span>
#include <vector>

#include "common/model/checkpoint.h"
#include "common/model/safetensors.h"

namespace tandem {
namespace {

constexpr size_t kAlignFloats = 16;  // 64 bytes: every tensor starts on a cache line

size_t RoundUp(size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

}  // namespace

void Model::FreeDeleter::operator()(float* p) const { std::free(p); }

size_t Model::step_weight_bytes() const {
  const ModelConfig& c = config_;
  size_t h = c.hidden_size;
  size_t per_layer = 2 * h + h * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * h +
                     3 * h * c.intermediate_size;
  if (c.qkv_bias) per_layer += c.q_dim() + 2 * c.kv_dim();
  if (c.o_bias) per_layer += h;
  return (per_layer * c.num_layers + h + size_t{static_cast<size_t>(c.vocab_size)} * h) *
         sizeof(float);
}

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir) {
  TANDEM_ASSIGN_OR_RETURN(Checkpoint checkpoint, OpenCheckpoint(dir));
  const ModelConfig& config = checkpoint.config;
  const TensorSource& reader = *checkpoint.tensors;

  const int64_t h = config.hidden_size, q = config.q_dim(), kv = config.kv_dim(),
                inter = config.intermediate_size, vocab = config.vocab_size;
  // Tied models may still ship lm_head.weight (some exports do); untied ones must.
  const bool has_lm_head = reader.Has("lm_head.weight");
  if (!config.tie_word_embeddings && !has_lm_head)
    return NotFound("tensor 'lm_head.weight' (expected shape " +
                    ShapeToString(std::vector<int64_t>{vocab, h}) +
                    ") is missing and tie_word_embeddings is false");
  const bool own_lm_head = !config.tie_word_embeddings;

  // Plan the single allocation.
  struct Slot {
    std::string name;
    std::vector<int64_t> shape;
    size_t offset;  // in floats
    size_t count;
  };
  std::vector<Slot> slots;
  size_t total = 0;
  auto plan = [&](std::string name, std::vector<int64_t> shape) {
    size_t count = 1;
    for (int64_t d : shape) count *= static_cast<size_t>(d);
    slots.push_back(Slot{std::move(name), std::move(shape), total, count});
    total += RoundUp(count);
    return slots.size() - 1;
  };
  // Fused tensors are planned as a region; the parts are read into consecutive sub-ranges.
  struct LayerSlots {
    size_t input_norm, q, k, v, qb = 0, kb = 0, vb = 0, o, ob = 0, post_norm, gate, up, down;
  };
  size_t embed_slot = plan("model.embed_tokens.weight", {vocab, h});
  std::vector<LayerSlots> layer_slots(config.num_layers);
  for (int i = 0; i < config.num_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    LayerSlots& s = layer_slots[i];
    s.input_norm = plan(p + "input_layernorm.weight", {h});
    // q, k, v back to back (no padding between them) so they form one [q+2kv, h] matrix.
    s.q = plan(p + "self_attn.q_proj.weight", {q, h});
    total -= RoundUp(slots.back().count) - slots.back().count;
    s.k = plan(p + "self_attn.k_proj.weight", {kv, h});
    total -= RoundUp(slots.back().count) - slots.back().count;
    s.v = plan(p + "self_attn.v_proj.weight", {kv, h});
    if (config.qkv_bias) {
      s.qb = plan(p + "self_attn.q_proj.bias", {q});
      total -= RoundUp(slots.back().count) - slots.back().count;
      s.kb = plan(p + "self_attn.k_proj.bias", {kv});
      total -= RoundUp(slots.back().count) - slots.back().count;
      s.vb = plan(p + "self_attn.v_proj.bias", {kv});
    }
    s.o = plan(p + "self_attn.o_proj.weight", {h, q});
    if (config.o_bias) s.ob = plan(p + "self_attn.o_proj.bias", {h});
    s.post_norm = plan(p + "post_attention_layernorm.weight", {h});
    s.gate = plan(p + "mlp.gate_proj.weight", {inter, h});
    total -= RoundUp(slots.back().count) - slots.back().count;
    s.up = plan(p + "mlp.up_proj.weight", {inter, h});
    s.down = plan(p + "mlp.down_proj.weight", {h, inter});
  }
  size_t norm_slot = plan("model.norm.weight", {h});
  size_t head_slot = own_lm_head ? plan("lm_head.weight", {vocab, h}) : 0;

  auto model = std::unique_ptr<Model>(new Model());
  model->config_ = config;
  model->num_floats_ = total;
  float* base = static_cast<float*>(std::aligned_alloc(64, RoundUp(total) * sizeof(float)));
  if (base == nullptr)
    return ResourceExhausted("cannot allocate " + std::to_string(total * 4) + " bytes of weights");
  model->storage_.reset(base);

  for (const Slot& slot : slots) {
    Status s = reader.ReadF32(slot.name, slot.shape, std::span<float>(base + slot.offset, slot.count));
    if (!s.ok()) return s.WithContext(dir);
  }

  model->embed_tokens_ = base + slots[embed_slot].offset;
  model->final_norm_ = base + slots[norm_slot].offset;
  model->lm_head_ = own_lm_head ? base + slots[head_slot].offset : model->embed_tokens_;
  model->layers_ = std::make_unique<LayerWeights[]>(config.num_layers);
  for (int i = 0; i < config.num_layers; ++i) {
    const LayerSlots& s = layer_slots[i];
    LayerWeights& w = model->layers_[i];
    w.input_norm = base + slots[s.input_norm].offset;
    w.qkv_proj = base + slots[s.q].offset;
    w.qkv_bias = config.qkv_bias ? base + slots[s.qb].offset : nullptr;
    w.o_proj = base + slots[s.o].offset;
    w.o_bias = config.o_bias ? base + slots[s.ob].offset : nullptr;
    w.post_norm = base + slots[s.post_norm].offset;
    w.gate_up = base + slots[s.gate].offset;
    w.down_proj = base + slots[s.down].offset;
  }
  return model;
}

}  // namespace tandem
