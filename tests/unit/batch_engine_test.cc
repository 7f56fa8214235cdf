// BatchEngine with layer-wise KV arrival: a pulled request joins the batch while its KV still
// lands layer by layer (a thread stands in for the transport), against a reference forward.
#include "decode/batch_engine.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "common/model/make_model.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

struct Sink : EngineSink {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, Finish> finishes;
  void OnTokens(Tokens t) override {
    for (const GeneratedToken& r : t.tokens) tokens[t.request_id].push_back(r.token_id);
  }
  void OnFinish(Finish f) override { finishes[f.request_id] = f; }
};

std::unique_ptr<Model> TinyModel(const test::TempDir& dir) {
  MakeModelOptions options;
  options.family = ModelFamily::kLlama;
  options.seed = 11;
  options.with_tokenizer = false;
  std::string path = (dir.path() / "llama").string();
  REQUIRE(MakeModel(options, path).ok());
  auto model = Model::Load(path);
  REQUIRE(model.ok());
  return std::move(*model);
}

int32_t Argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// The prompt's KV (as a prefill instance has it) and the greedy tokens that follow.
struct Reference {
  std::unique_ptr<CpuForward> forward;
  std::unique_ptr<KvCache> cache;
  std::vector<int32_t> table;
  std::vector<int32_t> tokens;  // first token, then what decode must produce
};

Reference Prefill(const Model& model, const std::vector<int32_t>& prompt, int max_tokens) {
  Reference ref;
  ref.forward = std::move(CpuForward::Create(model, ForwardOptions{})).value();
  ref.cache = std::move(KvCache::Create(ref.forward->MakeKvLayout(16), 16)).value();
  REQUIRE(ref.cache->blocks().Allocate(8, &ref.table).ok());
  SequenceInput seq{prompt, 0, ref.table};
  auto logits = ref.forward->Forward({&seq, 1}, *ref.cache);
  REQUIRE(logits.ok());
  ref.tokens.push_back(Argmax(*logits));
  // Decode from a copy of the cache, so that the prompt's KV stays as prefill left it.
  auto scratch = std::move(KvCache::Create(ref.forward->MakeKvLayout(16), 16)).value();
  std::memcpy(scratch->data(), ref.cache->data(), ref.cache->total_bytes());
  for (int i = 1; i < max_tokens; ++i) {
    int32_t token = ref.tokens.back();
    SequenceInput step{{&token, 1}, static_cast<int32_t>(prompt.size()) + i - 1, ref.table};
    auto out = ref.forward->Forward({&step, 1}, *scratch);
    REQUIRE(out.ok());
    ref.tokens.push_back(Argmax(*out));
  }
  return ref;
}

std::unique_ptr<BatchEngine> MakeEngine(const Model& model) {
  BatchEngineOptions eo;
  eo.kv_blocks = 16;
  eo.block_size = 16;
  eo.max_batch_size = 4;
  eo.token_budget = 256;
  eo.max_model_len = 256;
  eo.kv_wait_timeout = 5000ms;
  return std::move(BatchEngine::Create(model, eo)).value();
}

SamplingParams Greedy(int max_tokens) {
  SamplingParams s;
  s.temperature = 0;
  s.max_tokens = max_tokens;
  s.ignore_eos = true;
  s.seed = 1;
  return s;
}

// Copies layers [0, layers) of the prompt's blocks into the engine's pool, one at a time with a
// pause, reporting each; then ends the pull with `end`.
std::thread Transport(const Reference& ref, KvCache& cache, std::vector<int32_t> blocks,
                      std::shared_ptr<KvArrival> arrival, int layers, Status end) {
  return std::thread([&ref, &cache, blocks, arrival, layers, end] {
    for (int l = 0; l < layers; ++l) {
      std::this_thread::sleep_for(20ms);
      for (size_t k = 0; k < blocks.size(); ++k)
        std::memcpy(cache.BlockData(l, blocks[k]), ref.cache->BlockData(l, ref.table[k]),
                    cache.block_bytes());
      arrival->LayerLanded(static_cast<uint32_t>(l));
    }
    arrival->Done(end);
  });
}

