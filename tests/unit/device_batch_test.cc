// The host side the CUDA backend shares with the CPU one, tested where no GPU is: the flat
// batch a device pass reads (common/engine/device_batch.h), the backend seam's device choice
// and the KV pool's memory kind (common/engine/forward_backend.h, kv_cache.h).
#include "common/engine/device_batch.h"

#include <catch2/catch.hpp>

#include <limits>
#include <random>
#include <set>
#include <vector>

#include "common/engine/forward.h"
#include "common/engine/forward_backend.h"
#include "common/engine/kv_cache.h"
#include "common/engine/sampling.h"
#include "common/model/make_model.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

// The default make-model preset (no tokenizer), written under dir and loaded.
StatusOr<std::unique_ptr<Model>> TinyModel(const test::TempDir& dir) {
  MakeModelOptions options;
  options.with_tokenizer = false;
  const std::string path = (dir.path() / "m").string();
  TANDEM_RETURN_IF_ERROR(MakeModel(options, path));
  return Model::Load(path);
}

TEST_CASE("device batch: a mixed batch flattens as the CPU pass walks it", "[device_batch]") {
  // Sequence 0: a 10-token prefill chunk from position 3 (blocks 7, 2 of size 4: positions
  // 0-3, 4-7, then block 9: 8-11, block 5: 12-15); sequence 1: one decode token at 5.
  const std::vector<int32_t> prompt = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  const std::vector<int32_t> table0 = {7, 2, 9, 5, 1};  // one block more than needed
  const std::vector<int32_t> decode = {42};
  const std::vector<int32_t> table1 = {4, 6};
  const std::vector<SequenceInput> batch = {{prompt, 3, table0}, {decode, 5, table1}};
  DeviceBatch d;
  BuildDeviceBatch(batch, 4, 0, 0, 8, &d);
  CHECK(d.num_tokens == 11);
  CHECK(d.num_seqs == 2);
  CHECK(d.real_seqs == 2);
  CHECK_FALSE(d.decode_only);
  CHECK(d.max_blocks_per_seq == 4);  // positions up to 12: four blocks of 4
  CHECK(d.max_context == 13);
  CHECK(d.token_ids == std::vector<int32_t>{11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 42});
  CHECK(d.positions == std::vector<int32_t>{3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 5});
  // Position p of sequence 0 goes to block table0[p / 4], slot p % 4.
  CHECK(d.slot_mapping ==
        std::vector<int64_t>{7 * 4 + 3, 2 * 4 + 0, 2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3, 9 * 4 + 0,
                             9 * 4 + 1, 9 * 4 + 2, 9 * 4 + 3, 5 * 4 + 0, 6 * 4 + 1});
  CHECK(d.block_tables == std::vector<int32_t>{7, 2, 9, 5, 4, 6, 0, 0});
  CHECK(d.seq_lens == std::vector<int32_t>{13, 6});
  CHECK(d.last_token == std::vector<int32_t>{9, 10});
  // Tiles of up to 8 tokens within a sequence.
  CHECK(d.tiles == std::vector<int32_t>{0, 0, 8, 0, 8, 2, 1, 10, 1});
  CHECK(d.num_tiles() == 3);
}

TEST_CASE("device batch: a decode batch pads to a graph size with inert sequences",
          "[device_batch]") {
  const std::vector<int32_t> a = {5}, b = {6};
  const std::vector<int32_t> ta = {3}, tb = {8, 1};
  const std::vector<SequenceInput> batch = {{a, 0, ta}, {b, 4, tb}};
  DeviceBatch d;
  BuildDeviceBatch(batch, 4, 6, 4, 8, &d);
  CHECK(d.decode_only);
  CHECK(d.num_seqs == 4);
  CHECK(d.real_seqs == 2);
  CHECK(d.num_tokens == 4);
  CHECK(d.max_blocks_per_seq == 6);  // fixed by the caller (a captured graph's row length)
  CHECK(d.token_ids == std::vector<int32_t>{5, 6, 0, 0});
  CHECK(d.slot_mapping == std::vector<int64_t>{12, 4, -1, -1});  // padding writes no KV
  CHECK(d.seq_lens == std::vector<int32_t>{1, 5, 0, 0});        // and attends over nothing
  CHECK(d.last_token == std::vector<int32_t>{0, 1, 2, 3});
  CHECK(d.block_tables.size() == 24);
  CHECK(d.block_tables[6] == 8);
  CHECK(d.block_tables[7] == 1);
  CHECK(d.block_tables[12] == 0);

  // Built again into the same object: nothing of the first batch is left.
  const std::vector<SequenceInput> one = {{a, 0, ta}};
  BuildDeviceBatch(one, 4, 0, 0, 8, &d);
  CHECK(d.num_seqs == 1);
  CHECK(d.block_tables == std::vector<int32_t>{3});
  CHECK(d.tiles == std::vector<int32_t>{0, 0, 1});
}

