// BatchEngine with layer-wise KV arrival (a pulled request joins the batch while its KV still
// lands layer by layer; a thread stands in for the transport), and prefix sharing in both
// engines (decode/batch_engine.h, prefill/prefill_engine.h), against a reference forward.
#include "decode/batch_engine.h"
#include "prefill/prefill_engine.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/engine/forward.h"
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

// ---- Prefix sharing: the n choices of one prompt compute and hold its KV once ----------------

std::vector<int32_t> SharedPrompt() {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(2 + (i * 29) % 250);  // 2 full blocks + 8
  return prompt;
}

TEST_CASE("requests with one prompt compute its KV once and decode as if alone",
          "[batch_engine]") {
  test::TempDir dir;
  auto model = TinyModel(dir);
  const std::vector<int32_t> prompt = SharedPrompt();
  Reference ref = Prefill(*model, prompt, 6);
  MetricsRegistry metrics;
  BatchEngineOptions eo;
  eo.kv_blocks = 16;
  eo.block_size = 16;
  eo.max_batch_size = 4;
  eo.token_budget = 256;
  eo.max_model_len = 256;
  eo.metrics = &metrics;
  auto engine = std::move(BatchEngine::Create(*model, eo)).value();
  for (const char* id : {"a", "b", "c"}) engine->AddNew(id, prompt, Greedy(6));
  Sink sink;
  // Step 1: only the first computes the prompt; the others wait to share it.
  REQUIRE(engine->Step(sink));
  CHECK(sink.tokens["a"].size() == 1);
  CHECK(sink.tokens.count("b") == 0);
  CHECK(engine->Stats().waiting == 2);
  // Step 2: they take its two full blocks and compute only the last 8 tokens.
  REQUIRE(engine->Step(sink));
  CHECK(sink.tokens["b"].size() == 1);
  CHECK(sink.tokens["c"].size() == 1);
  CHECK(engine->Stats().free_blocks == 16 - 3 - 1 - 1);
  const Counter& shared = metrics.AddCounter("tandem_prefix_shared_tokens_total", "").Get();
  CHECK(shared.Value() == 2 * 32);
  for (int i = 0; i < 20 && sink.finishes.size() < 3; ++i) engine->Step(sink);
  for (const char* id : {"a", "b", "c"}) {
    INFO(id);
    CHECK(sink.tokens[id] == ref.tokens);
  }
  CHECK(engine->Stats().free_blocks == 16);
  // The prompt's two full blocks stay cached: a later request with that prompt takes them.
  CHECK(engine->cache().blocks().num_cached() == 2);
  engine->AddNew("d", prompt, Greedy(6));
  for (int i = 0; i < 20 && sink.finishes.size() < 4; ++i) engine->Step(sink);
  CHECK(sink.tokens["d"] == ref.tokens);
  CHECK(shared.Value() == 3 * 32);
}

TEST_CASE("without prefix caching a prompt is shared only while its requests run",
          "[batch_engine]") {
  test::TempDir dir;
  auto model = TinyModel(dir);
  const std::vector<int32_t> prompt = SharedPrompt();
  MetricsRegistry metrics;
  BatchEngineOptions eo;
  eo.kv_blocks = 16;
  eo.max_model_len = 256;
  eo.metrics = &metrics;
  eo.prefix_caching = false;  // kv_cache.prefix_caching
  auto engine = std::move(BatchEngine::Create(*model, eo)).value();
  const Counter& shared = metrics.AddCounter("tandem_prefix_shared_tokens_total", "").Get();
  Sink sink;
  engine->AddNew("a", prompt, Greedy(4));
  engine->AddNew("b", prompt, Greedy(4));
  for (int i = 0; i < 20 && sink.finishes.size() < 2; ++i) engine->Step(sink);
  CHECK(shared.Value() == 32);  // b took a's blocks while both ran
  CHECK(engine->cache().blocks().num_cached() == 0);
  CHECK(engine->cache().blocks().num_published() == 0);
  engine->AddNew("c", prompt, Greedy(4));
  for (int i = 0; i < 20 && sink.finishes.size() < 3; ++i) engine->Step(sink);
  CHECK(shared.Value() == 32);  // nothing was kept for c
  CHECK(sink.tokens["c"] == sink.tokens["a"]);
  CHECK(engine->Stats().free_blocks == 16);
}

