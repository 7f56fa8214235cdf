// The bookkeeping of a layer-wise pull by copies (the in-process and CUDA IPC backends): which
// pieces of PlanCopies may be copied now, and which layers a finished batch of copies completes.
//
//   LayerCopyQueue queue(pieces, num_layers);
//   for (const LayerBatch& b : queue.Release(available))   // layers [issued, available)
//     copy pieces [b.first, b.last), then report layer b.layer once they landed
//
// Layers are released in order and each once; a layer without pieces (nothing of it moves) is
// still a batch, so every layer is reported. Host code, shared by the backends and tested on
// the CPU; not thread-safe (its owner's lock guards it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvtransfer/transfer.h"

namespace tandem {

struct LayerBatch {
  uint32_t layer = 0;
  size_t first = 0;  // pieces [first, last) of the queue's pieces
  size_t last = 0;
};

class LayerCopyQueue {
 public:
  // `pieces`: PlanCopies' output (layer-major, every layer < num_layers).
  LayerCopyQueue(std::vector<CopyPiece> pieces, uint32_t num_layers);

  // The batches of the layers in [released_layers(), min(available, num_layers)), in order;
  // empty when none is new. kAllLayers releases every layer.
  std::vector<LayerBatch> Release(uint32_t available);

  const std::vector<CopyPiece>& pieces() const { return pieces_; }
  uint32_t num_layers() const { return num_layers_; }
  uint32_t released_layers() const { return released_; }
  bool all_released() const { return released_ == num_layers_; }

 private:
  std::vector<CopyPiece> pieces_;
  std::vector<size_t> layer_begin_;  // [num_layers + 1]: first piece of each layer
  uint32_t num_layers_ = 0;
  uint32_t released_ = 0;
};

}  // namespace tandem