TEST_CASE("device batch: graph sizes cover every batch up to the maximum", "[device_batch]") {
  const std::vector<int32_t> sizes = DecodeGraphSizes(100);
  CHECK(sizes == std::vector<int32_t>{1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 96, 100});
  CHECK(GraphBatchSize(sizes, 1) == 1);
  CHECK(GraphBatchSize(sizes, 3) == 4);
  CHECK(GraphBatchSize(sizes, 57) == 64);
  CHECK(GraphBatchSize(sizes, 100) == 100);
  CHECK(GraphBatchSize(sizes, 101) == 0);
  CHECK(DecodeGraphSizes(1) == std::vector<int32_t>{1});
  CHECK(DecodeGraphSizes(0).empty());
}

TEST_CASE("device batch: decode graphs are shaped for the batch's longest context, in powers "
          "of two of partitions", "[device_batch]") {
  // max_model_len 131072, partitions of 512 tokens (up to 256), blocks of 16 tokens.
  auto shape = [](int64_t context) { return DecodeGraphShapeFor(context, 131072, 16, 512); };
  CHECK(shape(1) == DecodeGraphShape{1, 32});
  CHECK(shape(512) == DecodeGraphShape{1, 32});
  CHECK(shape(513) == DecodeGraphShape{2, 64});
  CHECK(shape(1025) == DecodeGraphShape{4, 128});  // 3 partitions needed, a power of two taken
  CHECK(shape(70000) == DecodeGraphShape{256, 8192});
  CHECK(shape(131072) == DecodeGraphShape{256, 8192});
  // Every context gets a row that holds it, and partitions that cover it.
  for (int64_t context : {1, 15, 16, 17, 511, 512, 513, 4000, 65537, 131071, 131072}) {
    const DecodeGraphShape s = shape(context);
    CHECK(int64_t{s.partitions} * 512 >= context);
    CHECK(int64_t{s.max_blocks_per_seq} * 16 >= context);
  }
  // Few shapes in all: 1, 2, 4, ... 256 partitions.
  std::set<int32_t> distinct;
  for (int64_t context = 1; context <= 131072; context += 97)
    distinct.insert(shape(context).partitions);
  CHECK(distinct.size() == 9);
  // A max_model_len that is no power of two of partitions caps the last shape at it.
  CHECK(DecodeGraphShapeFor(1500, 1500, 16, 512) == DecodeGraphShape{3, 94});
  CHECK(DecodeGraphShapeFor(600, 1500, 16, 512) == DecodeGraphShape{2, 64});
  CHECK(DecodeGraphShapeFor(20, 20, 16, 512) == DecodeGraphShape{1, 2});
}

TEST_CASE("forward backend: the device names the backend, and cuda needs a CUDA build",
          "[device_batch]") {
  test::TempDir dir;
  StatusOr<std::unique_ptr<Model>> model = TinyModel(dir);
  REQUIRE(model.ok());
  StatusOr<std::unique_ptr<ForwardBackend>> cpu = CreateForwardBackend(**model, {}, "cpu");
  REQUIRE(cpu.ok());
  CHECK((*cpu)->description() == "cpu");
  StatusOr<std::unique_ptr<ForwardBackend>> tpu = CreateForwardBackend(**model, {}, "tpu");
  REQUIRE_FALSE(tpu.ok());
  CHECK(tpu.status().message() == "device 'tpu': expected cpu or cuda");
  StatusOr<std::unique_ptr<ForwardBackend>> gpu = CreateForwardBackend(**model, {}, "cuda");
  if (!ForwardBackendHasCuda()) {
    REQUIRE_FALSE(gpu.ok());
    CHECK(gpu.status().code() == StatusCode::kInvalidArgument);
    CHECK(gpu.status().message().find("this build has no CUDA backend") != std::string::npos);
  } else if (!gpu.ok()) {  // a CUDA build on a machine without a device
    CHECK(gpu.status().code() == StatusCode::kUnavailable);
  }

  // kv_cache.dtype bfloat16 is for device pools: the CPU backend refuses it.
  ForwardOptions bf16;
  bf16.kv_dtype = KvDType::kBFloat16;
  CHECK(CreateForwardBackend(**model, bf16, "cpu").status().message() ==
        "kv_cache.dtype bfloat16 on device cpu: the CPU backend keeps KV in float32");

  // The CPU backend computes on host pools only; the pool it allocates is host memory.
  StatusOr<KvPoolMemory> memory = (*cpu)->AllocateKvPool(KvPoolBytes((*cpu)->MakeKvLayout(16), 4));
  REQUIRE(memory.ok());
  CHECK(memory->kind == KvMemoryKind::kHost);
  StatusOr<std::unique_ptr<KvCache>> cache =
      KvCache::Create((*cpu)->MakeKvLayout(16), 4, std::move(*memory));
  REQUIRE(cache.ok());
  const std::vector<int32_t> tokens = {1, 2, 3};
  const std::vector<int32_t> table = {0};
  const std::vector<SequenceInput> batch = {{tokens, 0, table}};
  CHECK((*cpu)->Forward(batch, **cache).ok());
}

