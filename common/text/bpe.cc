#include "common/text/bpe.h"

#include <array>
#include <cstdio>
#include <queue>

#include "common/text/unicode.h"

namespace tandem {
namespace {

struct ByteLevelTables {
  std::array<std::string, 256> chars;
  std::array<uint32_t, 256> code_points;
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables tables = [] {
    ByteLevelTables t;
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      t.code_points[b] = printable ? b : 256 + next++;
      unicode::AppendUtf8(t.code_points[b], &t.chars[b]);
    }
    return t;
  }();
  return tables;
}

}  // namespace

const std::string& ByteLevelChar(uint8_t byte) { return Tables().chars[byte]; }

std::optional<uint8_t> ByteLevelByte(uint32_t code_point) {
  if (code_point < 256) {
    const bool printable = (code_point >= 33 && code_point <= 126) ||
                           (code_point >= 161 && code_point <= 172) || (code_point >= 174);
    if (printable) return static_cast<uint8_t>(code_point);
    return std::nullopt;
  }
  if (code_point < 256 + 68) {
    const auto& cps = Tables().code_points;
    for (int b = 0; b < 256; ++b) {
      if (cps[b] == code_point) return static_cast<uint8_t>(b);
    }
  }
  return std::nullopt;
}

std::string ByteLevelEncode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  const auto& chars = Tables().chars;
  for (char c : bytes) out += chars[static_cast<uint8_t>(c)];
  return out;
}

StatusOr<BpeModel> BpeModel::Create(std::unordered_map<std::string, int32_t> vocab,
                                    const std::vector<std::pair<std::string, std::string>>& merges,
                                    BpeOptions options) {
  BpeModel model;
  model.vocab_ = std::move(vocab);
  model.options_ = options;
  model.merges_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto a = model.vocab_.find(left);
    const auto b = model.vocab_.find(right);
    const auto merged = model.vocab_.find(left + right);
    if (a == model.vocab_.end() || b == model.vocab_.end() || merged == model.vocab_.end()) {
      const std::string& missing = a == model.vocab_.end()   ? left
                                   : b == model.vocab_.end() ? right
                                                             : left + right;
      return InvalidArgument("merge #" + std::to_string(rank) + " '" + left + " " + right +
                             "' uses token '" + missing + "' which is not in the vocabulary");
    }
    // Like tokenizers, a repeated pair keeps the last rank it was given.
    model.merges_[PairKey(a->second, b->second)] = {static_cast<int32_t>(rank), merged->second};
  }
  if (options.byte_fallback) {
    // Missing <0xNN> tokens are allowed: a character with such a byte becomes unk (tokenizers).
    model.byte_tokens_.assign(256, -1);
    for (int byte = 0; byte < 256; ++byte) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", byte);
      const auto it = model.vocab_.find(name);
      if (it != model.vocab_.end()) model.byte_tokens_[byte] = it->second;
    }
  }
  return model;
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    const auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  // tokenizers' merge_word: an unknown character leaves a pending unk that is emitted before the
  // next character found in the vocabulary (or at the end), not before byte-fallback tokens.
  bool unk_pending = false;
  auto push = [&](int32_t id) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, true});
  };
  std::string piece;
  size_t i = 0;
  while (i < word.size()) {
    bool truncated;
    size_t len = unicode::ValidSequenceLength(word, i, &truncated);
    if (len == 0) len = 1;
    piece.assign(word.substr(i, len));
    i += len;
    const auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      if (unk_pending) push(*options_.unk_id);
      unk_pending = false;
      push(it->second);
      continue;
    }
    if (!byte_tokens_.empty()) {
      bool all_bytes = true;
      for (char c : piece) all_bytes = all_bytes && byte_tokens_[static_cast<uint8_t>(c)] >= 0;
      if (all_bytes) {
        for (char c : piece) push(byte_tokens_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (options_.unk_id) {
      if (unk_pending && !options_.fuse_unk) push(*options_.unk_id);
      unk_pending = true;
    }
    // Without an unk token the character is dropped, as tokenizers does.
  }
  if (unk_pending) push(*options_.unk_id);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    const auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) consider(pos);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    const int32_t right_pos = left.next;
    const auto it = merges_.find(PairKey(left.id, symbols[right_pos].id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    Symbol& right = symbols[right_pos];
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (int32_t pos = 0; pos >= 0; pos = symbols[pos].next) ids->push_back(symbols[pos].id);
}

}  // namespace tandem
