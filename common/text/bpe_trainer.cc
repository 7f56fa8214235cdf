#include "common/text/bpe_trainer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/text/bpe.h"
#include "common/text/chat_template.h"
#include "common/text/pretokenizer.h"

namespace tandem {
namespace {

using ojson = nlohmann::ordered_json;

// splitmix64: tiny, fast, and identical on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return static_cast<size_t>(Next() % n); }
  bool Chance(int percent) { return Below(100) < static_cast<size_t>(percent); }
  template <typename T, size_t N>
  const T& Pick(const T (&items)[N]) {
    return items[Below(N)];
  }

 private:
  uint64_t state_;
};

const char* const kOnsets[] = {"",   "b",  "c",  "d",  "f",  "g",   "h",  "j",  "k",
                               "l",  "m",  "n",  "p",  "r",  "s",   "t",  "v",  "w",
                               "y",  "z",  "ch", "sh", "th", "st",  "tr", "pr", "br",
                               "cl", "gr", "pl", "qu", "wh", "str", "sp"};
const char* const kVowels[] = {"a", "e", "i", "o", "u", "ea", "ou", "io", "ai", "ee", "oo", "y"};
const char* const kCodas[] = {"",   "",   "",   "n",  "r",   "s",  "t",   "l",
                              "nd", "ng", "st", "ck", "rt",  "nt", "m",   "x",
                              "ss", "ll", "th", "ed", "ing", "er", "ion", "ly"};
const char* const kPunct[] = {".", ",", "!", "?", ";", ":", "...", " -", "\"", "'", "(", ")"};
const char* const kCode[] = {"def main():\n    return 0\n",
                             "for (int i = 0; i < n; ++i) {\n  sum += a[i];\n}\n",
                             "if x == None:\n\tprint('none')\n",
                             "const auto it = map.find(key);\n",
                             "#include <vector>\n",
                             "x = [i * 2 for i in range(10)]\n",
                             "return {\"ok\": true};\n",
                             "std::string name = \"tandem\";\n",
                             "while (!done) { step(); }\n",
                             "SELECT id, name FROM users WHERE age > 30;\n",
                             "let y = x.map(|v| v + 1);\n",
                             "// TODO(user): handle errors\n",
                             "    self.value = value  # cache\n"};
const char* const kForeign[] = {
    "café",   "naïve",  "résumé",     "über",  "straße", "año",    "façade", "crème", "déjà vu",
    "привет", "мир",    "спасибо",    "γειά",  "σου",    "日本語", "中文",   "你好",  "世界",
    "東京",   "한국어", "안녕하세요", "مرحبا", "שלום",   "हिन्दी",  "😀",      "🚀",     "👍🏽",
    "❤️", "🎉",      "→",          "€",     "±",      "°C",     "™",      "½"};
const char* const kSpaces[] = {" ", " ", " ", " ", " ", " ", "  ", "\n", "\n\n", "\t", "   "};

std::string MakeWord(Rng& rng) {
  std::string word;
  const size_t syllables = 1 + rng.Below(3);
  for (size_t i = 0; i < syllables; ++i) {
    word += rng.Pick(kOnsets);
    word += rng.Pick(kVowels);
    word += rng.Pick(kCodas);
  }
  return word;
}

// Text that exercises every pre-tokenizer branch: words with a Zipf-like frequency, numbers,
// contractions, punctuation runs, code, whitespace runs and multi-byte characters.
std::string GenerateCorpus(Rng& rng, size_t target_bytes, size_t lexicon_size) {
  std::vector<std::string> lexicon;
  for (size_t i = 0; i < lexicon_size; ++i) lexicon.push_back(MakeWord(rng));
  std::string text;
  text.reserve(target_bytes + 256);
  while (text.size() < target_bytes) {
    const size_t kind = rng.Below(100);
    if (kind < 70) {
      // Zipf-like: square the uniform draw so that early words are much more frequent.
      const double u = static_cast<double>(rng.Below(1 << 20)) / (1 << 20);
      std::string word = lexicon[static_cast<size_t>(u * u * u * lexicon.size())];
      if (rng.Chance(12)) word[0] = static_cast<char>(word[0] - 'a' + 'A');
      if (rng.Chance(3)) word += rng.Chance(50) ? "'s" : "'ll";
      text += word;
    } else if (kind < 78) {
      text += std::to_string(rng.Below(rng.Chance(50) ? 100 : 1000000));
    } else if (kind < 88) {
      text += rng.Pick(kPunct);
    } else if (kind < 93) {
      text += rng.Pick(kForeign);
    } else if (kind < 96) {
      text += rng.Pick(kCode);
    } else {
      text += rng.Pick(kSpaces);
    }
    text += rng.Chance(85) ? " " : rng.Pick(kSpaces);
  }
  return text;
}

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

uint64_t Key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Candidate {
  int64_t count;
  uint64_t pair;
  // Highest count first; ties go to the smaller pair key so training is deterministic.
  bool operator<(const Candidate& o) const {
    return count != o.count ? count < o.count : pair > o.pair;
  }
};

// The vocabulary as it grows: the 256 byte characters in GPT-2's table order first, then one
// token per merge that makes a new string.
struct Vocab {
  std::vector<std::string> tokens;
  std::unordered_map<std::string, int32_t> token_ids;
  std::vector<int32_t> byte_id = std::vector<int32_t>(256);
  std::vector<std::pair<int32_t, int32_t>> merges;  // in rank order
};

Vocab ByteVocab() {
  Vocab v;
  std::vector<int> order;
  for (int b = 33; b <= 126; ++b) order.push_back(b);
  for (int b = 161; b <= 172; ++b) order.push_back(b);
  for (int b = 174; b <= 255; ++b) order.push_back(b);
  for (int b = 0; b < 256; ++b) {
    if (std::find(order.begin(), order.end(), b) == order.end()) order.push_back(b);
  }
  for (int b : order) {
    v.byte_id[b] = static_cast<int32_t>(v.tokens.size());
    v.token_ids[ByteLevelChar(static_cast<uint8_t>(b))] = v.byte_id[b];
    v.tokens.push_back(ByteLevelChar(static_cast<uint8_t>(b)));
  }
  return v;
}

// The pre-tokenized words of `corpus` with their counts, as byte ids, in a deterministic order.
std::vector<Word> CountWords(const std::string& corpus, SplitPattern pattern, const Vocab& v) {
  std::unordered_map<std::string, int64_t> counts;
  for (const auto& [begin, end] : SplitText(corpus, pattern))
    ++counts[corpus.substr(begin, end - begin)];
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());  // deterministic word order
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& [text, count] : sorted) {
    Word w{{}, count};
    for (char c : text) w.symbols.push_back(v.byte_id[static_cast<uint8_t>(c)]);
    words.push_back(std::move(w));
  }
  return words;
}

