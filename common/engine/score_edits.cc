#include "common/engine/score_edits.h"

#include <string>

// Compiled with -ffp-contract=off (CMakeLists.txt): each edit rounds as the device's does.

namespace tandem {

Status ApplyScoreEdits(std::span<float> row, std::span<const ScoreEdit> edits) {
  const size_t vocab = row.size();
  bool any_mask = false;
  for (const ScoreEdit& e : edits) {
    if (e.token_id < 0 || static_cast<size_t>(e.token_id) >= vocab)
      return InvalidArgument("score edit for token " + std::to_string(e.token_id) +
                             " outside a row of " + std::to_string(vocab));
    any_mask = any_mask || (e.flags & kEditMask);
  }
  for (const ScoreEdit& e : edits) row[e.token_id] = score_edits::Biased(row[e.token_id], e);
  // The mask holds only while a token outside it stays usable: usable tokens of the row minus
  // the usable masked ones (each listed once).
  bool mask = false;
  if (any_mask) {
    size_t usable = 0;
    for (float v : row) usable += score_edits::Usable(v);
    for (const ScoreEdit& e : edits)
      usable -= (e.flags & kEditMask) && score_edits::Usable(row[e.token_id]);
    mask = usable > 0;
  }
  for (const ScoreEdit& e : edits) {
    float score = row[e.token_id];
    if (mask && (e.flags & kEditMask)) score = -static_cast<float>(INFINITY);
    row[e.token_id] = score_edits::Penalised(score, e);
  }
  return Status::Ok();
}

Status ValidateScoreEdits(std::span<const ScoreEdit> edits, std::span<const int32_t> begin,
                          size_t rows, int32_t vocab) {
  if (begin.empty()) {
    if (!edits.empty()) return InvalidArgument("score edits without their rows' offsets");
    return Status::Ok();
  }
  if (begin.size() != rows + 1 || begin.front() != 0 ||
      begin.back() != static_cast<int32_t>(edits.size()))
    return InvalidArgument("score edit offsets do not match the batch");
  for (size_t i = 0; i < rows; ++i)
    if (begin[i + 1] < begin[i]) return InvalidArgument("score edit offsets decrease");
  for (const ScoreEdit& e : edits)
    if (e.token_id < 0 || e.token_id >= vocab)
      return InvalidArgument("score edit for token " + std::to_string(e.token_id) +
                             " outside the vocabulary of " + std::to_string(vocab));
  return Status::Ok();
}

}  // namespace tandem