TEST_CASE("a request whose KV is still arriving decodes the same tokens", "[batch_engine]") {
  test::TempDir dir;
  auto model = TinyModel(dir);
  const int layers = model->config().num_layers;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(1 + (i * 37) % 250);
  const int max_tokens = 6;
  Reference ref = Prefill(*model, prompt, max_tokens);

  auto engine = MakeEngine(*model);
  std::vector<int32_t> blocks;
  REQUIRE(engine->cache().blocks().Allocate(3, &blocks).ok());  // 40 tokens: 3 blocks
  auto arrival = std::make_shared<KvArrival>(layers);
  engine->AddPulled("r", prompt, ref.tokens[0], Greedy(max_tokens), blocks, arrival);
  std::thread transport = Transport(ref, engine->cache(), blocks, arrival, layers, Status());
  Sink sink;
  for (int i = 0; i < 50 && !sink.finishes.count("r"); ++i) engine->Step(sink);
  transport.join();
  REQUIRE(sink.finishes.count("r"));
  CHECK(sink.finishes["r"].code == StatusCode::kOk);
  CHECK(sink.tokens["r"] == std::vector<int32_t>(ref.tokens.begin() + 1, ref.tokens.end()));
  CHECK(engine->Stats().free_blocks == 16);
}

TEST_CASE("decode steps report their batch and context beside their time", "[batch_engine]") {
  test::TempDir dir;
  auto model = TinyModel(dir);
  auto engine = MakeEngine(*model);
  CHECK(engine->Stats().decode_step_batch == 0);  // nothing measured yet
  std::vector<int32_t> a, b;
  REQUIRE(engine->cache().blocks().Allocate(3, &a).ok());
  REQUIRE(engine->cache().blocks().Allocate(2, &b).ok());
  // The KV content does not matter here: only the step's shape is checked.
  engine->AddPulled("a", std::vector<int32_t>(40, 3), 5, Greedy(8), a);
  engine->AddPulled("b", std::vector<int32_t>(20, 3), 5, Greedy(8), b);
  Sink sink;
  REQUIRE(engine->Step(sink));
  EngineStats s = engine->Stats();
  CHECK(s.decode_step_seconds > 0);
  CHECK(s.decode_forward_seconds > 0);  // the forward pass alone: a part of the step
  CHECK(s.decode_forward_seconds <= s.decode_step_seconds);
  CHECK(s.decode_step_batch == 2);
  CHECK(s.decode_step_context_tokens == 41 + 21);  // prompt + first token each, before the step
  REQUIRE(engine->Step(sink));
  s = engine->Stats();
  CHECK(s.decode_step_batch == 2);
  CHECK(s.decode_step_context_tokens == Approx(0.8 * 62 + 0.2 * 64));  // the moving average
  CHECK(s.prefill_seconds_per_token == 0);  // no prompt work in these steps
}

TEST_CASE("a pull that fails mid-step discards the request's output", "[batch_engine]") {
  test::TempDir dir;
  auto model = TinyModel(dir);
  const int layers = model->config().num_layers;
  REQUIRE(layers >= 2);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back(3 + (i * 11) % 250);
  Reference ref = Prefill(*model, prompt, 4);

  auto engine = MakeEngine(*model);
  std::vector<int32_t> blocks;
  REQUIRE(engine->cache().blocks().Allocate(2, &blocks).ok());
  auto arrival = std::make_shared<KvArrival>(layers);
  engine->AddPulled("f", prompt, ref.tokens[0], Greedy(4), blocks, arrival);
  // Layer 0 lands, then the pull fails: the step runs to its end without that request's token.
  std::thread transport =
      Transport(ref, engine->cache(), blocks, arrival, 1, Unavailable("publisher died"));
  Sink sink;
  CHECK(engine->Step(sink));
  transport.join();
  CHECK(sink.tokens["f"].empty());
  CHECK(sink.finishes.empty());
  // The server fails it once the pull's on_done ran: the blocks are free again.
  CHECK(arrival->ended());
  CHECK(engine->Cancel("f"));
  CHECK(engine->Stats().free_blocks == 16);

  // Remove hands the blocks back instead of freeing them (a cancel while the KV arrives).
  std::vector<int32_t> more;
  REQUIRE(engine->cache().blocks().Allocate(2, &more).ok());
  auto pending = std::make_shared<KvArrival>(layers);
  engine->AddPulled("g", prompt, ref.tokens[0], Greedy(4), more, pending);
  std::vector<int32_t> back;
  CHECK(engine->Remove("g", &back));
  CHECK(back == more);
  CHECK(engine->idle());
  engine->cache().blocks().Free(back);
  CHECK(engine->Stats().free_blocks == 16);
}

}  // namespace
}  // namespace tandem
