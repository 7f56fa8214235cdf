#include "cluster/generate_cli.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include "common/base/flags.h"
#include "common/engine/forward.h"
#include "common/engine/kv_cache.h"
#include "common/model/checkpoint.h"
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

// What the flags ask for, checked.
struct GenerateOptions {
  bool help = false;  // --help: the help text is printed, nothing runs
  std::string help_text;
  std::string model_dir;
  std::optional<std::string> prompt_text;  // else prompt_ids
  std::string prompt_ids;
  long max_tokens = 16;
  long threads = 1;
  long block_size = kDefaultBlockSize;
  long prefill_chunk = 0;   // 0 = the whole prompt in one pass
  std::string dump_logits;  // empty = none
  bool all_positions = false;
  bool ignore_eos = false;
  std::optional<WeightDType> dtype;  // nullopt = auto
};

// InvalidArgument for a bad flag (the exit code is kExitUsage).
StatusOr<GenerateOptions> ParseGenerateArgs(const std::vector<std::string>& args) {
  FlagParser flags(
      "tandem generate --model DIR|FILE.gguf (--prompt TEXT | --prompt-ids 1,2,3) [flags]",
      "Runs the engine alone, greedily (argmax), and prints the generated ids (and text when the "
      "model has a tokenizer).\n--dump-logits writes raw little-endian float32 rows of vocab_size "
      "values: the prompt's last position (every prompt position with --all-positions), then one "
      "row per decode step.");
  flags.AddString("model", "", "checkpoint directory (config.json, *.safetensors) or .gguf file");
  flags.AddString("prompt", "", "prompt text (needs the checkpoint's tokenizer)");
  flags.AddString("prompt-ids", "", "prompt as comma-separated token ids");
  flags.AddInt("max-tokens", 16, "tokens to generate");
  flags.AddInt("threads", 1, "compute threads (attention pool and OpenBLAS)");
  flags.AddString("dump-logits", "", "write the logits of every step to this file");
  flags.AddBool("all-positions", "dump logits of every prompt position, not only the last");
  flags.AddBool("ignore-eos", "keep generating after an end-of-sequence token");
  flags.AddInt("prefill-chunk", 0, "prefill the prompt in chunks of this many tokens (0 = whole)");
  flags.AddInt("block-size", kDefaultBlockSize, "KV cache block size in tokens");
  flags.AddString("dtype", "auto",
                  "weight storage: auto (the checkpoint's torch_dtype), float32, bfloat16, float16");
  TANDEM_RETURN_IF_ERROR(flags.Parse(args));
  GenerateOptions o;
  if (flags.help_requested()) {
    o.help = true;
    o.help_text = flags.Help();
    return o;
  }
  o.model_dir = flags.GetString("model");
  if (o.model_dir.empty()) return InvalidArgument("--model DIR is required");
  if (flags.IsSet("prompt") == flags.IsSet("prompt-ids"))
    return InvalidArgument("give exactly one of --prompt and --prompt-ids");
  if (flags.IsSet("prompt")) o.prompt_text = flags.GetString("prompt");
  o.prompt_ids = flags.GetString("prompt-ids");
  o.max_tokens = flags.GetInt("max-tokens");
  o.threads = flags.GetInt("threads");
  o.block_size = flags.GetInt("block-size");
  o.prefill_chunk = flags.GetInt("prefill-chunk");
  if (o.max_tokens < 1 || o.max_tokens > 1000000)
    return InvalidArgument("--max-tokens must be >= 1");
  if (o.threads < 1 || o.threads > 1024) return InvalidArgument("--threads must be in [1, 1024]");
  if (o.block_size < 1 || o.block_size > 4096)
    return InvalidArgument("--block-size must be in [1, 4096]");
  if (o.prefill_chunk < 0) return InvalidArgument("--prefill-chunk must not be negative");
  if (flags.IsSet("dump-logits")) o.dump_logits = flags.GetString("dump-logits");
  o.all_positions = flags.GetBool("all-positions");
  o.ignore_eos = flags.GetBool("ignore-eos");
  const std::string& dtype = flags.GetString("dtype");
  if (dtype != "auto") {
    o.dtype = ParseWeightDType(dtype);
    if (!o.dtype)
      return InvalidArgument("--dtype must be auto, float32, bfloat16 or float16, not '" + dtype + "'");
  }
  return o;
}

