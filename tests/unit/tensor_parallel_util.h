// Helpers of the tensor-parallel tests (tensor_parallel_test.cc, tp_forward_test.cc): model
// shapes with random weights, a two-sequence script of prefill and decode steps, and runs of it
// unsharded and sharded.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/engine/forward.h"
#include "common/engine/kv_reshard.h"
#include "common/engine/tensor_parallel.h"
#include "common/engine/tp_forward.h"
#include "common/model/make_model.h"
#include "common/model/tensor_source.h"
#include "tests/unit/test_util.h"

namespace tandem::tp_test {

using std::chrono::milliseconds;

constexpr milliseconds kCollectiveTimeout{10000};
// KV of a sharded pass against the unsharded one, relative to the head's largest value. Layer 0
// may differ by a rounding (its K/V rows are computed in other GEMM shapes), later layers by the
// residual's partial sums added in another order: at most 7e-7 seen with every kernel path.
constexpr float kKvTolerance = 2e-6f;

// Seeded random weights for any shape, by HF name: a model of a shape no preset has, built in
// memory through Model::FromTensors.
class RandomTensorSource : public TensorSource {
 public:
  explicit RandomTensorSource(uint64_t seed) : seed_(seed) {}
  bool Has(const std::string&) const override { return true; }
  Status ReadF32(const std::string& name, std::span<const int64_t> shape,
                 std::span<float> out) const override {
    std::mt19937_64 rng(seed_ ^ std::hash<std::string>()(name));
    const bool norm = name.find("norm") != std::string::npos;
    const bool bias = name.ends_with(".bias");
    const float stddev = norm ? 0.05f : bias ? 0.1f : 1.0f / std::sqrt(float(shape.back()));
    std::normal_distribution<float> dist(norm ? 1.0f : 0.0f, stddev);
    for (float& v : out) v = dist(rng);
    return Status::Ok();
  }

 private:
  uint64_t seed_;
};

inline ModelConfig Shape(int heads, int kv_heads, int head_dim, int intermediate) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 128;
  c.intermediate_size = intermediate;
  c.num_layers = 2;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.vocab_size = 512;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5;
  return c;
}

inline std::unique_ptr<Model> RandomModel(const ModelConfig& config,
                                          WeightDType dtype = WeightDType::kF32) {
  auto model = Model::FromTensors(config, RandomTensorSource(5), dtype, "random model");
  REQUIRE(model.ok());
  return std::move(*model);
}

// The make-model tiny preset (4 heads, 2 KV heads, intermediate 384), no tokenizer.
inline std::unique_ptr<Model> TinyModel(const test::TempDir& dir, ModelFamily family,
                                        WeightDType dtype = WeightDType::kF32) {
  MakeModelOptions options;
  options.family = family;
  options.seed = 11;
  options.with_tokenizer = false;
  const std::string path = (dir.path() / ModelFamilyName(family)).string();
  if (!std::filesystem::exists(path + "/config.json")) REQUIRE(MakeModel(options, path).ok());
  auto model = Model::Load(path, ModelLoadOptions{dtype});
  REQUIRE(model.ok());
  return std::move(*model);
}