TEST_CASE("forward backend: model.dtype auto is bfloat16 on cuda, the checkpoint's on cpu",
          "[device_batch]") {
  CHECK(LoadDTypeFor("auto", "cpu") == std::nullopt);
  CHECK(LoadDTypeFor("auto", "cuda") == WeightDType::kBF16);
  CHECK(LoadDTypeFor("float32", "cuda") == WeightDType::kF32);  // checks against the CPU
  CHECK(LoadDTypeFor("float16", "cpu") == WeightDType::kF16);
  CHECK(LoadDTypeFor("bfloat16", "cpu") == WeightDType::kBF16);
}

TEST_CASE("greedy rows: the plain argmax is what the sampler picks, and only then",
          "[device_batch]") {
  SamplingParams greedy;
  greedy.temperature = 0;
  CHECK(Sampler::IsPlainArgmax(greedy, 0));
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int round = 0; round < 200; ++round) {
    std::vector<float> logits(97);
    for (float& x : logits) x = normal(rng);
    if (round % 3 == 0) logits[rng() % 97] = nan;
    if (round % 4 == 0) logits[rng() % 97] = -inf;
    if (round % 5 == 0) logits[10] = logits[50] = 9.0f;  // a tie: the lower id
    Sampler sampler(greedy, 97, 1);
    const std::vector<int32_t> tokens = {1};
    CHECK(sampler.Sample(logits, tokens).token_id == ArgmaxRow(logits));
  }
  CHECK(ArgmaxRow(std::vector<float>{nan, -inf}) == -1);
  CHECK(ArgmaxRow(std::vector<float>{-inf, 1.0f, 1.0f}) == 1);

  // Anything that changes the logits or reports more than the token is not plain.
  auto with = [&](auto&& change) {
    SamplingParams p = greedy;
    change(p);
    return Sampler::IsPlainArgmax(p, 5);
  };
  CHECK_FALSE(with([](SamplingParams& p) { p.temperature = 0.5f; }));
  CHECK_FALSE(with([](SamplingParams& p) { p.logit_bias.push_back({3, 1.0f}); }));
  CHECK_FALSE(with([](SamplingParams& p) { p.repetition_penalty = 1.1f; }));
  CHECK_FALSE(with([](SamplingParams& p) { p.presence_penalty = 0.5f; }));
  CHECK_FALSE(with([](SamplingParams& p) { p.frequency_penalty = -0.5f; }));
  CHECK_FALSE(with([](SamplingParams& p) { p.logprobs = true; }));
  CHECK_FALSE(with([](SamplingParams& p) { p.min_tokens = 6; }));  // eos masked at output 5
  CHECK(with([](SamplingParams& p) { p.min_tokens = 5; }));        // no longer
  CHECK(with([](SamplingParams& p) { p.top_p = 0.5f; }));          // warpers do not apply
}

