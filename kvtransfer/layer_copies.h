// The bookkeeping of a layer-wise pull by copies (the in-process and CUDA IPC backends): which
// copies of a plan (PlanCopies' pieces, PlanStridedCopies' strided copies) may be
// copied now, and which layers a finished batch of copies completes.
//
//   LayerCopyQueue queue(pieces, num_layers);
//   for (const LayerBatch& b : queue.Release(available))   // layers [issued, available)
//     copy pieces [b.first, b.last), then report layer b.layer once they landed
//
// Layers are released in order and each once; a layer without pieces (nothing of it moves) is
// still a batch, so every layer is reported. Host code, shared by the backends and tested on
// the CPU; not thread-safe (its owner's lock guards it).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/base/status.h"
#include "kvtransfer/transfer.h"

namespace tandem {

struct LayerBatch {
  uint32_t layer = 0;
  size_t first = 0;  // pieces [first, last) of the queue's pieces
  size_t last = 0;
};

// `Copy`: anything with a `layer` (CopyPiece, StridedCopy).
template <class Copy>
class LayerQueue {
 public:
  // `copies`: layer-major, every layer < num_layers (PlanCopies', PlanStridedCopies' output).
  LayerQueue(std::vector<Copy> copies, uint32_t num_layers)
      : pieces_(std::move(copies)),
        layer_begin_(num_layers + size_t{1}, 0),
        num_layers_(num_layers) {
    // layer_begin_[l + 1] counts the copies of layers up to l.
    for (const Copy& c : pieces_) {
      TANDEM_CHECK(c.layer < num_layers_, "a copy outside the layers");
      ++layer_begin_[c.layer + 1];
    }
    for (uint32_t l = 0; l < num_layers_; ++l) layer_begin_[l + 1] += layer_begin_[l];
    TANDEM_CHECK(std::is_sorted(pieces_.begin(), pieces_.end(),
                                [](const Copy& a, const Copy& b) { return a.layer < b.layer; }),
                 "copies must be layer-major");
  }

  // The batches of the layers in [released_layers(), min(available, num_layers)), in order;
  // empty when none is new. kAllLayers releases every layer.
  std::vector<LayerBatch> Release(uint32_t available) {
    const uint32_t upto = std::min(available, num_layers_);
    std::vector<LayerBatch> batches;
    for (; released_ < upto; ++released_)
      batches.push_back({released_, layer_begin_[released_], layer_begin_[released_ + 1]});
    return batches;
  }

  const std::vector<Copy>& pieces() const { return pieces_; }
  uint32_t num_layers() const { return num_layers_; }
  uint32_t released_layers() const { return released_; }
  bool all_released() const { return released_ == num_layers_; }

 private:
  std::vector<Copy> pieces_;
  std::vector<size_t> layer_begin_;  // [num_layers + 1]: first copy of each layer
  uint32_t num_layers_ = 0;
  uint32_t released_ = 0;
};

using LayerCopyQueue = LayerQueue<CopyPiece>;

}  // namespace tandem
