// The encoder and decoder of Tokenizer (common/text/tokenizer.h) over the state that
// tokenizer_json.cc builds.
#include "common/text/tokenizer.h"

#include <algorithm>
#include <functional>

#include "common/text/tokenizer_state.h"

namespace tandem {

namespace tokenizer_internal {

std::string ReplaceAll(std::string_view text, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(text);
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(text.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

}  // namespace tokenizer_internal

namespace {

using tokenizer_internal::AddedToken;
using tokenizer_internal::DecoderSpec;
using tokenizer_internal::NormalizerOp;
using tokenizer_internal::ReplaceAll;

bool IsUnicodeWhitespace(uint32_t cp) {
  return unicode::Classify(cp) == unicode::CharClass::kWhitespace;
}

bool IsWordChar(uint32_t cp) {
  const auto cls = unicode::Classify(cp);
  return cls == unicode::CharClass::kLetter || cls == unicode::CharClass::kNumber || cp == '_';
}

// Offset where lossy UTF-8 decoding of `bytes` stops being final: what follows is a valid
// sequence cut off by the end of the buffer, which the next bytes may complete.
size_t FinalUtf8Prefix(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    bool truncated;
    const size_t len = unicode::ValidSequenceLength(bytes, i, &truncated);
    if (len > 0) {
      i += len;
    } else if (truncated) {
      return i;
    } else {
      ++i;  // an invalid byte; RepairUtf8 decides how many bytes share one U+FFFD
    }
  }
  return i;
}

}  // namespace

std::string TokenizerState::Normalize(std::string_view text) const {
  std::string out(text);
  for (const NormalizerOp& op : normalizers) {
    switch (op.kind) {
      case NormalizerOp::Kind::kForm:
        out = unicode::Normalize(out, op.form);
        break;
      case NormalizerOp::Kind::kPrepend:
        if (!out.empty()) out = op.a + out;
        break;
      case NormalizerOp::Kind::kReplace:
        out = ReplaceAll(out, op.a, op.b);
        break;
    }
  }
  return out;
}

void TokenizerState::SplitAdded(std::string_view text, bool normalized_pass,
                                const std::function<void(std::string_view, int32_t)>& emit) const {
  const auto& index = normalized_pass ? normalized_index : raw_index;
  size_t segment_start = 0;  // start of the text not yet emitted
  size_t i = 0;
  while (i < text.size()) {
    const auto& candidates = index[static_cast<uint8_t>(text[i])];
    const AddedToken* hit = nullptr;
    for (int k : candidates) {
      const AddedToken& token = added[k];
      if (text.compare(i, token.content.size(), token.content) != 0) continue;
      if (token.single_word) {
        const auto before = unicode::Decode(text.substr(segment_start, i - segment_start));
        const size_t end = i + token.content.size();
        const auto after =
            unicode::Decode(text.substr(end, std::min<size_t>(4, text.size() - end)));
        if ((!before.empty() && IsWordChar(before.back().value)) ||
            (!after.empty() && IsWordChar(after.front().value))) {
          continue;
        }
      }
      hit = &token;
      break;
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t start = i;
    size_t stop = i + hit->content.size();
    if (hit->lstrip) {
      const auto before = unicode::Decode(text.substr(segment_start, i - segment_start));
      for (size_t k = before.size(); k > 0 && IsUnicodeWhitespace(before[k - 1].value); --k) {
        start = segment_start + before[k - 1].offset;
      }
    }
    if (hit->rstrip) {
      const auto after = unicode::Decode(text.substr(stop));
      size_t extra = 0;
      for (const auto& cp : after) {
        if (!IsUnicodeWhitespace(cp.value)) break;
        extra = cp.offset + cp.length;
      }
      stop += extra;
    }
    if (start > segment_start) emit(text.substr(segment_start, start - segment_start), -1);
    emit(text.substr(start, stop - start), hit->id);
    segment_start = stop;
    i = stop;
  }
  if (segment_start < text.size()) emit(text.substr(segment_start), -1);
}

void TokenizerState::EncodeWord(const std::string& word, std::vector<int32_t>* ids) const {
  // Whole-text words (no pre-tokenizer) are long and rarely repeat: not worth caching.
  constexpr size_t kMaxCachedWord = 128;
  constexpr size_t kMaxCacheEntries = 1 << 18;
  if (word.size() > kMaxCachedWord) {
    model.EncodeWord(word, ids);
    return;
  }
  {
    MutexLock lock(&cache_mu);
    const auto it = cache.find(word);
    if (it != cache.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> word_ids;
  model.EncodeWord(word, &word_ids);
  ids->insert(ids->end(), word_ids.begin(), word_ids.end());
  MutexLock lock(&cache_mu);
  if (cache.size() >= kMaxCacheEntries) cache.clear();
  cache.emplace(word, std::move(word_ids));
}

void TokenizerState::EncodePiece(std::string_view piece, bool at_start,
                                 std::vector<int32_t>* ids) const {
  std::vector<PreTokenizedWord> words{{std::string(piece), at_start}};
  std::vector<PreTokenizedWord> next;
  for (const PreTokenizerOp& op : pre_tokenizers) {
    next.clear();
    ApplyPreTokenizer(op, &words, &next);
    words.swap(next);
  }
  for (const PreTokenizedWord& word : words) {
    if (!word.text.empty()) EncodeWord(word.text, ids);
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  const TokenizerState& s = *state_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = s.prefix_ids;
  s.SplitAdded(text, /*normalized_pass=*/false, [&](std::string_view segment, int32_t id) {
    if (id >= 0) {
      ids.push_back(id);
      return;
    }
    const bool segment_at_start = segment.data() == text.data();
    const std::string normalized = s.Normalize(segment);
    s.SplitAdded(normalized, /*normalized_pass=*/true, [&](std::string_view piece, int32_t id2) {
      if (id2 >= 0) {
        ids.push_back(id2);
      } else {
        s.EncodePiece(piece, segment_at_start && piece.data() == normalized.data(), &ids);
      }
    });
  });
  if (add_special_tokens) ids.insert(ids.end(), s.suffix_ids.begin(), s.suffix_ids.end());
  return ids;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const TokenizerState& s = *state_;
  auto usable = [&](int32_t id) {
    return id >= 0 && id < static_cast<int32_t>(s.decoded.size()) &&
           !(skip_special_tokens && s.is_special[id]) && (!s.id_to_token[id].empty());
  };
  switch (s.decoder.kind) {
    case DecoderSpec::Kind::kByteLevel: {
      std::string bytes;
      for (int32_t id : ids) {
        if (usable(id)) bytes += s.decoded[id];
      }
      return unicode::RepairUtf8(bytes);
    }
    case DecoderSpec::Kind::kNone: {
      std::string out;
      bool first = true;
      for (int32_t id : ids) {
        if (!usable(id)) continue;
        if (!first) out += ' ';
        out += s.id_to_token[id];
        first = false;
      }
      return out;
    }
    case DecoderSpec::Kind::kPieces:
      break;
  }
  // ByteFallback: a run of byte tokens is its text when valid UTF-8, else one U+FFFD per byte.
  std::vector<std::string> tokens;
  std::string run;
  size_t run_len = 0;
  auto flush = [&] {
    if (run_len == 0) return;
    if (unicode::IsValidUtf8(run)) {
      tokens.push_back(run);
    } else {
      for (size_t k = 0; k < run_len; ++k) tokens.emplace_back("\xEF\xBF\xBD");
    }
    run.clear();
    run_len = 0;
  };
  for (int32_t id : ids) {
    if (!usable(id)) continue;
    if (s.byte_of[id] >= 0) {
      run.push_back(static_cast<char>(s.byte_of[id]));
      ++run_len;
      continue;
    }
    flush();
    tokens.push_back(s.decoded[id]);
  }
  flush();
  if (s.decoder.fuse && !tokens.empty()) {
    std::string fused;
    for (const auto& t : tokens) fused += t;
    tokens.assign(1, std::move(fused));
  }
  std::string out;
  for (std::string& t : tokens) {
    if (!s.decoder.strip_content.empty()) {
      for (int k = 0; k < s.decoder.strip_start && t.starts_with(s.decoder.strip_content); ++k) {
        t.erase(0, s.decoder.strip_content.size());
      }
    }
    out += t;
  }
  return out;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  const std::string key(token);
  const auto it = state_->added_by_content.find(key);
  if (it != state_->added_by_content.end()) return it->second;
  const auto v = state_->model.vocab().find(key);
  if (v != state_->model.vocab().end()) return v->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size() || state_->id_to_token[id].empty()) return std::nullopt;
  return state_->id_to_token[id];
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(state_->id_to_token.size());
}
bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && state_->is_special[id] != 0;
}
std::optional<int32_t> Tokenizer::bos_id() const {
  return state_->bos_id;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return state_->eos_id;
}
std::optional<int32_t> Tokenizer::pad_id() const {
  return state_->pad_id;
}
const std::string& Tokenizer::bos_token() const {
  return state_->bos_token;
}
const std::string& Tokenizer::eos_token() const {
  return state_->eos_token;
}
const std::string& Tokenizer::chat_template() const {
  return state_->chat_template;
}

// ---- streaming ---------------------------------------------------------------------------------

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer),
      skip_special_tokens_(skip_special_tokens),
      strip_left_(tokenizer.state_->decoder.strip_start) {}

std::string IncrementalDecoder::Emit(std::string text) {
  const DecoderSpec& d = tokenizer_.state_->decoder;
  if (d.strip_content.empty()) return text;
  if (!d.fuse) {  // Strip applies to every token
    for (int k = 0; k < d.strip_start && text.starts_with(d.strip_content); ++k) {
      text.erase(0, d.strip_content.size());
    }
    return text;
  }
  while (strip_left_ > 0 && text.starts_with(d.strip_content)) {
    text.erase(0, d.strip_content.size());
    --strip_left_;
  }
  if (!text.empty()) strip_left_ = 0;
  return text;
}

std::string IncrementalDecoder::Add(int32_t id) {
  const TokenizerState& s = *tokenizer_.state_;
  if (id < 0 || id >= static_cast<int32_t>(s.decoded.size()) || s.id_to_token[id].empty() ||
      (skip_special_tokens_ && s.is_special[id])) {
    return "";
  }
  switch (s.decoder.kind) {
    case DecoderSpec::Kind::kByteLevel: {
      pending_bytes_ += s.decoded[id];
      const size_t final_len = FinalUtf8Prefix(pending_bytes_);
      std::string out = unicode::RepairUtf8(std::string_view(pending_bytes_).substr(0, final_len));
      pending_bytes_.erase(0, final_len);
      return out;
    }
    case DecoderSpec::Kind::kNone: {
      std::string out = first_token_ ? s.id_to_token[id] : " " + s.id_to_token[id];
      first_token_ = false;
      return out;
    }
    case DecoderSpec::Kind::kPieces:
      break;
  }
  if (s.byte_of[id] >= 0) {
    pending_run_.push_back(static_cast<char>(s.byte_of[id]));
    return "";
  }
  std::string out = Finish();
  out += Emit(s.decoded[id]);
  return out;
}

std::string IncrementalDecoder::Finish() {
  if (!pending_bytes_.empty()) {
    std::string out = unicode::RepairUtf8(pending_bytes_);
    pending_bytes_.clear();
    return out;
  }
  if (pending_run_.empty()) return "";
  std::string out;
  if (unicode::IsValidUtf8(pending_run_)) {
    out = Emit(pending_run_);
  } else {
    for (size_t k = 0; k < pending_run_.size(); ++k) out += Emit("\xEF\xBF\xBD");
  }
  pending_run_.clear();
  return out;
}

}  // namespace tandem