// Pair counts over the words, which words hold each pair, and the queue of the most frequent.
class PairIndex {
 public:
  explicit PairIndex(const std::vector<Word>& words) {
    for (size_t w = 0; w < words.size(); ++w) {
      const auto& s = words[w].symbols;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t key = Key(s[i], s[i + 1]);
        counts_[key] += words[w].count;
        words_[key].push_back(static_cast<int32_t>(w));
      }
    }
    for (const auto& [key, count] : counts_) queue_.push({count, key});
  }

  // The most frequent pair, with its true count; false when no pair is left.
  bool PopBest(Candidate* best) {
    while (!queue_.empty()) {
      const Candidate top = queue_.top();
      queue_.pop();
      const auto current = counts_.find(top.pair);
      const int64_t count = current == counts_.end() ? 0 : current->second;
      if (count <= 0) continue;
      if (count != top.count) {  // stale: requeue with the true count
        queue_.push({count, top.pair});
        continue;
      }
      *best = top;
      return true;
    }
    return false;
  }

  // Replaces the pair (a, b) by new_id in every word that holds it, updating the counts.
  void Merge(uint64_t pair, int32_t new_id, int32_t merge_index, std::vector<Word>& words,
             std::vector<int32_t>& last_seen) {
    const auto a = static_cast<int32_t>(pair >> 32);
    const auto b = static_cast<int32_t>(pair & 0xFFFFFFFFu);
    std::unordered_set<uint64_t> touched;
    const std::vector<int32_t> affected = std::move(words_[pair]);
    words_.erase(pair);
    for (int32_t w : affected) {
      if (last_seen[w] == merge_index) continue;
      last_seen[w] = merge_index;
      Word& word = words[w];
      auto& s = word.symbols;
      bool has = false;
      for (size_t i = 0; i + 1 < s.size(); ++i) has |= (s[i] == a && s[i + 1] == b);
      if (!has) continue;
      for (size_t i = 0; i + 1 < s.size(); ++i) counts_[Key(s[i], s[i + 1])] -= word.count;
      std::vector<int32_t> next;
      next.reserve(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          next.push_back(new_id);
          ++i;
        } else {
          next.push_back(s[i]);
        }
      }
      s = std::move(next);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t key = Key(s[i], s[i + 1]);
        counts_[key] += word.count;
        if (s[i] == new_id || s[i + 1] == new_id) {
          words_[key].push_back(w);
          touched.insert(key);
        }
      }
    }
    counts_.erase(pair);
    std::vector<uint64_t> touched_sorted(touched.begin(), touched.end());
    std::sort(touched_sorted.begin(), touched_sorted.end());
    for (uint64_t key : touched_sorted) queue_.push({counts_[key], key});
  }

 private:
  std::unordered_map<uint64_t, int64_t> counts_;
  std::unordered_map<uint64_t, std::vector<int32_t>> words_;
  std::priority_queue<Candidate> queue_;
};

