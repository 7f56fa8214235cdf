// The engines on a backend that picks rows where the logits are (ForwardBackend::draws_rows, as
// the CUDA backend does), so that their hand-over runs here: draws, score edits and their
// offsets, the drawn logprobs, the rows left to the host. The backend is the CPU one saying
// that it draws (it does, with DrawRow and ApplyScoreEdits, as the CUDA kernels do on a GPU).
// Every request must stream the tokens and logprobs the same engine gives on the plain CPU
// backend, where the host Sampler picks every row.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/engine/forward.h"
#include "common/model/make_model.h"
#include "decode/batch_engine.h"
#include "prefill/prefill_engine.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

// What the engines handed the backend, over every pass.
struct HandedRows {
  int drawn = 0;        // rows drawn by the backend
  int edited = 0;       // rows with score edits
  int argmax = 0;       // wanted rows taken as their argmax
  int host = 0;         // rows left to the host Sampler (not wanted)
};

class RowPickingCpu final : public ForwardBackend {
 public:
  RowPickingCpu(std::unique_ptr<ForwardBackend> cpu, bool picks_rows, HandedRows* handed)
      : cpu_(std::move(cpu)), picks_rows_(picks_rows), handed_(handed) {}

  KvLayout MakeKvLayout(int block_size) const override { return cpu_->MakeKvLayout(block_size); }
  StatusOr<KvPoolMemory> AllocateKvPool(size_t bytes) override {
    return cpu_->AllocateKvPool(bytes);
  }
  StatusOr<KvPoolMemory> AdoptKvPools(std::vector<KvPoolMemory> pools) override {
    return cpu_->AdoptKvPools(std::move(pools));
  }
  StatusOr<std::span<const float>> Forward(std::span<const SequenceInput> batch, KvCache& cache,
                                           LogitsMode mode, const ForwardHooks* hooks,
                                           GreedyRows* greedy) override {
    for (size_t i = 0; greedy != nullptr && i < batch.size(); ++i) {
      handed_->host += !greedy->wanted[i];
      if (!greedy->wanted[i]) continue;
      handed_->drawn += greedy->drawn(i);
      handed_->argmax += !greedy->drawn(i);
      handed_->edited += !greedy->edits_of(i).empty();
    }
    return cpu_->Forward(batch, cache, mode, hooks, greedy);
  }
  const Model& model() const override { return cpu_->model(); }
  bool draws_rows() const override { return picks_rows_; }
  std::string description() const override { return "cpu (picks rows: a test's)"; }

 private:
  std::unique_ptr<ForwardBackend> cpu_;
  bool picks_rows_;
  HandedRows* handed_;
};

ForwardBackendFactory Factory(bool picks_rows, HandedRows* handed) {
  return [picks_rows, handed](const Model& model, const ForwardOptions& options)
             -> StatusOr<std::unique_ptr<ForwardBackend>> {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<ForwardBackend> cpu,
                            CreateForwardBackend(model, options, "cpu"));
    return std::unique_ptr<ForwardBackend>(
        std::make_unique<RowPickingCpu>(std::move(cpu), picks_rows, handed));
  };
}

// Requests of every kind a row can be: plain greedy and draws, edits (penalties, logit_bias, a
// min_tokens mask) under greedy and draws, drawn logprobs (greedy too), and the rows that stay on
// the host (logprobs with edits, processed logprobs).
std::vector<SamplingParams> RequestMix() {
  std::vector<SamplingParams> mix(10);
  for (size_t i = 0; i < mix.size(); ++i) {
    mix[i].max_tokens = 10;
    mix[i].ignore_eos = true;
    mix[i].seed = 40 + i;
    mix[i].temperature = 0.9f;
  }
  mix[0].temperature = 0.0f;
  mix[1].temperature = 0.0f;
  mix[1].repetition_penalty = 1.6f;
  mix[2].top_p = 0.9f;
  mix[3].top_k = 5;
  mix[3].presence_penalty = 0.8f;
  mix[3].frequency_penalty = 0.5f;
  mix[4].logit_bias = {{7, 4.0f}, {9, -100.0f}};
  mix[4].min_p = 0.05f;
  mix[5].min_tokens = 4;
  mix[5].stop_token_ids = {3, 5};
  mix[6].logprobs = true;
  mix[6].top_logprobs = 3;
  mix[7].repetition_penalty = 1.2f;  // edits and logprobs: the host's
  mix[7].logprobs = true;
  mix[7].top_logprobs = 2;
  mix[8].logprobs = true;  // processed logprobs: the host's
  mix[8].logprobs_mode = LogprobsMode::kProcessed;
  mix[9].temperature = 0.0f;  // greedy with logprobs: the argmax, drawn for its logprobs
  mix[9].logprobs = true;
  mix[9].top_logprobs = 2;
  return mix;
}

std::vector<int32_t> PromptFor(size_t i) {
  std::vector<int32_t> prompt;
  for (int32_t t = 0; t < 12 + static_cast<int32_t>(i); ++t) prompt.push_back((t * 7 + 3 * i) % 50);
  return prompt;
}

