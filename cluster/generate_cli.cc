#include "cluster/generate_cli.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include "common/base/flags.h"
#include "common/engine/forward.h"
#include "common/engine/kv_cache.h"
#include "common/model/model.h"
#include "common/text/tokenizer.h"

namespace tandem {
namespace {

StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    size_t comma = text.find(',', i);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(i, comma - i);
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || end != item.c_str() + item.size() || v < 0 || v > INT32_MAX)
      return InvalidArgument("--prompt-ids: '" + item + "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
    i = comma + 1;
  }
  if (ids.empty()) return InvalidArgument("--prompt-ids: no ids");
  return ids;
}

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  return best;
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

}  // namespace

int GenerateMain(const std::vector<std::string>& args) {
  FlagParser flags(
      "tandem generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [flags]",
      "Runs the engine alone, greedily (argmax), and prints the generated ids (and text when the "
      "model has a tokenizer).\n--dump-logits writes raw little-endian float32 rows of vocab_size "
      "values: the prompt's last position (every prompt position with --all-positions), then one "
      "row per decode step.");
  flags.AddString("model", "", "checkpoint directory (config.json, *.safetensors)");
  flags.AddString("prompt", "", "prompt text (needs tokenizer.json)");
  flags.AddString("prompt-ids", "", "prompt as comma-separated token ids");
  flags.AddInt("max-tokens", 16, "tokens to generate");
  flags.AddInt("threads", 1, "compute threads (attention pool and OpenBLAS)");
  flags.AddString("dump-logits", "", "write the logits of every step to this file");
  flags.AddBool("all-positions", "dump logits of every prompt position, not only the last");
  flags.AddBool("ignore-eos", "keep generating after an end-of-sequence token");
  flags.AddInt("prefill-chunk", 0, "prefill the prompt in chunks of this many tokens (0 = whole)");
  flags.AddInt("block-size", kDefaultBlockSize, "KV cache block size in tokens");
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  auto usage_error = [](const char* message) {
    std::fprintf(stderr, "tandem generate: %s\n", message);
    return kExitUsage;
  };
  const std::string& dir = flags.GetString("model");
  if (dir.empty()) return usage_error("--model DIR is required");
  if (flags.IsSet("prompt") == flags.IsSet("prompt-ids"))
    return usage_error("give exactly one of --prompt and --prompt-ids");
  const long max_tokens = flags.GetInt("max-tokens");
  const long threads = flags.GetInt("threads");
  const long block_size = flags.GetInt("block-size");
  const long chunk_flag = flags.GetInt("prefill-chunk");
  if (max_tokens < 1 || max_tokens > 1000000) return usage_error("--max-tokens must be >= 1");
  if (threads < 1 || threads > 1024) return usage_error("--threads must be in [1, 1024]");
  if (block_size < 1 || block_size > 4096) return usage_error("--block-size must be in [1, 4096]");
  if (chunk_flag < 0) return usage_error("--prefill-chunk must not be negative");

  auto fail = [](const Status& s) {
    std::fprintf(stderr, "tandem generate: %s\n", s.ToString().c_str());
    return kExitFailure;
  };
  StatusOr<std::unique_ptr<Model>> model = Model::Load(dir);
  if (!model.ok()) return fail(model.status());
  const ModelConfig& config = (*model)->config();

  std::optional<Tokenizer> tokenizer;
  if (StatusOr<Tokenizer> t = Tokenizer::Load(dir); t.ok()) {
    tokenizer = std::move(*t);
  } else if (flags.IsSet("prompt")) {
    return fail(t.status().WithContext("--prompt needs a tokenizer"));
  }
  std::vector<int32_t> prompt;
  if (flags.IsSet("prompt")) {
    prompt = tokenizer->Encode(flags.GetString("prompt"), /*add_special_tokens=*/true);
    if (prompt.empty()) return usage_error("--prompt encodes to no tokens");
  } else {
    StatusOr<std::vector<int32_t>> ids = ParseIds(flags.GetString("prompt-ids"));
    if (!ids.ok()) return fail(ids.status());
    prompt = std::move(*ids);
  }

  const int prompt_len = static_cast<int>(prompt.size());
  const int chunk = chunk_flag == 0 ? prompt_len : static_cast<int>(chunk_flag);
  const int total = prompt_len + static_cast<int>(max_tokens);
  ForwardOptions options;
  options.num_threads = static_cast<int>(threads);
  options.max_batch_tokens = std::min(chunk, prompt_len);
  options.max_batch_sequences = 1;
  StatusOr<std::unique_ptr<CpuForward>> engine = CpuForward::Create(**model, options);
  if (!engine.ok()) return fail(engine.status());
  const KvLayout layout = (*engine)->MakeKvLayout(static_cast<int>(block_size));
  const int num_blocks = (total + layout.block_size - 1) / layout.block_size;
  StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(layout, num_blocks);
  if (!cache.ok()) return fail(cache.status());
  std::vector<int32_t> table;
  table.reserve(num_blocks);
  if (Status s = (*cache)->blocks().Allocate(num_blocks, &table); !s.ok()) return fail(s);

  std::unique_ptr<FILE, FileCloser> dump;
  if (flags.IsSet("dump-logits")) {
    dump.reset(std::fopen(flags.GetString("dump-logits").c_str(), "wb"));
    if (!dump) return fail(Internal(flags.GetString("dump-logits") + ": cannot open for writing"));
  }
  auto write_rows = [&](std::span<const float> rows) {
    return !dump || std::fwrite(rows.data(), sizeof(float), rows.size(), dump.get()) == rows.size();
  };

  using Clock = std::chrono::steady_clock;
  const LogitsMode prefill_mode =
      flags.GetBool("all-positions") ? LogitsMode::kAllTokens : LogitsMode::kLastToken;
  const auto t0 = Clock::now();
  std::span<const float> logits;
  for (int start = 0; start < prompt_len; start += chunk) {
    const int n = std::min(chunk, prompt_len - start);
    SequenceInput seq{std::span<const int32_t>(prompt).subspan(start, n), start, table};
    StatusOr<std::span<const float>> out = (*engine)->Forward({&seq, 1}, **cache, prefill_mode);
    if (!out.ok()) return fail(out.status());
    logits = *out;
    if (prefill_mode == LogitsMode::kAllTokens && !write_rows(logits))
      return fail(Internal("writing the logits dump failed"));
  }
  std::span<const float> last = logits.subspan(logits.size() - config.vocab_size);
  if (prefill_mode == LogitsMode::kLastToken && !write_rows(last))
    return fail(Internal("writing the logits dump failed"));
  const auto t1 = Clock::now();

  std::vector<int32_t> generated;
  generated.reserve(max_tokens);
  generated.push_back(Argmax(last));
  auto is_eos = [&](int32_t id) {
    for (int eos : config.eos_token_ids)
      if (id == eos) return true;
    return false;
  };
  while (static_cast<long>(generated.size()) < max_tokens &&
         (flags.GetBool("ignore-eos") || !is_eos(generated.back()))) {
    const int32_t token = generated.back();
    SequenceInput seq{std::span<const int32_t>(&token, 1),
                      prompt_len + static_cast<int32_t>(generated.size()) - 1, table};
    StatusOr<std::span<const float>> out = (*engine)->Forward({&seq, 1}, **cache);
    if (!out.ok()) return fail(out.status());
    if (!write_rows(*out)) return fail(Internal("writing the logits dump failed"));
    generated.push_back(Argmax(*out));
  }
  const auto t2 = Clock::now();

  std::printf("prompt_ids:");
  for (int32_t id : prompt) std::printf(" %d", id);
  std::printf("\ngenerated_ids:");
  for (int32_t id : generated) std::printf(" %d", id);
  std::printf("\n");
  if (tokenizer) std::printf("text: %s\n", tokenizer->Decode(generated, true).c_str());
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "prefill: %d tokens in %.1f ms (%.0f tok/s); decode: %zu steps in %.1f ms (%.1f tok/s)\n",
               prompt_len, prefill_s * 1e3, prompt_len / std::max(prefill_s, 1e-9),
               generated.size() - 1, decode_s * 1e3,
               (generated.size() - 1) / std::max(decode_s, 1e-9));
  return kExitOk;
}

}  // namespace tandem
