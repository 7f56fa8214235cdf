// Tensor parallelism on the CPU: plans, shards, the in-process all-reduce, a sharded forward
// pass against the unsharded one, and KV re-sharding between degrees against the pools that
// forward passes at those degrees fill.
#include "common/engine/tensor_parallel.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/engine/cpu_all_reduce.h"
#include "common/engine/forward.h"
#include "common/engine/kv_reshard.h"
#include "common/engine/tp_forward.h"
#include "common/model/make_model.h"
#include "kvtransfer/sharded_copies.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

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

ModelConfig Shape(int heads, int kv_heads, int head_dim, int intermediate) {
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

std::unique_ptr<Model> RandomModel(const ModelConfig& config,
                                   WeightDType dtype = WeightDType::kF32) {
  auto model = Model::FromTensors(config, RandomTensorSource(5), dtype, "random model");
  REQUIRE(model.ok());
  return std::move(*model);
}

// The make-model tiny preset (4 heads, 2 KV heads, intermediate 384), no tokenizer.
std::unique_ptr<Model> TinyModel(const test::TempDir& dir, ModelFamily family,
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

float RelErr(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  float diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

int32_t Argmax(std::span<const float> v) {
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
std::vector<std::vector<float>> RunScript(const Script& s, int vocab, const BatchFn& forward,
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

FullRun RunUnsharded(const Model& model, const Script& s) {
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
float HeadErr(const KvCache& a, int head_a, std::span<const int32_t> blocks_a, const KvCache& b,
              int head_b, std::span<const int32_t> blocks_b) {
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
void CheckPoolsMatch(const KvCache& full, std::span<const int32_t> full_blocks,
                     std::span<KvCache* const> pools, std::span<const int32_t> blocks, int degree,
                     float tolerance) {
  for (int r = 0; r < degree; ++r) {
    const IndexRange heads = TpKvHeads(full.layout().num_kv_heads, degree, r);
    for (int j = 0; j < heads.size(); ++j) {
      INFO("rank " << r << " of " << degree << ", head " << heads.begin + j);
      CHECK(HeadErr(full, heads.begin + j, full_blocks, *pools[r], j, blocks) <= tolerance);
    }
  }
}

// `threads`: each rank's pool (ranks run at once, each splitting its GEMMs and attention).
void CheckTpMatchesUnsharded(const Model& model, int degree, int threads = 1) {
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

}  // namespace

TEST_CASE("MakeTpPlan gives each rank contiguous heads and rows", "[tensor_parallel]") {
  const ModelConfig tiny = Shape(4, 2, 32, 384);
  auto one = MakeTpPlan(tiny, 1);
  REQUIRE(one.ok());
  REQUIRE(one->ranks.size() == 1);
  CHECK(one->ranks[0].q_heads == IndexRange{0, 4});
  CHECK(one->ranks[0].kv_heads == IndexRange{0, 2});
  CHECK(one->ranks[0].intermediate == IndexRange{0, 384});

  auto two = MakeTpPlan(tiny, 2);
  REQUIRE(two.ok());
  CHECK_FALSE(two->kv_replicated);
  CHECK(two->ranks[1].q_heads == IndexRange{2, 4});
  CHECK(two->ranks[1].kv_heads == IndexRange{1, 2});
  CHECK(two->ranks[1].intermediate == IndexRange{192, 384});
  const ModelConfig shard = ShardConfig(tiny, *two);
  CHECK(shard.num_heads == 2);
  CHECK(shard.num_kv_heads == 1);
  CHECK(shard.intermediate_size == 192);
  CHECK(shard.head_dim == 32);
  CHECK(shard.hidden_size == 128);

  // 4 ranks over 2 KV heads: each KV head replicated on two neighbouring ranks, whose query
  // heads are exactly that KV head's group.
  auto four = MakeTpPlan(tiny, 4);
  REQUIRE(four.ok());
  CHECK(four->kv_replicated);
  for (int r = 0; r < 4; ++r) {
    CHECK(four->ranks[r].q_heads == IndexRange{r, r + 1});
    CHECK(four->ranks[r].kv_heads == IndexRange{r / 2, r / 2 + 1});
  }
  CHECK(TpRanksHoldingKvHead(2, 4, 1) == IndexRange{2, 4});
  CHECK(TpRanksHoldingKvHead(2, 2, 1) == IndexRange{1, 2});
  CHECK(TpRanksHoldingKvHead(4, 2, 1) == IndexRange{0, 1});

  // SmolLM2-135M's shape (9 heads, 3 KV heads, intermediate 1536) splits 3 ways only.
  auto smollm2 = PresetConfig("smollm2", ModelFamily::kLlama);
  REQUIRE(smollm2.ok());
  auto three = MakeTpPlan(*smollm2, 3);
  REQUIRE(three.ok());
  CHECK(three->ranks[2].kv_heads == IndexRange{2, 3});
  CHECK(three->ranks[2].intermediate == IndexRange{1024, 1536});
  CHECK(MakeTpPlan(*smollm2, 2).status().message() ==
        "tensor_parallel 2 does not divide num_attention_heads 9");
  CHECK(MakeTpPlan(*smollm2, 9).status().message() ==
        "tensor_parallel 9 does not divide intermediate_size 1536");

  auto message = [](const ModelConfig& c, int t) {
    StatusOr<TpPlan> plan = MakeTpPlan(c, t);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == StatusCode::kInvalidArgument);
    return plan.status().message();
  };
  CHECK(message(tiny, 0) == "tensor_parallel must be at least 1, not 0");
  CHECK(message(tiny, 3) == "tensor_parallel 3 does not divide num_attention_heads 4");
  CHECK(message(Shape(4, 2, 32, 382), 4) ==
        "tensor_parallel 4 does not divide intermediate_size 382");
  CHECK(message(Shape(6, 3, 32, 384), 2) ==
        "tensor_parallel 2 does not divide num_key_value_heads 3");
  CHECK(message(Shape(12, 4, 32, 384), 6) ==
        "tensor_parallel 6 exceeds num_key_value_heads 4 and is not a multiple of it (KV "
        "heads are replicated only whole)");
}

TEST_CASE("ShardModel copies each rank's slices bit for bit", "[tensor_parallel]") {
  ModelConfig config = Shape(4, 2, 32, 384);
  config.qkv_bias = true;
  config.o_bias = true;
  for (WeightDType dtype : {WeightDType::kF32, WeightDType::kBF16, WeightDType::kF16}) {
    INFO(WeightDTypeName(dtype));
    auto full = RandomModel(config, dtype);
    auto plan = MakeTpPlan(config, 2);
    REQUIRE(plan.ok());
    auto shard = ShardModel(*full, *plan, 1);
    REQUIRE(shard.ok());
    const Model& s = **shard;
    CHECK(s.dtype() == dtype);
    CHECK(s.config().num_heads == 2);
    CHECK(s.config().num_kv_heads == 1);
    const size_t e = WeightDTypeSize(dtype);
    const int d = 32, q = 128, kv = 64, inter = 384;
    for (int layer = 0; layer < 2; ++layer) {
      const LayerWeights& fw = full->layer(layer);
      const LayerWeights& sw = s.layer(layer);
      auto same_rows = [&](const WeightMatrix& a, int a_row, const WeightMatrix& b, int b_row,
                           int rows) {
        return std::memcmp(a.row(a_row), b.row(b_row), rows * a.cols * e) == 0;
      };
      // Rank 1: q heads 2..3, kv head 1, intermediate rows 192..383.
      CHECK(sw.qkv_proj.rows == 2 * d + 2 * d);
      CHECK(same_rows(sw.qkv_proj, 0, fw.qkv_proj, 2 * d, 2 * d));       // q
      CHECK(same_rows(sw.qkv_proj, 2 * d, fw.qkv_proj, q + d, d));       // k
      CHECK(same_rows(sw.qkv_proj, 3 * d, fw.qkv_proj, q + kv + d, d));  // v
      CHECK(std::memcmp(sw.qkv_bias, fw.qkv_bias + 2 * d, 2 * d * 4) == 0);
      CHECK(std::memcmp(sw.qkv_bias + 2 * d, fw.qkv_bias + q + d, d * 4) == 0);
      CHECK(std::memcmp(sw.qkv_bias + 3 * d, fw.qkv_bias + q + kv + d, d * 4) == 0);
      CHECK(same_rows(sw.gate_up, 0, fw.gate_up, 192, 192));
      CHECK(same_rows(sw.gate_up, 192, fw.gate_up, inter + 192, 192));
      REQUIRE(sw.o_proj.cols == 2 * d);
      REQUIRE(sw.down_proj.cols == 192);
      for (int r = 0; r < 128; ++r) {
        CHECK(std::memcmp(sw.o_proj.row(r), static_cast<const char*>(fw.o_proj.row(r)) + 2 * d * e,
                          2 * d * e) == 0);
        CHECK(std::memcmp(sw.down_proj.row(r),
                          static_cast<const char*>(fw.down_proj.row(r)) + 192 * e, 192 * e) == 0);
      }
      CHECK(std::memcmp(sw.o_bias, fw.o_bias, 128 * 4) == 0);
      CHECK(std::memcmp(sw.input_norm, fw.input_norm, 128 * 4) == 0);
      CHECK(std::memcmp(sw.post_norm, fw.post_norm, 128 * 4) == 0);
    }
    CHECK(std::memcmp(s.embed_tokens().data, full->embed_tokens().data,
                      full->embed_tokens().bytes()) == 0);
    CHECK(std::memcmp(s.lm_head().data, full->lm_head().data, full->lm_head().bytes()) == 0);
    CHECK(std::memcmp(s.final_norm(), full->final_norm(), 128 * 4) == 0);
  }
  auto plan = MakeTpPlan(config, 2);
  auto full = RandomModel(config);
  CHECK(ShardModel(*full, *plan, 2).status().message() == "tensor_parallel: rank 2 outside [0, 2)");
  auto other = MakeTpPlan(Shape(8, 2, 16, 384), 2);
  CHECK(ShardModel(*full, *other, 0).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("CpuAllReduce gives every rank the rank-order sum", "[tensor_parallel]") {
  for (int t : {1, 2, 3, 4}) {
    INFO(t << " ranks");
    CpuAllReduce reduce(t, kCollectiveTimeout);
    const size_t count = 1001;  // not a multiple of the ranks: uneven slices
    std::vector<std::vector<float>> data(t, std::vector<float>(count));
    std::mt19937 rng(t);
    std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
    for (auto& d : data)
      for (float& v : d) v = dist(rng);
    std::vector<float> expected(count);
    for (size_t i = 0; i < count; ++i) {
      float sum = data[0][i];
      for (int r = 1; r < t; ++r) sum += data[r][i];
      expected[i] = sum;
    }
    for (int round = 0; round < 3; ++round) {  // the buffers are reused, as in a forward
      std::vector<std::vector<float>> work = data;
      std::vector<Status> status(t);
      std::vector<std::thread> threads;
      for (int r = 0; r < t; ++r)
        threads.emplace_back([&, r] { status[r] = reduce.AllReduce(r, work[r].data(), count); });
      for (std::thread& th : threads) th.join();
      for (int r = 0; r < t; ++r) {
        CHECK(status[r].ok());
        CHECK(std::memcmp(work[r].data(), expected.data(), count * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("CpuAllReduce times out on a missing rank and stays broken", "[tensor_parallel]") {
  CpuAllReduce reduce(3, milliseconds(50));
  std::vector<float> a(8, 1.0f), b(8, 2.0f);
  Status sa, sb;
  std::thread ta([&] { sa = reduce.AllReduce(0, a.data(), a.size()); });
  std::thread tb([&] { sb = reduce.AllReduce(1, b.data(), b.size()); });
  ta.join();
  tb.join();
  // One of the two timed out naming rank 2; the other saw the collective broken by it.
  const Status& timed_out = sa.code() == StatusCode::kDeadlineExceeded ? sa : sb;
  const Status& other = &timed_out == &sa ? sb : sa;
  CHECK(timed_out.code() == StatusCode::kDeadlineExceeded);
  CHECK(timed_out.message().ends_with("waited 50 ms for rank(s) 2"));
  CHECK(other.code() == StatusCode::kFailedPrecondition);
  CHECK(reduce.broken());
  std::vector<float> c(8);
  CHECK(reduce.AllReduce(2, c.data(), c.size()).code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("an all_reduce hook over one rank keeps the forward's result", "[tensor_parallel]") {
  auto model = RandomModel(Shape(4, 2, 32, 384));
  Script script(model->config().vocab_size);
  FullRun plain = RunUnsharded(*model, script);
  auto engine = CpuForward::Create(*model, ForwardOptions{});
  REQUIRE(engine.ok());
  auto cache = KvCache::Create((*engine)->MakeKvLayout(), Script::kPoolBlocks);
  REQUIRE(cache.ok());
  int calls = 0;
  size_t last_count = 0;
  ForwardHooks hooks;
  hooks.all_reduce = [&](float*, size_t count) {
    ++calls;
    last_count = count;
  };
  auto logits = RunScript(script, model->config().vocab_size, [&](auto batch) {
    auto out = (*engine)->Forward(batch, **cache, LogitsMode::kLastToken, &hooks);
    REQUIRE(out.ok());
    return *out;
  });
  CHECK(calls == 2 * 2 * (script.steps + 1));  // two per layer per call
  CHECK(last_count == 2 * 128);                // a decode step: 2 tokens x hidden
  for (size_t i = 0; i < logits.size(); ++i) CHECK(RelErr(logits[i], plain.logits[i]) < 1e-6f);
}

TEST_CASE("a tensor-parallel forward equals the unsharded one", "[tensor_parallel]") {
  test::TempDir dir;
  SECTION("tiny llama: 2 ranks, and 4 with KV heads replicated") {
    auto model = TinyModel(dir, ModelFamily::kLlama);
    CheckTpMatchesUnsharded(*model, 2);
    CheckTpMatchesUnsharded(*model, 4);
  }
  SECTION("tiny qwen2 (qkv bias, tied embeddings): 2 ranks") {
    CheckTpMatchesUnsharded(*TinyModel(dir, ModelFamily::kQwen2), 2);
  }
  SECTION("tiny llama in bfloat16: 2 ranks") {
    CheckTpMatchesUnsharded(*TinyModel(dir, ModelFamily::kLlama, WeightDType::kBF16), 2);
  }
  SECTION("multi-head attention with o_proj bias: 2 and 4 ranks") {
    ModelConfig config = Shape(4, 4, 32, 256);
    config.o_bias = true;
    auto model = RandomModel(config);
    CheckTpMatchesUnsharded(*model, 2);
    CheckTpMatchesUnsharded(*model, 4);
  }
  SECTION("one KV head (multi-query) replicated on 2 ranks, of 2 threads each") {
    CheckTpMatchesUnsharded(*RandomModel(Shape(8, 1, 16, 256)), 2, 2);
  }
}

TEST_CASE("a tensor-parallel forward refuses pools of the wrong layout", "[tensor_parallel]") {
  auto model = RandomModel(Shape(4, 2, 32, 384));
  TpRun tp(*model, 2);
  std::vector<int32_t> tokens{1, 2, 3};
  std::vector<int32_t> table{0};
  SequenceInput seq{tokens, 0, table};
  std::vector<KvCache*> one{tp.pools[0]};
  CHECK(tp.tp->ForwardRanks({&seq, 1}, one).status().message() ==
        "tensor-parallel forward: 1 KV pools for 2 ranks");
  auto full_layout = KvCache::Create(KvLayout{2, 2, 32, 16}, Script::kPoolBlocks);
  REQUIRE(full_layout.ok());
  std::vector<KvCache*> wrong{tp.pools[0], full_layout->get()};
  CHECK(tp.tp->ForwardRanks({&seq, 1}, wrong).status().code() == StatusCode::kInvalidArgument);
  // A bad token fails on every rank alike: no rank is left waiting in the collective.
  std::vector<int32_t> bad{1, 100000};
  SequenceInput bad_seq{bad, 0, table};
  CHECK(tp.tp->ForwardRanks({&bad_seq, 1}, tp.pools).status().code() == StatusCode::kInvalidArgument);
  CHECK(tp.tp->ForwardRanks({&seq, 1}, tp.pools).ok());
  CHECK(CreateTpCpuForward(*model, 3, ForwardOptions{}, kCollectiveTimeout).status().message() ==
        "tensor_parallel 3 does not divide num_attention_heads 4");
}

TEST_CASE("KvReshardPlan maps heads to byte ranges merged where contiguous", "[tensor_parallel]") {
  const KvLayout full{2, 4, 8, 4};  // 4 KV heads of 8 dims, blocks of 4 slots
  const uint64_t head = 4 * 8 * 4;  // one head's K (or V) of one block, in bytes
  auto split = KvReshardPlan::Make(full, 1, 2);
  REQUIRE(split.ok());
  CHECK(split->source_layout().num_kv_heads == 4);
  CHECK(split->destination_layout().num_kv_heads == 2);
  CHECK(split->heads(1) == std::vector<KvHeadSource>{{0, 2, 0}, {0, 3, 1}});
  const std::vector<int32_t> src_table{3}, dst_table{1};
  std::vector<KvRankBlocks> src{{5, src_table}};
  auto copies = split->Copies(0, src, KvRankBlocks{2, dst_table});
  REQUIRE(copies.ok());
  // Per layer: K of heads 0-1 (one range), then V of heads 0-1.
  REQUIRE(copies->size() == 4);
  const uint64_t src_block = 8 * head, dst_block = 4 * head;
  CHECK((*copies)[0].src_offset == 3 * src_block);
  CHECK((*copies)[0].dst_offset == 1 * dst_block);
  CHECK((*copies)[0].length == 2 * head);
  CHECK((*copies)[1].src_offset == 3 * src_block + 4 * head);  // V of head 0
  CHECK((*copies)[1].dst_offset == 1 * dst_block + 2 * head);
  CHECK((*copies)[2].layer == 1);
  CHECK((*copies)[2].src_offset == (5 + 3) * src_block);
  CHECK((*copies)[2].dst_offset == (2 + 1) * dst_block);

  // Gathering 2 -> 1 reads each half from its rank.
  auto gather = KvReshardPlan::Make(full, 2, 1);
  REQUIRE(gather.ok());
  CHECK(gather->heads(0) == std::vector<KvHeadSource>{{0, 0, 0}, {0, 1, 1}, {1, 0, 2}, {1, 1, 3}});
  // Replicated sources (8 ranks over 4 heads): each destination reads a different replica.
  auto replicated = KvReshardPlan::Make(full, 8, 4);
  REQUIRE(replicated.ok());
  CHECK(replicated->heads(2) == std::vector<KvHeadSource>{{4, 0, 0}});
  CHECK(replicated->heads(3) == std::vector<KvHeadSource>{{7, 0, 0}});

  // The same degree with contiguous tables: one range per layer.
  auto same = KvReshardPlan::Make(full, 1, 1);
  REQUIRE(same.ok());
  const std::vector<int32_t> both{0, 1};
  std::vector<KvRankBlocks> whole{{2, both}};
  auto merged = same->Copies(0, whole, KvRankBlocks{2, both});
  REQUIRE(merged.ok());
  REQUIRE(merged->size() == 2);
  CHECK((*merged)[1].length == 2 * src_block);

  CHECK(KvReshardPlan::Make(full, 3, 1).status().message() ==
        "KV re-shard: source tensor_parallel 3 neither divides nor is a multiple of 4 "
        "key-value heads");
  CHECK(KvReshardPlan::Make(full, 1, 0).status().code() == StatusCode::kInvalidArgument);
  const std::vector<int32_t> outside{5};
  std::vector<KvRankBlocks> bad{{5, outside}};
  CHECK(split->Copies(0, bad, KvRankBlocks{2, dst_table}).status().message() ==
        "KV re-shard: source rank 0's table names block 5 outside its pool of 5");
  CHECK(split->Copies(0, src, KvRankBlocks{2, both}).status().message() ==
        "KV re-shard: source rank 0's table has 1 blocks, the destination 2");
}

TEST_CASE("re-sharded KV equals a forward's at the new degree and decodes on",
          "[tensor_parallel]") {
  test::TempDir dir;
  auto model = TinyModel(dir, ModelFamily::kLlama);  // 2 KV heads
  const int vocab = model->config().vocab_size;
  Script script(vocab);
  FullRun full = RunUnsharded(*model, script);
  Script prefill_only = script;
  prefill_only.steps = 0;
  const KvLayout layout = full.cache->layout();
  FullRun full_prefill = RunUnsharded(*model, prefill_only);
  const std::vector<std::pair<int, int>> degrees{{2, 1}, {2, 4}, {1, 2}, {4, 2}};
  // The destination pool is larger and holds the requests in other blocks, in no order.
  Script moved = script;
  moved.table_a = {11, 4, 9, 2, 7, 0};
  moved.table_b = {5, 10};
  for (auto [from, to] : degrees) {
    INFO("tensor_parallel " << from << " -> " << to);
    TpRun source(*model, from), reference(*model, to), destination(*model, to, 12);
    const std::vector<float> first = RunScript(prefill_only, vocab, source.Fn())[0];
    RunScript(prefill_only, vocab, reference.Fn());
    auto plan = KvReshardPlan::Make(layout, from, to);
    REQUIRE(plan.ok());
    REQUIRE(plan->source_layout() == source.tp->MakeKvLayout());
    REQUIRE(plan->destination_layout() == destination.tp->MakeKvLayout());
    std::vector<const KvCache*> sources(source.pools.begin(), source.pools.end());
    for (int seq = 0; seq < 2; ++seq) {
      // A source's ranks share a block table (TpForward), the destination has its own.
      const std::vector<int32_t>& from_table = seq == 0 ? script.table_a : script.table_b;
      const std::vector<int32_t>& to_table = seq == 0 ? moved.table_a : moved.table_b;
      std::vector<KvRankBlocks> src(from, KvRankBlocks{Script::kPoolBlocks, from_table});
      for (int d = 0; d < to; ++d) {
        auto copies = plan->Copies(d, src, KvRankBlocks{12, to_table});
        REQUIRE(copies.ok());
        REQUIRE(ApplyKvCopies(sources, *destination.pools[d], *copies).ok());
      }
    }
    // Bit for bit the source heads; within rounding the pools a forward at `to` fills.
    const std::vector<int32_t> blocks = script.Blocks(), moved_blocks = moved.Blocks();
    // The transport's way (kvtransfer/sharded_copies.h): the two sides' ranges in rank 0's
    // pool, the pieces between pools; the same bytes land.
    TpRun via(*model, to, 12);
    LayerRanges remote(layout.num_layers), local(layout.num_layers);
    for (int l = 0; l < layout.num_layers; ++l)
      for (size_t k = 0; k < blocks.size(); ++k) {
        auto offset = [l](const KvCache& c, int32_t b) {
          return static_cast<uint64_t>(reinterpret_cast<const std::byte*>(c.BlockData(l, b)) -
                                       c.data());
        };
        remote[l].push_back({offset(*source.pools[0], blocks[k]), source.pools[0]->block_bytes()});
        local[l].push_back({offset(*via.pools[0], moved_blocks[k]), via.pools[0]->block_bytes()});
      }
    auto pieces = PlanShardedCopies(remote, KvPoolShape{layout, from, Script::kPoolBlocks}, local,
                                    KvPoolShape{layout, to, 12});
    REQUIRE(pieces.ok());
    for (const CopyPiece& p : *pieces)
      std::memcpy(via.pools[p.local_pool]->data() + p.local_offset,
                  source.pools[p.remote_pool]->data() + p.remote_offset, p.length);
    for (int d = 0; d < to; ++d)
      for (int j = 0; j < plan->destination_layout().num_kv_heads; ++j)
        CHECK(HeadErr(*destination.pools[d], j, moved_blocks, *via.pools[d], j, moved_blocks) ==
              0.0f);
    for (int d = 0; d < to; ++d)
      for (const KvHeadSource& h : plan->heads(d))
        CHECK(HeadErr(*source.pools[h.src_rank], h.src_head, blocks, *destination.pools[d],
                      h.dst_head, moved_blocks) == 0.0f);
    for (int d = 0; d < to; ++d)
      for (int j = 0; j < plan->destination_layout().num_kv_heads; ++j)
        CHECK(HeadErr(*reference.pools[d], j, blocks, *destination.pools[d], j, moved_blocks) <=
              kKvTolerance);
    CheckPoolsMatch(*full_prefill.cache, blocks, destination.pools, moved_blocks, to, kKvTolerance);
    // Decoding goes on at the new degree from the moved KV, as the unsharded model does.
    std::span<const float> logits(first);
    auto decoded = RunScript(moved, vocab, destination.Fn(), 1, Argmax(logits.subspan(0, vocab)),
                             Argmax(logits.subspan(vocab, vocab)));
    REQUIRE(decoded.size() == static_cast<size_t>(script.steps));
    for (int i = 0; i < script.steps; ++i) {
      CHECK(RelErr(decoded[i], full.logits[i + 1]) < 1e-5f);
      for (int s = 0; s < 2; ++s)
        CHECK(Argmax(std::span<const float>(decoded[i]).subspan(s * vocab, vocab)) ==
              Argmax(std::span<const float>(full.logits[i + 1]).subspan(s * vocab, vocab)));
    }
  }
}

}  // namespace tandem

namespace tandem {
namespace {

// TpForward as the engines see it (ForwardBackend): one pool from AllocateKvPool, the other
// ranks' pools behind it. What the GPU ranks run through, on CPU ranks.
TEST_CASE("a tensor-parallel backend serves through the backend seam", "[tensor_parallel]") {
  auto model = RandomModel(Shape(4, 2, 32, 384));
  const int vocab = model->config().vocab_size;
  Script script(vocab);
  FullRun plain = RunUnsharded(*model, script);
  auto made = CreateTpCpuForward(*model, 2, ForwardOptions{}, kCollectiveTimeout);
  REQUIRE(made.ok());
  std::unique_ptr<ForwardBackend> backend = std::move(*made);
  auto* tp = static_cast<TpForward*>(backend.get());
  const KvLayout layout = backend->MakeKvLayout();
  CHECK(layout.num_kv_heads == 1);  // the rank's share of 2
  CHECK(backend->description() == "cpu tensor_parallel 2");
  auto memory = backend->AllocateKvPool(KvPoolBytes(layout, Script::kPoolBlocks));
  REQUIRE(memory.ok());
  auto cache = KvCache::Create(layout, Script::kPoolBlocks, *memory);
  REQUIRE(cache.ok());
  *memory = KvPoolMemory{};  // the cache alone keeps every rank's pool alive

  SECTION("logits equal the unsharded pass; each rank's pool is its own") {
    auto logits = RunScript(script, vocab, [&](std::span<const SequenceInput> b) {
      auto out = backend->Forward(b, **cache);
      REQUIRE(out.ok());
      return *out;
    });
    for (size_t i = 0; i < logits.size(); ++i) CHECK(RelErr(logits[i], plain.logits[i]) < 1e-5f);
    auto ranks = tp->RankCaches(**cache);
    REQUIRE(ranks.ok());
    REQUIRE(ranks->size() == 2);
    CHECK((*ranks)[0] == cache->get());
    CHECK((*ranks)[1]->data() != (*cache)->data());
    CheckPoolsMatch(*plain.cache, script.Blocks(), *ranks, script.Blocks(), 2, kKvTolerance);
  }
  SECTION("greedy rows come from rank 0, as the logits' argmax") {
    std::vector<uint8_t> wanted{1, 1};
    std::vector<int32_t> ids{-1, -1};
    GreedyRows greedy{wanted, ids};
    std::vector<SequenceInput> batch{{script.prompt_a, 0, script.table_a},
                                     {script.prompt_b, 0, script.table_b}};
    auto out = backend->Forward(batch, **cache, LogitsMode::kLastToken, nullptr, &greedy);
    REQUIRE(out.ok());
    CHECK(ids[0] == Argmax(std::span<const float>(plain.logits[0]).subspan(0, vocab)));
    CHECK(ids[1] == Argmax(std::span<const float>(plain.logits[0]).subspan(vocab, vocab)));
  }
  SECTION("before_layer runs once per layer on the caller, before any rank's layer") {
    std::vector<int> seen;
    const std::thread::id caller = std::this_thread::get_id();
    bool on_caller = true;
    ForwardHooks hooks;
    hooks.before_layer = [&](int layer) {
      seen.push_back(layer);
      on_caller = on_caller && std::this_thread::get_id() == caller;
      // A slow layer (a KV layer still arriving): the other rank must wait, not run ahead.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    };
    std::vector<SequenceInput> batch{{script.prompt_a, 0, script.table_a},
                                     {script.prompt_b, 0, script.table_b}};
    auto out = backend->Forward(batch, **cache, LogitsMode::kLastToken, &hooks);
    REQUIRE(out.ok());
    CHECK(seen == std::vector<int>{0, 1});
    CHECK(on_caller);
    CHECK(RelErr(*out, plain.logits[0]) < 1e-5f);
  }
  SECTION("a pool it did not allocate is refused; a refused batch does not break it") {
    auto foreign = KvCache::Create(layout, Script::kPoolBlocks);
    REQUIRE(foreign.ok());
    std::vector<int32_t> tokens{1, 2, 3};
    std::vector<int32_t> table{0};
    SequenceInput seq{tokens, 0, table};
    CHECK(backend->Forward({&seq, 1}, **foreign).status().message() ==
          "tensor-parallel forward: the KV pool was not made by this backend's AllocateKvPool "
          "(each rank keeps its own pool)");
    std::vector<int32_t> bad{1, 100000};
    SequenceInput bad_seq{bad, 0, table};
    CHECK(backend->Forward({&bad_seq, 1}, **cache).status().code() ==
          StatusCode::kInvalidArgument);
    CHECK_FALSE(tp->broken());
    CHECK(backend->Forward({&seq, 1}, **cache).ok());
  }
  SECTION("a before_layer slower than the collective timeout does not break it") {
    // The hook bounds its own wait (decode: a KV layer still arriving); the other ranks' wait
    // at the gate does not count while rank 0 is inside it.
    auto slow = CreateTpCpuForward(*model, 2, ForwardOptions{}, std::chrono::milliseconds(30));
    REQUIRE(slow.ok());
    auto slow_memory = (*slow)->AllocateKvPool(KvPoolBytes(layout, Script::kPoolBlocks));
    REQUIRE(slow_memory.ok());
    auto slow_cache = KvCache::Create(layout, Script::kPoolBlocks, *slow_memory);
    REQUIRE(slow_cache.ok());
    ForwardHooks hooks;
    hooks.before_layer = [](int) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); };
    std::vector<SequenceInput> batch{{script.prompt_a, 0, script.table_a},
                                     {script.prompt_b, 0, script.table_b}};
    auto out = (*slow)->Forward(batch, **slow_cache, LogitsMode::kLastToken, &hooks);
    REQUIRE(out.ok());
    CHECK(RelErr(*out, plain.logits[0]) < 1e-5f);
    CHECK_FALSE((*slow)->broken());
  }
  SECTION("greedy rows that do not fit the batch are refused before any rank runs") {
    std::vector<uint8_t> wanted{1};  // one row for a batch of two
    std::vector<int32_t> ids{-1};
    GreedyRows greedy{wanted, ids};
    std::vector<SequenceInput> batch{{script.prompt_a, 0, script.table_a},
                                     {script.prompt_b, 0, script.table_b}};
    CHECK(backend->Forward(batch, **cache, LogitsMode::kLastToken, nullptr, &greedy)
              .status()
              .code() == StatusCode::kInvalidArgument);
    CHECK_FALSE(tp->broken());
  }
}

// Layer-wise arrival into a tensor-parallel decode: before_layer(l) lands layer l's KV in every
// rank's pool, late (after a sleep). A rank that ran ahead of the gate would attend over an
// empty layer and change the logits.
TEST_CASE("no rank computes a layer before before_layer released it", "[tensor_parallel]") {
  auto model = RandomModel(Shape(4, 2, 32, 384));
  const int vocab = model->config().vocab_size;
  Script script(vocab);
  auto make = [&] {
    auto made = CreateTpCpuForward(*model, 2, ForwardOptions{}, kCollectiveTimeout);
    REQUIRE(made.ok());
    return std::move(*made);
  };
  std::unique_ptr<TpForward> source = make(), destination = make();
  const KvLayout layout = source->MakeKvLayout();
  auto pool = [&](TpForward& tp) {
    auto memory = tp.AllocateKvPool(KvPoolBytes(layout, Script::kPoolBlocks));
    REQUIRE(memory.ok());
    auto cache = KvCache::Create(layout, Script::kPoolBlocks, *memory);
    REQUIRE(cache.ok());
    return std::move(*cache);
  };
  std::unique_ptr<KvCache> source_cache = pool(*source), destination_cache = pool(*destination);
  // The prompts' KV on the source; the first decode step there is the reference.
  std::vector<SequenceInput> prompts{{script.prompt_a, 0, script.table_a},
                                     {script.prompt_b, 0, script.table_b}};
  auto first = source->Forward(prompts, *source_cache);
  REQUIRE(first.ok());
  std::span<const float> first_logits = *first;
  int32_t next[2] = {Argmax(first_logits.subspan(0, vocab)),
                     Argmax(first_logits.subspan(vocab, vocab))};
  std::vector<SequenceInput> step{
      {{&next[0], 1}, static_cast<int32_t>(script.prompt_a.size()), script.table_a},
      {{&next[1], 1}, static_cast<int32_t>(script.prompt_b.size()), script.table_b}};
  auto want = source->Forward(step, *source_cache);
  REQUIRE(want.ok());
  const std::vector<float> reference(want->begin(), want->end());
  // The source's step wrote its own new tokens' KV too: the destination's step writes its own.
  auto from = source->RankCaches(*source_cache);
  auto to = destination->RankCaches(*destination_cache);
  REQUIRE(from.ok());
  REQUIRE(to.ok());
  const std::vector<int32_t> blocks = script.Blocks();
  ForwardHooks hooks;
  hooks.before_layer = [&](int layer) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int r = 0; r < 2; ++r)
      for (int32_t b : blocks)
        std::memcpy((*to)[r]->BlockData(layer, b), (*from)[r]->BlockData(layer, b),
                    layout.block_bytes());
  };
  auto got = destination->Forward(step, *destination_cache, LogitsMode::kLastToken, &hooks);
  REQUIRE(got.ok());
  CHECK(RelErr(*got, reference) < 1e-5f);
}

TEST_CASE("the CPU backend serves tensor_parallel 1 only", "[tensor_parallel]") {
  auto model = RandomModel(Shape(4, 2, 32, 384));
  ForwardOptions options;
  options.tensor_parallel = 2;
  auto made = CreateForwardBackend(*model, options, "cpu");
  REQUIRE_FALSE(made.ok());
  CHECK(made.status().message().starts_with("tensor_parallel 2 on device cpu"));
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST_CASE("TpRankWeightBytes is what a rank's shard holds", "[tensor_parallel]") {
  test::TempDir dir;
  for (ModelFamily family : {ModelFamily::kLlama, ModelFamily::kQwen2}) {  // untied, tied
    auto model = TinyModel(dir, family);
    // Within the alignment padding a model adds between tensors (at most 64 bytes each).
    const ModelConfig& c = model->config();
    const double padding = 64.0 * (12 * c.num_layers + 4);
    CHECK(std::abs(double(TpRankWeightBytes(*model, 1)) - double(model->total_bytes())) <=
          padding);
    for (int degree : {2, 4}) {  // 4 ranks of 2 KV heads: each holds a replicated head
      INFO("tensor_parallel " << degree);
      auto plan = MakeTpPlan(c, degree);
      REQUIRE(plan.ok());
      auto shard = ShardModel(*model, *plan, 0);
      REQUIRE(shard.ok());
      CHECK(std::abs(double(TpRankWeightBytes(*model, degree)) -
                     double((*shard)->total_bytes())) <= padding);
      CHECK(TpRankWeightBytes(*model, degree) < model->total_bytes());
    }
  }
}

}  // namespace
}  // namespace tandem