TEST_CASE("greedy rows: the CPU backend fills the wanted rows' argmax and returns the logits",
          "[device_batch]") {
  test::TempDir dir;
  StatusOr<std::unique_ptr<Model>> model = TinyModel(dir);
  REQUIRE(model.ok());
  StatusOr<std::unique_ptr<ForwardBackend>> cpu = CreateForwardBackend(**model, {}, "cpu");
  REQUIRE(cpu.ok());
  const KvLayout layout = (*cpu)->MakeKvLayout(4);
  StatusOr<KvPoolMemory> memory = (*cpu)->AllocateKvPool(KvPoolBytes(layout, 8));
  REQUIRE(memory.ok());
  StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(layout, 8, std::move(*memory));
  REQUIRE(cache.ok());
  const std::vector<int32_t> a = {5, 6, 7}, b = {9, 2}, ta = {0}, tb = {1};
  const std::vector<SequenceInput> batch = {{a, 0, ta}, {b, 0, tb}};
  const std::vector<uint8_t> wanted = {1, 0};
  std::vector<int32_t> argmax = {-7, -7};
  GreedyRows greedy{wanted, argmax, {}, {}};
  StatusOr<std::span<const float>> logits =
      (*cpu)->Forward(batch, **cache, LogitsMode::kLastToken, nullptr, &greedy);
  REQUIRE(logits.ok());
  const size_t vocab = (*model)->config().vocab_size;
  REQUIRE(logits->size() == 2 * vocab);
  CHECK(argmax[0] == ArgmaxRow(logits->subspan(0, vocab)));
  CHECK(argmax[1] == -7);  // not wanted: untouched

  // Drawn rows (what a device backend samples where the logits are): the CPU backend draws
  // them too, with DrawRow; a wanted row without a draw is still its argmax. It does not ask
  // for them (draws_rows: the Sampler is faster on a CPU).
  CHECK_FALSE((*cpu)->draws_rows());
  std::vector<RowDraw> draws(2);
  draws[1] = {0.8f, 20, 0.9f, 0.0f, 0.37, 1};
  const std::vector<uint8_t> both = {1, 1};
  GreedyRows drawn{both, argmax, draws, {}};
  logits = (*cpu)->Forward(batch, **cache, LogitsMode::kLastToken, nullptr, &drawn);
  REQUIRE(logits.ok());
  CHECK(argmax[0] == ArgmaxRow(logits->subspan(0, vocab)));
  CHECK(argmax[1] == DrawRow(logits->subspan(vocab, vocab), draws[1]));
  CHECK(argmax[1] >= 0);
  // With logprobs: the draw's logprobs come back beside it; without a span for them, refused.
  draws[1].top_logprobs = 3;
  std::vector<RowLogprobs> logprobs(2);
  GreedyRows with_logprobs{both, argmax, draws, logprobs};
  logits = (*cpu)->Forward(batch, **cache, LogitsMode::kLastToken, nullptr, &with_logprobs);
  REQUIRE(logits.ok());
  RowLogprobs want;
  CHECK(argmax[1] == DrawRow(logits->subspan(vocab, vocab), draws[1], &want));
  CHECK(logprobs[1].num_top == 3);
  CHECK(logprobs[1].logprob == want.logprob);
  CHECK(logprobs[1].top_ids[0] == ArgmaxRow(logits->subspan(vocab, vocab)));
  CHECK((*cpu)->Forward(batch, **cache, LogitsMode::kLastToken, nullptr, &drawn)
            .status()
            .message() == "forward: a drawn row wants logprobs and GreedyRows has none");
  // Draw numbers the draw kernels cannot take are refused, naming the row.
  for (int bad = 0; bad < 4; ++bad) {
    std::vector<RowDraw> wrong = draws;
    if (bad == 0) wrong[1].top_logprobs = kMaxTopLogprobs + 1;
    if (bad == 1) wrong[1].temperature = 0.0f;
    if (bad == 2) wrong[1].u = 1.0;
    if (bad == 3) wrong[1].draw = 3;
    GreedyRows refused{both, argmax, wrong, logprobs};
    const Status status =
        (*cpu)->Forward(batch, **cache, LogitsMode::kLastToken, nullptr, &refused).status();
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK(status.message().find("forward: row 1 ") == 0);
  }
  const std::vector<RowDraw> one_draw(1);
  GreedyRows short_draws{both, argmax, one_draw, {}};
  CHECK((*cpu)->Forward(batch, **cache, LogitsMode::kLastToken, nullptr, &short_draws)
            .status()
            .message() == "forward: greedy rows do not match the batch");

  // Score edits (logit_bias, penalties, a min_tokens mask) are applied to a wanted row before
  // its argmax or draw: a +100 bias makes row 0's argmax the biased token, and row 1's draw is
  // DrawRow's over its edited logits.
  draws[1].top_logprobs = -1;
  const std::vector<ScoreEdit> edits = {
      {.token_id = 3, .flags = kEditBias, .bias = 100.0f},
      {.token_id = 1, .flags = kEditBias, .bias = 100.0f},
      {.token_id = 2, .flags = kEditBias, .bias = 99.0f}};
  const std::vector<int32_t> edit_begin = {0, 1, 3};
  GreedyRows edited{both, argmax, draws, {}, edits, edit_begin};
  logits = (*cpu)->Forward(batch, **cache, LogitsMode::kLastToken, nullptr, &edited);
  REQUIRE(logits.ok());
  CHECK(argmax[0] == 3);
  CHECK((*logits)[3] > 90.0f);  // the returned row is the edited one
  CHECK(argmax[1] == DrawRow(logits->subspan(vocab, vocab), draws[1]));
  CHECK((argmax[1] == 1 || argmax[1] == 2));  // what the biases left in play
  GreedyRows edits_unwanted{wanted, argmax, draws, {}, edits, edit_begin};
  CHECK((*cpu)->Forward(batch, **cache, LogitsMode::kLastToken, nullptr, &edits_unwanted)
            .status()
            .message() == "forward: score edits for a row that is not wanted");
  draws[1].top_logprobs = 2;
  GreedyRows edits_logprobs{both, argmax, draws, logprobs, edits, edit_begin};
  CHECK((*cpu)->Forward(batch, **cache, LogitsMode::kLastToken, nullptr, &edits_logprobs)
            .status()
            .message() == "forward: score edits for a row that wants logprobs (of the unedited "
                          "logits: sample it on the host)");
  const std::vector<ScoreEdit> outside = {{.token_id = static_cast<int32_t>(vocab)}};
  const std::vector<int32_t> one_edit = {0, 1, 1};
  GreedyRows edit_outside{both, argmax, {}, {}, outside, one_edit};
  CHECK((*cpu)->Forward(batch, **cache, LogitsMode::kLastToken, nullptr, &edit_outside)
            .status()
            .message() == "score edit for token " + std::to_string(vocab) +
                              " outside the vocabulary of " + std::to_string(vocab));

  std::vector<int32_t> short_argmax(1);
  GreedyRows bad{wanted, short_argmax, {}, {}};
  CHECK((*cpu)->Forward(batch, **cache, LogitsMode::kLastToken, nullptr, &bad).status().message() ==
        "forward: greedy rows do not match the batch");
  CHECK((*cpu)->Forward(batch, **cache, LogitsMode::kAllTokens, nullptr, &greedy)
            .status()
            .code() == StatusCode::kInvalidArgument);
}

