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
#include "tests/unit/tensor_parallel_util.h"
#include "tests/unit/test_util.h"

namespace tandem {

using namespace tp_test;  // NOLINT: the helpers of tests/unit/tensor_parallel_util.h

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
