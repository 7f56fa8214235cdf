// TpForward behind the backend seam, on CPU ranks: what the GPU ranks run through (per-rank
// pools behind the engine's one, the layer gate, breaking), and the per-rank weight bytes.
#include "common/engine/tp_forward.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "tests/unit/tensor_parallel_util.h"

namespace tandem {

using namespace tp_test;  // NOLINT: the helpers of tests/unit/tensor_parallel_util.h

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
    GreedyRows greedy{wanted, ids, {}, {}};
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
    CHECK(backend->Forward({&bad_seq, 1}, **cache).status().code() == StatusCode::kInvalidArgument);
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
    GreedyRows greedy{wanted, ids, {}, {}};
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

TEST_CASE("TpRankWeightBytes is what a rank's shard holds", "[tensor_parallel]") {
  test::TempDir dir;
  for (ModelFamily family : {ModelFamily::kLlama, ModelFamily::kQwen2}) {  // untied, tied
    auto model = TinyModel(dir, family);
    // Within the alignment padding a model adds between tensors (at most 64 bytes each).
    const ModelConfig& c = model->config();
    const double padding = 64.0 * (12 * c.num_layers + 4);
    CHECK(std::abs(double(TpRankWeightBytes(*model, 1)) - double(model->total_bytes())) <= padding);
    for (int degree : {2, 4}) {  // 4 ranks of 2 KV heads: each holds a replicated head
      INFO("tensor_parallel " << degree);
      auto plan = MakeTpPlan(c, degree);
      REQUIRE(plan.ok());
      auto shard = ShardModel(*model, *plan, 0);
      REQUIRE(shard.ok());
      CHECK(std::abs(double(TpRankWeightBytes(*model, degree)) - double((*shard)->total_bytes())) <=
            padding);
      CHECK(TpRankWeightBytes(*model, degree) < model->total_bytes());
    }
  }
}

}  // namespace
}  // namespace tandem