inline float RelErr(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  float diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

inline int32_t Argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Two sequences: A's 70-token prompt (over 64 rows: the sgemm path) and B's 9, prefilled in one
// batch, then `steps` greedy decode steps of both. Block tables: A blocks 0..5, B 6..7.
struct Script {
  // The blocks the script writes: A's then B's.
  std::vector<int32_t> Blocks() const {
    std::vector<int32_t> out = table_a;
    out.insert(out.end(), table_b.begin(), table_b.end());
    return out;
  }
  std::vector<int32_t> prompt_a, prompt_b;
  std::vector<int32_t> table_a{0, 1, 2, 3, 4, 5}, table_b{6, 7};
  int steps = 4;
  static constexpr int kPoolBlocks = 8;
  Script(int vocab) {
    for (int i = 0; i < 70; ++i) prompt_a.push_back((7919 + i * 104729) % vocab);
    for (int i = 0; i < 9; ++i) prompt_b.push_back((15838 + i * 7) % vocab);
  }
};

// The logits of every call ([2, vocab] each) of a script run through `forward`, which runs one
// batch. Decode feeds each sequence its greedy token.
using BatchFn = std::function<std::span<const float>(std::span<const SequenceInput>)>;
inline std::vector<std::vector<float>> RunScript(const Script& s, int vocab, const BatchFn& forward,
                                                 int first_step = 0, int32_t next_a = 0,
                                                 int32_t next_b = 0) {
  std::vector<std::vector<float>> out;
  int32_t tokens[2] = {next_a, next_b};
  for (int step = first_step; step <= s.steps; ++step) {
    std::vector<SequenceInput> batch;
    if (step == 0) {
      batch = {{s.prompt_a, 0, s.table_a}, {s.prompt_b, 0, s.table_b}};
    } else {
      batch = {{{&tokens[0], 1}, static_cast<int32_t>(s.prompt_a.size()) + step - 1, s.table_a},
               {{&tokens[1], 1}, static_cast<int32_t>(s.prompt_b.size()) + step - 1, s.table_b}};
    }
    std::span<const float> logits = forward(batch);
    out.emplace_back(logits.begin(), logits.end());
    tokens[0] = Argmax(logits.subspan(0, vocab));
    tokens[1] = Argmax(logits.subspan(vocab, vocab));
  }
  return out;
}

struct FullRun {
  std::vector<std::vector<float>> logits;
  std::unique_ptr<KvCache> cache;
};

inline FullRun RunUnsharded(const Model& model, const Script& s) {
  auto engine = CpuForward::Create(model, ForwardOptions{});
  REQUIRE(engine.ok());
  auto cache = KvCache::Create((*engine)->MakeKvLayout(), Script::kPoolBlocks);
  REQUIRE(cache.ok());
  FullRun run;
  run.logits = RunScript(s, model.config().vocab_size, [&](std::span<const SequenceInput> b) {
    auto out = (*engine)->Forward(b, **cache);
    REQUIRE(out.ok());
    return *out;
  });
  run.cache = std::move(*cache);
  return run;
}

struct TpRun {
  std::unique_ptr<TpForward> tp;
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<KvCache*> pools;
  std::vector<std::vector<float>> logits;

  TpRun(const Model& model, int degree, int pool_blocks = Script::kPoolBlocks, int threads = 1) {
    ForwardOptions options;
    options.num_threads = threads;
    auto made = CreateTpCpuForward(model, degree, options, kCollectiveTimeout);
    REQUIRE(made.ok());
    tp = std::move(*made);
    for (int r = 0; r < degree; ++r) {
      auto cache = KvCache::Create(tp->MakeKvLayout(), pool_blocks);
      REQUIRE(cache.ok());
      pools.push_back(cache->get());
      caches.push_back(std::move(*cache));
    }
  }
  BatchFn Fn() {
    return [this](std::span<const SequenceInput> b) {
      auto out = tp->ForwardRanks(b, pools);
      REQUIRE(out.ok());
      return *out;
    };
  }
};

// The largest difference between head `head_a` of pool `a` in blocks `blocks_a` and head
// `head_b` of pool `b` in blocks `blocks_b` (the same tokens), relative to a's largest value.
inline float HeadErr(const KvCache& a, int head_a, std::span<const int32_t> blocks_a,
                     const KvCache& b, int head_b, std::span<const int32_t> blocks_b) {
  REQUIRE(blocks_a.size() == blocks_b.size());
  const size_t n = static_cast<size_t>(a.layout().block_size) * a.layout().head_dim;
  float diff = 0, scale = 0;
  for (int layer = 0; layer < a.layout().num_layers; ++layer)
    for (size_t i = 0; i < blocks_a.size(); ++i)
      for (int kv = 0; kv < 2; ++kv) {
        const float* x = a.HeadData(layer, blocks_a[i], kv, head_a);
        const float* y = b.HeadData(layer, blocks_b[i], kv, head_b);
        for (size_t j = 0; j < n; ++j) {
          diff = std::max(diff, std::abs(x[j] - y[j]));
          scale = std::max(scale, std::abs(x[j]));
        }
      }
  return diff / scale;
}

// Rank pools at `degree` (the script's tokens in `blocks`) against the unsharded pool (in
// `full_blocks`): each rank's heads are the full pool's.
inline void CheckPoolsMatch(const KvCache& full, std::span<const int32_t> full_blocks,
                            std::span<KvCache* const> pools, std::span<const int32_t> blocks,
                            int degree, float tolerance) {
  for (int r = 0; r < degree; ++r) {
    const IndexRange heads = TpKvHeads(full.layout().num_kv_heads, degree, r);
    for (int j = 0; j < heads.size(); ++j) {
      INFO("rank " << r << " of " << degree << ", head " << heads.begin + j);
      CHECK(HeadErr(full, heads.begin + j, full_blocks, *pools[r], j, blocks) <= tolerance);
    }
  }
}

// `threads`: each rank's pool (ranks run at once, each splitting its GEMMs and attention).
inline void CheckTpMatchesUnsharded(const Model& model, int degree, int threads = 1) {
  INFO("tensor_parallel " << degree << ", " << threads << " threads per rank");
  const int vocab = model.config().vocab_size;
  Script script(vocab);
  FullRun full = RunUnsharded(model, script);
  TpRun tp(model, degree, Script::kPoolBlocks, threads);
  tp.logits = RunScript(script, vocab, tp.Fn());
  REQUIRE(tp.logits.size() == full.logits.size());
  for (size_t i = 0; i < full.logits.size(); ++i) {
    INFO("call " << i);
    CHECK(RelErr(tp.logits[i], full.logits[i]) < 1e-5f);
    for (int s = 0; s < 2; ++s)
      CHECK(Argmax(std::span<const float>(tp.logits[i]).subspan(s * vocab, vocab)) ==
            Argmax(std::span<const float>(full.logits[i]).subspan(s * vocab, vocab)));
  }
  CheckPoolsMatch(*full.cache, script.Blocks(), tp.pools, script.Blocks(), degree, kKvTolerance);
}

}  // namespace tandem::tp_test
