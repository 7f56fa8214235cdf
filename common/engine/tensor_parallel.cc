#include "common/engine/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>

namespace tandem {
namespace {

std::string Str(int v) {
  return std::to_string(v);
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// The tensors of rank `rank`'s shard under their HF names, read as slices of the full model's
// (fused) matrices. Widening a bf16/f16 element to fp32 and rounding it back is exact, so the
// shard's elements are the full model's, bit for bit.
class ShardTensorSource : public TensorSource {
 public:
  ShardTensorSource(const Model& full, const TpPlan& plan, int rank)
      : full_(full), rank_(plan.ranks[rank]), head_dim_(plan.head_dim) {}

  bool Has(const std::string& name) const override {
    Slice unused;
    return Find(name, &unused).ok();
  }

  Status ReadF32(const std::string& name, std::span<const int64_t> expected_shape,
                 std::span<float> out) const override {
    Slice s;
    TANDEM_RETURN_IF_ERROR(Find(name, &s));
    const std::vector<int64_t> shape = s.Shape();
    if (!std::equal(shape.begin(), shape.end(), expected_shape.begin(), expected_shape.end()))
      return InvalidArgument(
          "tensor-parallel shard: tensor '" + name + "' is " + ShapeToString(shape) +
          ", the shard's config expects " +
          ShapeToString(std::vector<int64_t>(expected_shape.begin(), expected_shape.end())));
    Read(s, out.data());
    return Status::Ok();
  }

 private:
  // Rows [r0, r1) and columns [c0, c1) of a matrix, or elements [r0, r1) of a vector.
  struct Slice {
    const WeightMatrix* matrix = nullptr;
    const float* vector = nullptr;
    int r0 = 0, r1 = 0, c0 = 0, c1 = 0;
    std::vector<int64_t> Shape() const {
      if (matrix == nullptr) return {r1 - r0};
      return {r1 - r0, c1 - c0};
    }
  };

  // The slice of the full model that is the shard's tensor `name`.
  Status Find(const std::string& name, Slice* out) const {
    const ModelConfig& c = full_.config();
    const int h = c.hidden_size, d = head_dim_, q_dim = c.q_dim(), kv_dim = c.kv_dim();
    const int q0 = rank_.q_heads.begin * d, q1 = rank_.q_heads.end * d;
    const int k0 = rank_.kv_heads.begin * d, k1 = rank_.kv_heads.end * d;
    const int i0 = rank_.intermediate.begin, i1 = rank_.intermediate.end;
    auto rows = [&](const WeightMatrix& w, int r0, int r1) {
      *out = Slice{&w, nullptr, r0, r1, 0, w.cols};
      return Status::Ok();
    };
    auto cols = [&](const WeightMatrix& w, int c0, int c1) {
      *out = Slice{&w, nullptr, 0, w.rows, c0, c1};
      return Status::Ok();
    };
    auto vec = [&](const float* v, int r0, int r1) {
      *out = Slice{nullptr, v, r0, r1, 0, 0};
      return Status::Ok();
    };
    const Status not_found = NotFound("tensor-parallel shard: no tensor '" + name + "'");
    if (name == "model.embed_tokens.weight") return rows(full_.embed_tokens(), 0, c.vocab_size);
    if (name == "lm_head.weight") return rows(full_.lm_head(), 0, c.vocab_size);
    if (name == "model.norm.weight") return vec(full_.final_norm(), 0, h);
    constexpr std::string_view kLayers = "model.layers.";
    if (!StartsWith(name, kLayers)) return not_found;
    const size_t dot = name.find('.', kLayers.size());
    if (dot == std::string::npos) return not_found;
    const std::string index = name.substr(kLayers.size(), dot - kLayers.size());
    if (index.empty() || index.size() > 6 ||
        !std::all_of(index.begin(), index.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      return not_found;
    const int layer = std::stoi(index);
    if (layer >= c.num_layers) return not_found;
    const LayerWeights& w = full_.layer(layer);
    const std::string_view part = std::string_view(name).substr(dot + 1);
    // qkv_proj = [q; k; v] and gate_up = [gate; up]: each part's rows at its offset.
    if (part == "input_layernorm.weight") return vec(w.input_norm, 0, h);
    if (part == "post_attention_layernorm.weight") return vec(w.post_norm, 0, h);
    if (part == "self_attn.q_proj.weight") return rows(w.qkv_proj, q0, q1);
    if (part == "self_attn.k_proj.weight") return rows(w.qkv_proj, q_dim + k0, q_dim + k1);
    if (part == "self_attn.v_proj.weight")
      return rows(w.qkv_proj, q_dim + kv_dim + k0, q_dim + kv_dim + k1);
    if (part == "self_attn.o_proj.weight") return cols(w.o_proj, q0, q1);
    if (part == "mlp.gate_proj.weight") return rows(w.gate_up, i0, i1);
    if (part == "mlp.up_proj.weight")
      return rows(w.gate_up, c.intermediate_size + i0, c.intermediate_size + i1);
    if (part == "mlp.down_proj.weight") return cols(w.down_proj, i0, i1);
    if (w.qkv_bias != nullptr) {
      if (part == "self_attn.q_proj.bias") return vec(w.qkv_bias, q0, q1);
      if (part == "self_attn.k_proj.bias") return vec(w.qkv_bias, q_dim + k0, q_dim + k1);
      if (part == "self_attn.v_proj.bias")
        return vec(w.qkv_bias, q_dim + kv_dim + k0, q_dim + kv_dim + k1);
    }
    // Row-parallel: the bias is added once, after the all-reduce, so every rank keeps it whole.
    if (w.o_bias != nullptr && part == "self_attn.o_proj.bias") return vec(w.o_bias, 0, h);
    return not_found;
  }

  void Read(const Slice& s, float* out) const {
    if (s.matrix == nullptr) {
      std::memcpy(out, s.vector + s.r0, sizeof(float) * (s.r1 - s.r0));
    } else if (s.c0 == 0 && s.c1 == s.matrix->cols) {
      WeightRowsToF32(*s.matrix, s.r0, s.r1, out);
    } else {
      // A column slice of a row-major matrix is strided: widen each row, keep its columns.
      std::vector<float> row(s.matrix->cols);
      for (int r = s.r0; r < s.r1; ++r) {
        WeightRowsToF32(*s.matrix, r, r + 1, row.data());
        std::memcpy(out, row.data() + s.c0, sizeof(float) * (s.c1 - s.c0));
        out += s.c1 - s.c0;
      }
    }
  }

  const Model& full_;
  TpRank rank_;
  int head_dim_;
};

}  // namespace

IndexRange TpKvHeads(int num_kv_heads, int degree, int rank) {
  TANDEM_CHECK(num_kv_heads > 0 && degree > 0 && rank >= 0 && rank < degree);
  if (degree <= num_kv_heads) {
    TANDEM_CHECK(num_kv_heads % degree == 0, Str(num_kv_heads) + " kv heads over " + Str(degree));
    const int per_rank = num_kv_heads / degree;
    return IndexRange{rank * per_rank, (rank + 1) * per_rank};
  }
  TANDEM_CHECK(degree % num_kv_heads == 0, Str(num_kv_heads) + " kv heads over " + Str(degree));
  const int head = rank / (degree / num_kv_heads);
  return IndexRange{head, head + 1};
}

IndexRange TpRanksHoldingKvHead(int num_kv_heads, int degree, int head) {
  TANDEM_CHECK(head >= 0 && head < num_kv_heads);
  if (degree <= num_kv_heads) {
    TANDEM_CHECK(num_kv_heads % degree == 0, Str(num_kv_heads) + " kv heads over " + Str(degree));
    const int rank = head / (num_kv_heads / degree);
    return IndexRange{rank, rank + 1};
  }
  TANDEM_CHECK(degree % num_kv_heads == 0, Str(num_kv_heads) + " kv heads over " + Str(degree));
  const int replicas = degree / num_kv_heads;
  return IndexRange{head * replicas, (head + 1) * replicas};
}

StatusOr<TpPlan> MakeTpPlan(const ModelConfig& config, int degree) {
  const int h = config.num_heads, k = config.num_kv_heads, inter = config.intermediate_size;
  if (degree < 1) return InvalidArgument("tensor_parallel must be at least 1, not " + Str(degree));
  if (h <= 0 || k <= 0 || inter <= 0 || h % k != 0)
    return InvalidArgument("tensor_parallel: the model's shape is not a valid decoder (" + Str(h) +
                           " attention heads, " + Str(k) +
                           " key-value heads, "
                           "intermediate_size " +
                           Str(inter) + ")");
  const std::string t = "tensor_parallel " + Str(degree);
  if (h % degree != 0) return InvalidArgument(t + " does not divide num_attention_heads " + Str(h));
  if (inter % degree != 0)
    return InvalidArgument(t + " does not divide intermediate_size " + Str(inter));
  if (degree <= k && k % degree != 0)
    return InvalidArgument(t + " does not divide num_key_value_heads " + Str(k));
  if (degree > k && degree % k != 0)
    return InvalidArgument(t + " exceeds num_key_value_heads " + Str(k) +
                           " and is not a multiple of it (KV heads are replicated only whole)");
  TpPlan plan;
  plan.degree = degree;
  plan.num_heads = h;
  plan.num_kv_heads = k;
  plan.head_dim = config.head_dim;
  plan.intermediate_size = inter;
  plan.kv_replicated = degree > k;
  const int heads = h / degree, rows = inter / degree;
  for (int r = 0; r < degree; ++r) {
    plan.ranks.push_back(TpRank{IndexRange{r * heads, (r + 1) * heads}, TpKvHeads(k, degree, r),
                                IndexRange{r * rows, (r + 1) * rows}});
  }
  return plan;
}

ModelConfig ShardConfig(const ModelConfig& full, const TpPlan& plan) {
  ModelConfig c = full;
  c.num_heads = plan.num_heads / plan.degree;
  c.num_kv_heads = plan.ranks.empty() ? 0 : plan.ranks[0].kv_heads.size();
  c.intermediate_size = plan.intermediate_size / plan.degree;
  return c;
}

StatusOr<std::unique_ptr<Model>> ShardModel(const Model& full, const TpPlan& plan, int rank) {
  const ModelConfig& c = full.config();
  if (plan.num_heads != c.num_heads || plan.num_kv_heads != c.num_kv_heads ||
      plan.head_dim != c.head_dim || plan.intermediate_size != c.intermediate_size ||
      static_cast<int>(plan.ranks.size()) != plan.degree)
    return InvalidArgument("tensor_parallel: the plan was made for another model shape");
  if (rank < 0 || rank >= plan.degree)
    return InvalidArgument("tensor_parallel: rank " + Str(rank) + " outside [0, " +
                           Str(plan.degree) + ")");
  ShardTensorSource source(full, plan, rank);
  return Model::FromTensors(ShardConfig(c, plan), source, full.dtype(),
                            "tensor-parallel shard " + Str(rank) + " of " + Str(plan.degree));
}

size_t TpRankWeightBytes(const Model& full, int degree) {
  TANDEM_CHECK(degree >= 1, "TpRankWeightBytes: degree must be at least 1");
  const ModelConfig& c = full.config();
  const size_t e = WeightDTypeSize(full.dtype()), f = sizeof(float);
  const size_t h = c.hidden_size, d = c.head_dim;
  const size_t q = d * (c.num_heads / degree);
  const size_t kv = d * TpKvHeads(c.num_kv_heads, degree, 0).size();  // replicated when t > K
  const size_t inter = c.intermediate_size / degree;
  size_t layer = ((q + 2 * kv) * h + h * q + 3 * inter * h) * e + 2 * h * f;  // + the norms
  if (c.qkv_bias) layer += (q + 2 * kv) * f;
  if (c.o_bias) layer += h * f;
  const bool tied = full.lm_head().data == full.embed_tokens().data;
  const size_t replicated = full.embed_tokens().bytes() + (tied ? 0 : full.lm_head().bytes());
  return replicated + layer * c.num_layers + h * f;  // + the final norm
}

}  // namespace tandem