// Merges the most frequent pair until the vocabulary has 256 + num_merges ids. Internal when
// the corpus runs out of pairs first.
Status LearnMerges(std::vector<Word> words, int num_merges, int vocab_size, Vocab* v) {
  PairIndex pairs(words);
  std::vector<int32_t> last_seen(words.size(), -1);
  // A merge that recreates an existing string adds no id: count ids, not merges.
  while (static_cast<int>(v->tokens.size()) < 256 + num_merges) {
    Candidate top;
    if (!pairs.PopBest(&top)) {
      return Internal("tokenizer corpus ran out of pairs after " +
                      std::to_string(v->merges.size()) + " merges; vocab_size " +
                      std::to_string(vocab_size) + " is too large");
    }
    const auto a = static_cast<int32_t>(top.pair >> 32);
    const auto b = static_cast<int32_t>(top.pair & 0xFFFFFFFFu);
    const std::string merged = v->tokens[a] + v->tokens[b];
    int32_t new_id;
    const auto existing = v->token_ids.find(merged);
    if (existing != v->token_ids.end()) {
      new_id = existing->second;
    } else {
      new_id = static_cast<int32_t>(v->tokens.size());
      v->tokens.push_back(merged);
      v->token_ids.emplace(merged, new_id);
    }
    const int32_t merge_index = static_cast<int32_t>(v->merges.size());
    v->merges.emplace_back(a, b);
    pairs.Merge(top.pair, new_id, merge_index, words, last_seen);
  }
  return Status::Ok();
}