TEST_CASE("pulled requests with one prompt keep one copy of its KV", "[batch_engine]") {
  test::TempDir dir;
  auto model = TinyModel(dir);
  const std::vector<int32_t> prompt = SharedPrompt();
  Reference ref = Prefill(*model, prompt, 5);
  auto engine = MakeEngine(*model);
  for (const char* id : {"x", "y"}) {
    std::vector<int32_t> blocks;
    REQUIRE(engine->cache().blocks().Allocate(3, &blocks).ok());
    for (int l = 0; l < model->config().num_layers; ++l)
      for (size_t k = 0; k < blocks.size(); ++k)
        std::memcpy(engine->cache().BlockData(l, blocks[k]), ref.cache->BlockData(l, ref.table[k]),
                    engine->cache().block_bytes());
    engine->AddPulled(id, prompt, ref.tokens[0], Greedy(5), blocks);
  }
  CHECK(engine->Stats().free_blocks == 16 - 6);
  Sink sink;
  REQUIRE(engine->Step(sink));
  // After their first step, y holds x's two full blocks instead of its own.
  CHECK(engine->Stats().free_blocks == 16 - 3 - 1);
  for (int i = 0; i < 20 && sink.finishes.size() < 2; ++i) engine->Step(sink);
  for (const char* id : {"x", "y"}) {
    INFO(id);
    CHECK(sink.tokens[id] == std::vector<int32_t>(ref.tokens.begin() + 1, ref.tokens.end()));
  }
  CHECK(engine->Stats().free_blocks == 16);
}

TEST_CASE("a small pool with a cached prefix preempts and finishes every request",
          "[batch_engine]") {
  // Six blocks; b and c grow to five each, so they preempt each other; c's prompt is a's, whose
  // two full blocks are cached when c arrives. A waiting request must never hold blocks that the
  // running ones need (it did, once: c took the cached blocks while waiting, b was preempted for
  // them, c was not admitted and gave them back, and so on forever).
  test::TempDir dir;
  auto model = TinyModel(dir);
  const std::vector<int32_t> prompt = SharedPrompt();
  std::vector<int32_t> other(prompt.rbegin(), prompt.rend());
  Reference ref_a = Prefill(*model, prompt, 40);
  Reference ref_b = Prefill(*model, other, 40);
  BatchEngineOptions eo;
  eo.kv_blocks = 6;
  eo.max_batch_size = 4;
  eo.token_budget = 256;
  eo.max_model_len = 128;
  auto engine = std::move(BatchEngine::Create(*model, eo)).value();
  Sink sink;
  engine->AddNew("a", prompt, Greedy(2));
  for (int i = 0; i < 10 && sink.finishes.size() < 1; ++i) engine->Step(sink);
  REQUIRE(engine->cache().blocks().num_cached() == 2);
  engine->AddNew("b", other, Greedy(40));
  engine->AddNew("c", prompt, Greedy(40));
  for (int i = 0; i < 1000 && sink.finishes.size() < 3; ++i) engine->Step(sink);
  REQUIRE(sink.finishes.size() == 3);
  CHECK(sink.tokens["b"] == ref_b.tokens);
  CHECK(sink.tokens["c"] == ref_a.tokens);
  CHECK(engine->Stats().free_blocks == 6);
}

