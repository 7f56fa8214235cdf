// Helpers of the KV pool tests (kvtransfer_sharded_copies_test.cc,
// kvtransfer_nccl_protocol_test.cc): the ranges a block list makes in a pool.
#pragma once

#include <cstdint>
#include <vector>

#include "kvtransfer/sharded_copies.h"

namespace tandem::test {

// Whole-block ranges of `blocks` in every layer of a pool of `shape`, in the pools' layout
// (block b of layer l at (l * num_blocks + b) blocks).
inline LayerRanges WholeBlocks(const KvPoolShape& shape, const std::vector<int32_t>& blocks) {
  const uint64_t block = shape.rank_layout().block_bytes();
  LayerRanges out(shape.full.num_layers);
  for (int l = 0; l < shape.full.num_layers; ++l)
    for (int32_t b : blocks) out[l].push_back({(uint64_t(l) * shape.num_blocks + b) * block, block});
  return out;
}

}  // namespace tandem::test