// The model, its forward pass and a KV cache with one sequence's blocks.
struct Engine {
  std::unique_ptr<Model> model;
  std::unique_ptr<CpuForward> forward;
  std::unique_ptr<KvCache> cache;
  std::vector<int32_t> table;
};

StatusOr<Engine> MakeEngine(const GenerateOptions& o, std::unique_ptr<Model> model, int prompt_len,
                            int chunk) {
  Engine e;
  e.model = std::move(model);
  ForwardOptions options;
  options.num_threads = static_cast<int>(o.threads);
  options.max_batch_tokens = std::min(chunk, prompt_len);
  options.max_batch_sequences = 1;
  TANDEM_ASSIGN_OR_RETURN(e.forward, CpuForward::Create(*e.model, options));
  const KvLayout layout = e.forward->MakeKvLayout(static_cast<int>(o.block_size));
  const int num_blocks = BlocksForTokens(prompt_len + o.max_tokens, layout.block_size);
  TANDEM_ASSIGN_OR_RETURN(e.cache, KvCache::Create(layout, num_blocks));
  e.table.reserve(num_blocks);
  TANDEM_RETURN_IF_ERROR(e.cache->blocks().Allocate(num_blocks, &e.table));
  return e;
}

// Writes logits rows to --dump-logits, when given.
class LogitsDump {
 public:
  static StatusOr<LogitsDump> Open(const std::string& path) {
    LogitsDump dump;
    if (path.empty()) return dump;
    dump.file_.reset(std::fopen(path.c_str(), "wb"));
    if (!dump.file_) return Internal(path + ": cannot open for writing");
    return dump;
  }
  Status Write(std::span<const float> rows) {
    if (file_ && std::fwrite(rows.data(), sizeof(float), rows.size(), file_.get()) != rows.size())
      return Internal("writing the logits dump failed");
    return Status::Ok();
  }

 private:
  std::unique_ptr<FILE, FileCloser> file_;
};

struct Generation {
  std::vector<int32_t> generated;
  double prefill_s = 0, decode_s = 0;
};

// Prefills the prompt (in chunks), then decodes greedily until max_tokens or an end of sequence.
StatusOr<Generation> Generate(const GenerateOptions& o, Engine& e,
                              const std::vector<int32_t>& prompt, int chunk, LogitsDump& dump) {
  using Clock = std::chrono::steady_clock;
  const ModelConfig& config = e.model->config();
  const int prompt_len = static_cast<int>(prompt.size());
  const LogitsMode prefill_mode = o.all_positions ? LogitsMode::kAllTokens : LogitsMode::kLastToken;
  const auto t0 = Clock::now();
  std::span<const float> logits;
  for (int start = 0; start < prompt_len; start += chunk) {
    const int n = std::min(chunk, prompt_len - start);
    SequenceInput seq{std::span<const int32_t>(prompt).subspan(start, n), start, e.table};
    TANDEM_ASSIGN_OR_RETURN(logits, e.forward->Forward({&seq, 1}, *e.cache, prefill_mode));
    if (prefill_mode == LogitsMode::kAllTokens) TANDEM_RETURN_IF_ERROR(dump.Write(logits));
  }
  std::span<const float> last = logits.subspan(logits.size() - config.vocab_size);
  if (prefill_mode == LogitsMode::kLastToken) TANDEM_RETURN_IF_ERROR(dump.Write(last));
  const auto t1 = Clock::now();

  Generation g;
  g.generated.reserve(o.max_tokens);
  g.generated.push_back(Argmax(last));
  auto is_eos = [&](int32_t id) {
    for (int eos : config.eos_token_ids)
      if (id == eos) return true;
    return false;
  };
  while (static_cast<long>(g.generated.size()) < o.max_tokens &&
         (o.ignore_eos || !is_eos(g.generated.back()))) {
    const int32_t token = g.generated.back();
    SequenceInput seq{std::span<const int32_t>(&token, 1),
                      prompt_len + static_cast<int32_t>(g.generated.size()) - 1, e.table};
    TANDEM_ASSIGN_OR_RETURN(std::span<const float> out, e.forward->Forward({&seq, 1}, *e.cache));
    TANDEM_RETURN_IF_ERROR(dump.Write(out));
    g.generated.push_back(Argmax(out));
  }
  const auto t2 = Clock::now();
  g.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  g.decode_s = std::chrono::duration<double>(t2 - t1).count();
  return g;
}