TEST_CASE("shared prefixes under pressure: every request finishes as alone, every block comes back",
          "[batch_engine]") {
  // Seeded random traffic over a small pool: prompts drawn from a few prefixes (some a whole
  // number of blocks long) plus random tails, arrivals between steps, cancels, both policies.
  // Whatever is shared, cached, evicted or preempted, each request's tokens are those of an
  // engine that runs it alone, and the pool is whole at the end.
  test::TempDir dir;
  auto model = TinyModel(dir);
  for (StepPolicy policy : {StepPolicy::kChunked, StepPolicy::kPrefillFirst}) {
    INFO("policy " << (policy == StepPolicy::kChunked ? "chunked" : "prefill_first"));
    std::mt19937 rng(policy == StepPolicy::kChunked ? 5 : 6);
    std::vector<std::vector<int32_t>> prefixes;
    for (int len : {16, 32, 21}) {
      std::vector<int32_t> p;
      for (int i = 0; i < len; ++i) p.push_back(1 + static_cast<int32_t>(rng() % 250));
      prefixes.push_back(p);
    }
    BatchEngineOptions eo;
    eo.kv_blocks = 10;
    eo.max_batch_size = 4;
    eo.token_budget = 48;
    eo.max_model_len = 128;
    eo.policy = policy;
    MetricsRegistry metrics;
    eo.metrics = &metrics;
    auto engine = std::move(BatchEngine::Create(*model, eo)).value();
    BatchEngineOptions alone_options = eo;
    alone_options.kv_blocks = 16;
    alone_options.prefix_caching = false;
    alone_options.metrics = nullptr;
    Sink sink;
    std::map<std::string, std::pair<std::vector<int32_t>, int>> requests;
    std::set<std::string> cancelled;
    int next = 0;
    for (int step = 0; step < 400 && (next < 14 || !engine->idle()); ++step) {
      if (next < 14 && rng() % 3 != 0) {
        std::vector<int32_t> prompt = prefixes[rng() % prefixes.size()];
        const int tail = static_cast<int>(rng() % 12);
        for (int i = 0; i < tail; ++i) prompt.push_back(1 + static_cast<int32_t>(rng() % 250));
        const int max_tokens = 8 + static_cast<int>(rng() % 32);
        const std::string id = "r" + std::to_string(next++);
        requests[id] = {prompt, max_tokens};
        engine->AddNew(id, prompt, Greedy(max_tokens));
      }
      if (rng() % 25 == 0 && !requests.empty()) {
        const std::string id = "r" + std::to_string(rng() % static_cast<unsigned>(next));
        if (!sink.finishes.count(id) && engine->Cancel(id)) cancelled.insert(id);
      }
      engine->Step(sink);
    }
    REQUIRE(engine->idle());
    CHECK(engine->Stats().free_blocks == 10);
    // The traffic did what it is for: prefixes were shared and the pool ran out.
    const double shared = metrics.AddCounter("tandem_prefix_shared_tokens_total", "").Get().Value();
    const double preempted = metrics.AddCounter("tandem_preemptions_total", "").Get().Value();
    INFO("shared " << shared << " tokens, " << preempted << " preemptions");
    CHECK(shared >= 16 * 4);
    CHECK(preempted >= 1);
    for (const auto& [id, request] : requests) {
      if (cancelled.count(id)) continue;
      INFO(id << ", prompt of " << request.first.size());
      REQUIRE(sink.finishes.count(id));
      auto alone = std::move(BatchEngine::Create(*model, alone_options)).value();
      Sink alone_sink;
      alone->AddNew(id, request.first, Greedy(request.second));
      for (int i = 0; i < 200 && !alone->idle(); ++i) alone->Step(alone_sink);
      CHECK(sink.tokens[id] == alone_sink.tokens[id]);
    }
  }
}

struct Collect : PrefillObserver {
  std::vector<Prefilled> done;
  bool BeforeLastChunk(PrefillRequest&) override { return false; }
  void OnLayerComputed(int) override {}
  void OnPrefilled(Prefilled p) override { done.push_back(std::move(p)); }
};

TEST_CASE("prefill computes a prompt shared by several requests once", "[batch_engine]") {
  test::TempDir dir;
  auto model = TinyModel(dir);
  const std::vector<int32_t> prompt = SharedPrompt();
  Reference ref = Prefill(*model, prompt, 1);
  PrefillEngineOptions po;
  po.kv_blocks = 16;
  po.block_size = 16;
  po.max_model_len = 256;
  po.token_budget = 256;
  auto engine = std::move(PrefillEngine::Create(*model, po)).value();
  // "u" has another prompt: it waits behind the choices (FCFS) but shares nothing.
  std::vector<int32_t> other(prompt.rbegin(), prompt.rend());
  for (const char* id : {"a", "b", "c"}) engine->Add(id, prompt, Greedy(4));
  engine->Add("u", other, Greedy(4));
  Collect observer;
  REQUIRE(engine->Step(observer));
  REQUIRE(observer.done.size() == 1);  // a alone: b and c wait for its blocks
  REQUIRE(engine->Step(observer));
  REQUIRE(observer.done.size() == 4);
  const std::vector<int32_t>& lead = observer.done[0].request.blocks;
  for (int i = 1; i < 3; ++i) {
    const PrefillRequest& r = observer.done[i].request;
    INFO(r.id);
    CHECK(observer.done[i].first.token_id == ref.tokens[0]);
    CHECK(observer.done[i].first.logprob == Approx(observer.done[0].first.logprob).margin(1e-4));
    REQUIRE(r.blocks.size() == 3);
    CHECK(r.blocks[0] == lead[0]);
    CHECK(r.blocks[1] == lead[1]);
    CHECK(r.blocks[2] != lead[2]);
  }
  CHECK(observer.done[0].first.token_id == ref.tokens[0]);
  CHECK(engine->free_blocks() == 16 - 3 - 1 - 1 - 3);
  for (const Prefilled& p : observer.done) engine->FreeBlocks(p.request.blocks);
  CHECK(engine->free_blocks() == 16);
}

}  // namespace
}  // namespace tandem
