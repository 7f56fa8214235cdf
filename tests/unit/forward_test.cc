#include "common/engine/forward.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <memory>
#include <vector>

#include "common/model/make_model.h"
#include "tests/unit/test_util.h"

// Counts operator new calls so a test can show the decode step allocates nothing once warm.
namespace {
std::atomic<long> g_allocations{0};
}  // namespace

// GCC cannot see that these new and delete are a matched pair (both malloc-based).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace tandem {
namespace {

// A tiny checkpoint written in-process (no tokenizer: faster) into a temp dir.
std::unique_ptr<Model> TinyModel(const test::TempDir& dir, ModelFamily family) {
  MakeModelOptions options;
  options.family = family;
  options.seed = 11;
  options.with_tokenizer = false;
  std::string path = (dir.path() / ModelFamilyName(family)).string();
  REQUIRE(MakeModel(options, path).ok());
  auto model = Model::Load(path);
  REQUIRE(model.ok());
  return std::move(*model);
}

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (seed * 7919 + i * 104729) % 2000;
  return ids;
}

int32_t Argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

float RelErr(std::span<const float> a, std::span<const float> b) {
  float diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

// One sequence alone: prefill the prompt, then `steps` greedy decode steps. Returns the logits
// of the prompt's last position and of each decode step.
std::vector<std::vector<float>> RunAlone(const Model& model, std::span<const int32_t> prompt,
                                         int steps, int threads = 1) {
  ForwardOptions options;
  options.num_threads = threads;
  auto engine = CpuForward::Create(model, options);
  REQUIRE(engine.ok());
  auto cache = KvCache::Create((*engine)->MakeKvLayout(), 16);
  REQUIRE(cache.ok());
  std::vector<int32_t> table;
  REQUIRE((*cache)->blocks().Allocate(16, &table).ok());
  std::vector<std::vector<float>> rows;
  SequenceInput seq{prompt, 0, table};
  auto out = (*engine)->Forward({&seq, 1}, **cache);
  REQUIRE(out.ok());
  rows.emplace_back(out->begin(), out->end());
  for (int s = 0; s < steps; ++s) {
    int32_t token = Argmax(rows.back());
    SequenceInput step{{&token, 1}, static_cast<int32_t>(prompt.size()) + s, table};
    out = (*engine)->Forward({&step, 1}, **cache);
    REQUIRE(out.ok());
    rows.emplace_back(out->begin(), out->end());
  }
  return rows;
}

TEST_CASE("a mixed batch equals each sequence run alone", "[forward]") {
  test::TempDir dir;
  for (ModelFamily family : {ModelFamily::kLlama, ModelFamily::kQwen2}) {
    auto model = TinyModel(dir, family);
    const int vocab = model->config().vocab_size;
    const int kSteps = 6;
    // Prompts of different lengths; B arrives in chunks of 5, C joins a step late.
    std::vector<std::vector<int32_t>> prompts = {Prompt(20, 1), Prompt(13, 2), Prompt(33, 3)};
    std::vector<std::vector<std::vector<float>>> alone;
    for (auto& p : prompts) alone.push_back(RunAlone(*model, p, kSteps));

    ForwardOptions options;
    options.num_threads = 2;
    auto engine = CpuForward::Create(*model, options);
    REQUIRE(engine.ok());
    auto cache = KvCache::Create((*engine)->MakeKvLayout(), 64);
    REQUIRE(cache.ok());
    struct State {
      std::vector<int32_t> table;
      int fed = 0;  // tokens whose KV is cached
      std::vector<int32_t> generated;
      std::vector<std::vector<float>> rows;
    };
    std::vector<State> states(3);
    for (State& s : states) REQUIRE((*cache)->blocks().Allocate(4, &s.table).ok());
    std::vector<int32_t> step_tokens(3);
    for (int step = 0; step < 40; ++step) {
      std::vector<SequenceInput> batch;
      std::vector<int> who;
      for (int i = 0; i < 3; ++i) {
        State& s = states[i];
        const int plen = static_cast<int>(prompts[i].size());
        if (i == 2 && step == 0) continue;  // C joins late
        if (static_cast<int>(s.generated.size()) > kSteps) continue;
        if (s.fed < plen) {
          int n = i == 1 ? std::min(5, plen - s.fed) : plen - s.fed;
          batch.push_back({std::span<const int32_t>(prompts[i]).subspan(s.fed, n), s.fed, s.table});
          s.fed += n;
        } else {
          step_tokens[i] = s.generated.back();
          batch.push_back({{&step_tokens[i], 1}, s.fed, s.table});
          s.fed += 1;
        }
        who.push_back(i);
      }
      if (batch.empty()) break;
      auto out = (*engine)->Forward(batch, **cache);
      REQUIRE(out.ok());
      for (size_t k = 0; k < who.size(); ++k) {
        State& s = states[who[k]];
        if (s.fed < static_cast<int>(prompts[who[k]].size())) continue;  // mid-prompt chunk
        std::span<const float> row = out->subspan(k * vocab, vocab);
        s.rows.emplace_back(row.begin(), row.end());
        s.generated.push_back(Argmax(row));
      }
    }
    for (int i = 0; i < 3; ++i) {
      REQUIRE(states[i].rows.size() == alone[i].size());
      for (size_t r = 0; r < alone[i].size(); ++r) {
        CHECK(RelErr(states[i].rows[r], alone[i][r]) < 1e-5f);
        CHECK(Argmax(states[i].rows[r]) == Argmax(alone[i][r]));
      }
    }
  }
}

TEST_CASE("threads and all-positions logits do not change results", "[forward]") {
  test::TempDir dir;
  auto model = TinyModel(dir, ModelFamily::kLlama);
  auto prompt = Prompt(40, 5);
  auto one = RunAlone(*model, prompt, 4, 1);
  auto two = RunAlone(*model, prompt, 4, 2);
  for (size_t r = 0; r < one.size(); ++r) CHECK(RelErr(two[r], one[r]) < 1e-5f);

  auto engine = CpuForward::Create(*model, ForwardOptions{});
  REQUIRE(engine.ok());
  auto cache = KvCache::Create((*engine)->MakeKvLayout(8), 8);
  REQUIRE(cache.ok());
  std::vector<int32_t> table;
  REQUIRE((*cache)->blocks().Allocate(8, &table).ok());
  SequenceInput seq{prompt, 0, table};
  auto all = (*engine)->Forward({&seq, 1}, **cache, LogitsMode::kAllTokens);
  REQUIRE(all.ok());
  const int vocab = model->config().vocab_size;
  REQUIRE(all->size() == prompt.size() * vocab);
  CHECK(RelErr(all->subspan((prompt.size() - 1) * vocab), one[0]) < 1e-5f);
}

TEST_CASE("KV exported to another pool continues the same decode", "[forward]") {
  test::TempDir dir;
  auto model = TinyModel(dir, ModelFamily::kQwen2);
  auto prompt = Prompt(37, 9);
  auto engine = CpuForward::Create(*model, ForwardOptions{});
  REQUIRE(engine.ok());
  const KvLayout layout = (*engine)->MakeKvLayout();
  auto prefill_pool = KvCache::Create(layout, 8);
  auto decode_pool = KvCache::Create(layout, 20);
  REQUIRE(prefill_pool.ok());
  REQUIRE(decode_pool.ok());

  // "Prefill instance": the prompt, then hand over its blocks.
  std::vector<int32_t> p_table;
  REQUIRE((*prefill_pool)->blocks().Allocate(3, &p_table).ok());
  SequenceInput seq{prompt, 0, p_table};
  auto out = (*engine)->Forward({&seq, 1}, **prefill_pool);
  REQUIRE(out.ok());
  int32_t first = Argmax(*out);
  std::vector<std::byte> wire(ExportedKvBytes(layout, p_table.size()));
  REQUIRE(ExportBlocks(**prefill_pool, p_table, wire).ok());

  // "Decode instance": other block ids, some blocks already taken.
  std::vector<int32_t> taken, d_table;
  REQUIRE((*decode_pool)->blocks().Allocate(5, &taken).ok());
  REQUIRE((*decode_pool)->blocks().Allocate(3, &d_table).ok());
  REQUIRE(ImportBlocks(**decode_pool, d_table, wire).ok());
  REQUIRE((*decode_pool)->blocks().Allocate(2, &d_table).ok());  // room to grow
  REQUIRE((*prefill_pool)->blocks().Allocate(2, &p_table).ok());

  // Continue on both sides; tokens and logits must be identical.
  int32_t a = first, b = first;
  for (int step = 0; step < 12; ++step) {
    int32_t pos = static_cast<int32_t>(prompt.size()) + step;
    SequenceInput sa{{&a, 1}, pos, p_table};
    auto la = (*engine)->Forward({&sa, 1}, **prefill_pool);
    REQUIRE(la.ok());
    std::vector<float> ra(la->begin(), la->end());
    SequenceInput sb{{&b, 1}, pos, d_table};
    auto lb = (*engine)->Forward({&sb, 1}, **decode_pool);
    REQUIRE(lb.ok());
    CHECK(std::equal(ra.begin(), ra.end(), lb->begin()));
    a = Argmax(ra);
    b = Argmax(*lb);
    CHECK(a == b);
  }
}

TEST_CASE("a warm forward pass allocates nothing", "[forward]") {
  test::TempDir dir;
  auto model = TinyModel(dir, ModelFamily::kQwen2);
  ForwardOptions options;
  options.num_threads = 2;
  auto engine = CpuForward::Create(*model, options);
  REQUIRE(engine.ok());
  auto cache = KvCache::Create((*engine)->MakeKvLayout(), 16);
  REQUIRE(cache.ok());
  std::vector<int32_t> a, b;
  REQUIRE((*cache)->blocks().Allocate(4, &a).ok());
  REQUIRE((*cache)->blocks().Allocate(4, &b).ok());
  auto pa = Prompt(30, 1), pb = Prompt(20, 2);
  std::vector<SequenceInput> batch = {{pa, 0, a}, {pb, 0, b}};
  REQUIRE((*engine)->Forward(batch, **cache).ok());
  int32_t ta = 1, tb = 2;
  long before = g_allocations.load();
  for (int step = 0; step < 10; ++step) {
    batch[0] = SequenceInput{{&ta, 1}, 30 + step, a};
    batch[1] = SequenceInput{{&tb, 1}, 20 + step, b};
    auto out = (*engine)->Forward(batch, **cache);
    REQUIRE(out.ok());
    ta = Argmax(out->first(model->config().vocab_size));
  }
  CHECK(g_allocations.load() == before);
}

TEST_CASE("bad batches are errors and leave the cache alone", "[forward]") {
  test::TempDir dir;
  auto model = TinyModel(dir, ModelFamily::kLlama);
  ForwardOptions options;
  options.max_batch_tokens = 32;
  options.max_batch_sequences = 2;
  auto engine = CpuForward::Create(*model, options);
  REQUIRE(engine.ok());
  auto cache = KvCache::Create((*engine)->MakeKvLayout(), 4);
  REQUIRE(cache.ok());
  std::vector<int32_t> table;
  REQUIRE((*cache)->blocks().Allocate(2, &table).ok());
  auto prompt = Prompt(20, 1);

  SequenceInput short_table{prompt, 20, std::span<const int32_t>(table).first(2)};  // needs 3
  CHECK((*engine)->Forward({&short_table, 1}, **cache).status().code() ==
        StatusCode::kInvalidArgument);
  std::vector<int32_t> bad_ids = {1, 2, 5000};
  SequenceInput bad{bad_ids, 0, table};
  auto s = (*engine)->Forward({&bad, 1}, **cache).status();
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("5000") != std::string::npos);
  std::vector<int32_t> foreign = {0, 99};
  SequenceInput outside{prompt, 0, foreign};
  CHECK((*engine)->Forward({&outside, 1}, **cache).status().code() == StatusCode::kInvalidArgument);
  std::vector<SequenceInput> too_many(2, SequenceInput{prompt, 0, table});
  CHECK((*engine)->Forward(too_many, **cache).status().code() == StatusCode::kTooLarge);
  SequenceInput empty{{}, 0, table};
  CHECK((*engine)->Forward({&empty, 1}, **cache).status().code() == StatusCode::kInvalidArgument);
  auto wrong_pool = KvCache::Create(KvLayout{3, 2, 32, 16}, 4);
  REQUIRE(wrong_pool.ok());
  SequenceInput ok_seq{std::span<const int32_t>(prompt).first(4), 0, table};
  CHECK((*engine)->Forward({&ok_seq, 1}, **wrong_pool).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK((*engine)->Forward({&ok_seq, 1}, **cache).ok());
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST_CASE("layer hooks run in order and change nothing", "[forward]") {
  test::TempDir dir;
  auto model = TinyModel(dir, ModelFamily::kLlama);
  const int layers = model->config().num_layers;
  auto prompt = Prompt(40, 9);
  auto engine = CpuForward::Create(*model, ForwardOptions{});
  REQUIRE(engine.ok());
  // Two fresh caches (zeroed), one pass each: without hooks and with them.
  auto plain = KvCache::Create((*engine)->MakeKvLayout(16), 8);
  auto hooked = KvCache::Create((*engine)->MakeKvLayout(16), 8);
  REQUIRE(plain.ok());
  REQUIRE(hooked.ok());
  std::vector<int32_t> table, table2;
  REQUIRE((*plain)->blocks().Allocate(4, &table).ok());
  REQUIRE((*hooked)->blocks().Allocate(4, &table2).ok());
  REQUIRE(table == table2);
  SequenceInput seq{prompt, 0, table};
  auto expected = (*engine)->Forward({&seq, 1}, **plain);
  REQUIRE(expected.ok());
  std::vector<float> want(expected->begin(), expected->end());

  const KvLayout& layout = (*hooked)->layout();
  auto layer_bytes = [&](KvCache& cache, int layer) {
    std::vector<char> out;
    for (int32_t b : table) {
      const char* p = reinterpret_cast<const char*>(cache.BlockData(layer, b));
      out.insert(out.end(), p, p + layout.block_bytes());
    }
    return out;
  };
  std::vector<int> order;
  std::vector<std::vector<char>> at_after(layers);
  bool untouched_before = true;
  ForwardHooks hooks;
  hooks.before_layer = [&](int l) {
    order.push_back(l);
    for (char c : layer_bytes(**hooked, l)) untouched_before = untouched_before && c == 0;
  };
  hooks.after_layer = [&](int l) {
    order.push_back(1000 + l);
    at_after[l] = layer_bytes(**hooked, l);
  };
  auto got = (*engine)->Forward({&seq, 1}, **hooked, LogitsMode::kLastToken, &hooks);
  REQUIRE(got.ok());
  std::vector<int> want_order;
  for (int l = 0; l < layers; ++l) {
    want_order.push_back(l);
    want_order.push_back(1000 + l);
  }
  CHECK(order == want_order);
  CHECK(untouched_before);
  // Bit-identical logits, and each layer's KV was final when after_layer ran.
  REQUIRE(got->size() == want.size());
  CHECK(std::equal(got->begin(), got->end(), want.begin()));
  for (int l = 0; l < layers; ++l) {
    CHECK(at_after[l] == layer_bytes(**hooked, l));
    CHECK(at_after[l] == layer_bytes(**plain, l));
  }
  // A decode step with hooks equals one without.
  int32_t token = Argmax(want);
  SequenceInput step{{&token, 1}, static_cast<int32_t>(prompt.size()), table};
  auto a = (*engine)->Forward({&step, 1}, **plain);
  REQUIRE(a.ok());
  std::vector<float> step_plain(a->begin(), a->end());
  order.clear();
  hooks.before_layer = [&](int l) { order.push_back(l); };
  auto b = (*engine)->Forward({&step, 1}, **hooked, LogitsMode::kLastToken, &hooks);
  REQUIRE(b.ok());
  CHECK(std::equal(b->begin(), b->end(), step_plain.begin()));
  CHECK(order.size() == static_cast<size_t>(2 * layers));
}

}  // namespace
}  // namespace tandem