void PrintGeneration(const std::vector<int32_t>& prompt, const Generation& g,
                     const std::optional<Tokenizer>& tokenizer) {
  std::printf("prompt_ids:");
  for (int32_t id : prompt) std::printf(" %d", id);
  std::printf("\ngenerated_ids:");
  for (int32_t id : g.generated) std::printf(" %d", id);
  std::printf("\n");
  if (tokenizer) std::printf("text: %s\n", tokenizer->Decode(g.generated, true).c_str());
  const int prompt_len = static_cast<int>(prompt.size());
  std::fprintf(stderr,
               "prefill: %d tokens in %.1f ms (%.0f tok/s); decode: %zu steps in %.1f ms (%.1f "
               "tok/s)\n",
               prompt_len, g.prefill_s * 1e3, prompt_len / std::max(g.prefill_s, 1e-9),
               g.generated.size() - 1, g.decode_s * 1e3,
               (g.generated.size() - 1) / std::max(g.decode_s, 1e-9));
}

int Fail(const Status& s) {
  std::fprintf(stderr, "tandem generate: %s\n", s.ToString().c_str());
  return kExitFailure;
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "tandem generate: %s\n", message.c_str());
  return kExitUsage;
}

}  // namespace

int GenerateMain(const std::vector<std::string>& args) {
  StatusOr<GenerateOptions> options = ParseGenerateArgs(args);
  if (!options.ok()) return UsageError(options.status().message());
  if (options->help) {
    std::fputs(options->help_text.c_str(), stdout);
    return kExitOk;
  }
  const GenerateOptions& o = *options;
  const auto load_start = std::chrono::steady_clock::now();
  StatusOr<std::unique_ptr<Model>> model = Model::Load(o.model_dir, {o.dtype});
  if (!model.ok()) return Fail(model.status());
  std::fprintf(stderr, "model: loaded %s in %.0f ms\n", o.model_dir.c_str(),
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                         load_start).count());
  std::optional<Tokenizer> tokenizer;
  if (StatusOr<Tokenizer> t = LoadCheckpointTokenizer(o.model_dir); t.ok()) {
    tokenizer = std::move(*t);
  } else if (o.prompt_text) {
    return Fail(t.status().WithContext("--prompt needs a tokenizer"));
  }
  std::vector<int32_t> prompt;
  if (o.prompt_text) {
    prompt = tokenizer->Encode(*o.prompt_text, /*add_special_tokens=*/true);
    if (prompt.empty()) return UsageError("--prompt encodes to no tokens");
  } else {
    StatusOr<std::vector<int32_t>> ids = ParseIds(o.prompt_ids);
    if (!ids.ok()) return Fail(ids.status());
    prompt = std::move(*ids);
  }
  const int prompt_len = static_cast<int>(prompt.size());
  const int chunk = o.prefill_chunk == 0 ? prompt_len : static_cast<int>(o.prefill_chunk);
  StatusOr<Engine> engine = MakeEngine(o, std::move(*model), prompt_len, chunk);
  if (!engine.ok()) return Fail(engine.status());
  StatusOr<LogitsDump> dump = LogitsDump::Open(o.dump_logits);
  if (!dump.ok()) return Fail(dump.status());
  StatusOr<Generation> generation = Generate(o, *engine, prompt, chunk, *dump);
  if (!generation.ok()) return Fail(generation.status());
  PrintGeneration(prompt, *generation, tokenizer);
  return kExitOk;
}

}  // namespace tandem
