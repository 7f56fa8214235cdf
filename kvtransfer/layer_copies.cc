#include "kvtransfer/layer_copies.h"

#include <algorithm>

#include "common/base/status.h"

namespace tandem {

LayerCopyQueue::LayerCopyQueue(std::vector<CopyPiece> pieces, uint32_t num_layers)
    : pieces_(std::move(pieces)), layer_begin_(num_layers + size_t{1}, 0), num_layers_(num_layers) {
  // layer_begin_[l] = the number of pieces of layers below l.
  for (const CopyPiece& p : pieces_) {
    TANDEM_CHECK(p.layer < num_layers_, "a copy piece outside the layers");
    ++layer_begin_[p.layer + 1];
  }
  for (uint32_t l = 0; l < num_layers_; ++l) layer_begin_[l + 1] += layer_begin_[l];
  TANDEM_CHECK(std::is_sorted(pieces_.begin(), pieces_.end(),
                              [](const CopyPiece& a, const CopyPiece& b) { return a.layer < b.layer; }),
               "copy pieces must be layer-major");
}

std::vector<LayerBatch> LayerCopyQueue::Release(uint32_t available) {
  const uint32_t upto = std::min(available, num_layers_);
  std::vector<LayerBatch> batches;
  for (; released_ < upto; ++released_)
    batches.push_back({released_, layer_begin_[released_], layer_begin_[released_ + 1]});
  return batches;
}

}  // namespace tandem