std::vector<std::string> SpecialTokens(bool llama3) {
  return llama3 ? std::vector<std::string>{"<|begin_of_text|>", "<|end_of_text|>",
                                           "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
                : std::vector<std::string>{"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
}

// The llama3 post-processor: byte-level, then BOS before each sequence.
ojson Llama3PostProcessor(const ojson& byte_level_processor, const std::string& bos,
                          int32_t bos_id) {
  return {{"type", "Sequence"},
          {"processors",
           {byte_level_processor,
            {{"type", "TemplateProcessing"},
             {"single",
              {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
               {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
             {"pair",
              {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
               {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
               {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
               {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
             {"special_tokens", {{bos, {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}}}}}}}}};
}

// tokenizer.json: the vocabulary and merges, specials after them, the family's pre-tokenizer,
// normalizer and post-processor.
ojson TokenizerJson(bool llama3, const Vocab& v, const std::vector<std::string>& specials,
                    SplitPattern pattern) {
  const int32_t first_special = static_cast<int32_t>(v.tokens.size());
  ojson vocab = ojson::object();
  for (size_t id = 0; id < v.tokens.size(); ++id) vocab[v.tokens[id]] = id;
  ojson merge_list = ojson::array();
  for (const auto& [a, b] : v.merges) merge_list.push_back(v.tokens[a] + " " + v.tokens[b]);
  ojson added = ojson::array();
  for (size_t k = 0; k < specials.size(); ++k) {
    added.push_back({{"id", first_special + static_cast<int32_t>(k)},
                     {"content", specials[k]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }

  ojson root = ojson::object();
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  root["added_tokens"] = added;
  root["normalizer"] = llama3 ? ojson(nullptr) : ojson({{"type", "NFC"}});
  root["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers",
                            {{{"type", "Split"},
                              {"pattern", {{"Regex", SplitRegexText(pattern)}}},
                              {"behavior", "Isolated"},
                              {"invert", false}},
                             {{"type", "ByteLevel"},
                              {"add_prefix_space", false},
                              {"trim_offsets", llama3},
                              {"use_regex", false}}}}};
  const ojson byte_level_processor = {{"type", "ByteLevel"},
                                      {"add_prefix_space", llama3},
                                      {"trim_offsets", false},
                                      {"use_regex", llama3}};
  root["post_processor"] =
      llama3 ? Llama3PostProcessor(byte_level_processor, specials[0], first_special)
             : byte_level_processor;
  root["decoder"] = {{"type", "ByteLevel"},
                     {"add_prefix_space", true},
                     {"trim_offsets", true},
                     {"use_regex", true}};
  root["model"] = {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"continuing_subword_prefix", nullptr},
                   {"end_of_word_suffix", nullptr},
                   {"fuse_unk", false},
                   {"byte_fallback", false},
                   {"ignore_merges", llama3},
                   {"vocab", vocab},
                   {"merges", merge_list}};
  return root;
}

// tokenizer_config.json: the specials, BOS/EOS/PAD and the family's chat template.
ojson TokenizerConfigJson(bool llama3, int32_t first_special,
                          const std::vector<std::string>& specials) {
  ojson config = ojson::object();
  ojson decoder_entries = ojson::object();
  for (size_t k = 0; k < specials.size(); ++k) {
    decoder_entries[std::to_string(first_special + k)] = {
        {"content", specials[k]}, {"lstrip", false},      {"normalized", false},
        {"rstrip", false},        {"single_word", false}, {"special", true}};
  }
  config["added_tokens_decoder"] = decoder_entries;
  if (llama3) {
    config["bos_token"] = "<|begin_of_text|>";
    config["eos_token"] = "<|eot_id|>";
    config["pad_token"] = "<|end_of_text|>";
    config["chat_template"] = std::string(kLlama3ChatTemplate);
    config["model_max_length"] = 8192;
  } else {
    config["bos_token"] = nullptr;
    config["eos_token"] = "<|im_end|>";
    config["pad_token"] = "<|endoftext|>";
    config["chat_template"] = std::string(kChatmlChatTemplate);
    config["model_max_length"] = 32768;
    config["errors"] = "replace";
    config["split_special_tokens"] = false;
  }
  // Our Decode matches tokenizers' decode; transformers' clean-up would change spacing.
  config["clean_up_tokenization_spaces"] = false;
  config["model_input_names"] = {"input_ids", "attention_mask"};
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  return config;
}

}  // namespace

StatusOr<TokenizerFiles> TrainTokenizer(TokenizerFamily family, int vocab_size, uint64_t seed) {
  const bool llama3 = family == TokenizerFamily::kLlama3;
  const std::vector<std::string> specials = SpecialTokens(llama3);
  const int num_merges = vocab_size - 256 - static_cast<int>(specials.size());
  if (num_merges < 1 || vocab_size > 65536) {  // ids stay well inside int32 and the corpus
    return InvalidArgument("tokenizer vocab_size " + std::to_string(vocab_size) + " must be in [" +
                           std::to_string(257 + specials.size()) + ", 65536]");
  }
  Vocab vocab = ByteVocab();
  Rng rng(seed ^ (llama3 ? 0x11A3A3ull : 0x0E2ull));
  // Large vocabularies need more distinct words, or the corpus runs out of pairs to merge.
  const std::string corpus =
      GenerateCorpus(rng, std::max<size_t>(400000, static_cast<size_t>(vocab_size) * 80),
                     6000 + static_cast<size_t>(vocab_size));
  const SplitPattern pattern = llama3 ? SplitPattern::kLlama3 : SplitPattern::kQwen2;
  TANDEM_RETURN_IF_ERROR(
      LearnMerges(CountWords(corpus, pattern, vocab), num_merges, vocab_size, &vocab));
  TokenizerFiles files;
  files.tokenizer_json =
      TokenizerJson(llama3, vocab, specials, pattern).dump(2, ' ', /*ensure_ascii=*/false);
  files.tokenizer_config_json =
      TokenizerConfigJson(llama3, static_cast<int32_t>(vocab.tokens.size()), specials)
          .dump(2, ' ', false);
  return files;
}

}  // namespace tandem