struct Streams : EngineSink {
  std::map<std::string, std::vector<GeneratedToken>> tokens;
  int finished = 0;
  void OnTokens(Tokens t) override {
    for (GeneratedToken& g : t.tokens) tokens[t.request_id].push_back(std::move(g));
  }
  void OnFinish(Finish) override { ++finished; }
};

struct Firsts : PrefillObserver {
  std::map<std::string, GeneratedToken> first;
  bool BeforeLastChunk(PrefillRequest&) override { return false; }
  void OnLayerComputed(int) override {}
  void OnPrefilled(Prefilled p) override { first[p.request.id] = p.first; }
};

void CheckSameToken(const GeneratedToken& a, const GeneratedToken& b) {
  CHECK(a.token_id == b.token_id);
  CHECK(a.logprob == Approx(b.logprob).margin(1e-5));
  REQUIRE(a.top_logprobs.size() == b.top_logprobs.size());
  for (size_t j = 0; j < a.top_logprobs.size(); ++j) {
    CHECK(a.top_logprobs[j].token_id == b.top_logprobs[j].token_id);
    CHECK(a.top_logprobs[j].logprob == Approx(b.top_logprobs[j].logprob).margin(1e-5));
  }
}

std::unique_ptr<Model> SmallModel(const test::TempDir& dir) {
  MakeModelOptions options;
  options.with_tokenizer = false;
  const std::string path = (dir.path() / "m").string();
  REQUIRE(MakeModel(options, path).ok());
  return std::move(Model::Load(path)).value();
}

TEST_CASE("decode on a backend that picks rows streams the host Sampler's tokens",
          "[backend_rows]") {
  test::TempDir dir;
  auto model = SmallModel(dir);
  const std::vector<SamplingParams> mix = RequestMix();
  std::map<bool, Streams> streams;
  std::map<bool, HandedRows> handed;
  for (bool picks_rows : {false, true}) {
    BatchEngineOptions eo;
    eo.kv_blocks = 64;
    eo.block_size = 16;
    eo.max_batch_size = 16;
    eo.token_budget = 16;  // prompts of 12-21 tokens run in chunks: not-last chunks are rows too
    eo.max_model_len = 256;
    eo.make_backend = Factory(picks_rows, &handed[picks_rows]);
    eo.threads = 2;  // the host rows sample on two threads
    auto engine = std::move(BatchEngine::Create(*model, eo)).value();
    for (size_t i = 0; i < mix.size(); ++i)
      engine->AddNew("r" + std::to_string(i), PromptFor(i), mix[i]);
    Streams& out = streams[picks_rows];
    for (int step = 0; step < 100 && out.finished < static_cast<int>(mix.size()); ++step)
      engine->Step(out);
    REQUIRE(out.finished == static_cast<int>(mix.size()));
  }
  for (size_t i = 0; i < mix.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    INFO(id);
    const std::vector<GeneratedToken>& host = streams[false].tokens[id];
    const std::vector<GeneratedToken>& picked = streams[true].tokens[id];
    REQUIRE(host.size() == picked.size());
    for (size_t t = 0; t < host.size(); ++t) CheckSameToken(picked[t], host[t]);
  }
  // The plain CPU backend is handed argmax rows only; the row-picking one every kind.
  CHECK(handed[false].drawn == 0);
  CHECK(handed[false].edited == 0);
  CHECK(handed[true].drawn > 40);   // rows 2-6 and 9, 10 tokens each (row 5 may stop early)
  CHECK(handed[true].edited > 25);  // rows 1, 3, 4 and row 5's first tokens
  CHECK(handed[true].host == 20);   // rows 7 and 8, every token
}

TEST_CASE("prefill on a backend that picks rows gives the host Sampler's first tokens",
          "[backend_rows]") {
  test::TempDir dir;
  auto model = SmallModel(dir);
  const std::vector<SamplingParams> mix = RequestMix();
  std::map<bool, Firsts> firsts;
  HandedRows handed;
  for (bool picks_rows : {false, true}) {
    PrefillEngineOptions po;
    po.kv_blocks = 64;
    po.block_size = 16;
    po.max_model_len = 256;
    po.token_budget = 16;
    po.make_backend = Factory(picks_rows, &handed);
    po.threads = 2;
    auto engine = std::move(PrefillEngine::Create(*model, po)).value();
    for (size_t i = 0; i < mix.size(); ++i)
      engine->Add("r" + std::to_string(i), PromptFor(i), mix[i]);
    Firsts& out = firsts[picks_rows];
    for (int step = 0; step < 40 && out.first.size() < mix.size(); ++step) engine->Step(out);
    REQUIRE(out.first.size() == mix.size());
  }
  for (size_t i = 0; i < mix.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    INFO(id);
    CheckSameToken(firsts[true].first[id], firsts[false].first[id]);
  }
  CHECK(handed.drawn == 6);   // rows 2-6 and 9
  CHECK(handed.edited == 3);  // rows 1, 4, 5 (row 3's penalties need output tokens)
}

}  // namespace
}  // namespace tandem