TEST_CASE("kv cache: a pool in device memory is never touched by the host", "[device_batch]") {
  // An address the host must not dereference: nothing is mapped at a page of 0xdead0000.
  const KvLayout layout{2, 2, 8, 4};
  KvPoolMemory memory;
  memory.base = reinterpret_cast<std::byte*>(uintptr_t{0xdead0000});
  memory.bytes = KvPoolBytes(layout, 3);
  memory.kind = KvMemoryKind::kCudaDevice;
  StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(layout, 3, memory);  // no memset
  REQUIRE(cache.ok());
  CHECK((*cache)->memory_kind() == KvMemoryKind::kCudaDevice);
  // Addresses are computed as on the host (a transfer's ranges), never read.
  CHECK(reinterpret_cast<uintptr_t>((*cache)->BlockData(1, 2)) ==
        0xdead0000 + (3 + 2) * layout.block_bytes());
  const std::vector<int32_t> table = {0, 1};
  std::vector<std::byte> buffer(ExportedKvBytes(layout, 2));
  CHECK(ExportBlocks(**cache, table, buffer).code() == StatusCode::kFailedPrecondition);
  CHECK(ImportBlocks(**cache, table, buffer).code() == StatusCode::kFailedPrecondition);

  // The CPU pass refuses it with a message instead of reading device memory.
  test::TempDir dir;
  StatusOr<std::unique_ptr<Model>> model = TinyModel(dir);
  REQUIRE(model.ok());
  StatusOr<std::unique_ptr<CpuForward>> cpu = CpuForward::Create(**model, {});
  REQUIRE(cpu.ok());
  StatusOr<std::unique_ptr<KvCache>> device_pool =
      KvCache::Create((*cpu)->MakeKvLayout(4), 3, [&] {
        KvPoolMemory m = memory;
        m.bytes = KvPoolBytes((*cpu)->MakeKvLayout(4), 3);
        return m;
      }());
  REQUIRE(device_pool.ok());
  const std::vector<int32_t> tokens = {1};
  const std::vector<int32_t> one_block = {0};
  const std::vector<SequenceInput> batch = {{tokens, 0, one_block}};
  StatusOr<std::span<const float>> logits = (*cpu)->Forward(batch, **device_pool);
  REQUIRE_FALSE(logits.ok());
  CHECK(logits.status().message() == "forward (cpu): the KV pool is in device memory");
}

}  // namespace
}  // namespace tandem
