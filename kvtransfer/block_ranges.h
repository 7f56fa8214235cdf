// A request's KV blocks as the ranges a transfer moves: per layer, the byte range of each block
// in the KV pool (common/engine/kv_cache.h: a (layer, block) is one contiguous range), in the
// order of the request's block table. Blocks that follow each other in the table and in the pool
// (a run of ids: the BlockManager hands out the lowest free ids first) make one range, so that
// descriptors, NCCL pull orders and copy plans shrink by the run length.
// Host code: it computes offsets and never touches the pool's memory (which may be a GPU's).
#pragma once

#include <cstdint>
#include <span>

#include "common/engine/kv_cache.h"
#include "kvtransfer/transfer.h"

namespace tandem {

// Offsets from cache.data(); every layer has the same cuts (each range whole blocks).
LayerRanges KvBlockRanges(const KvCache& cache, std::span<const int32_t> blocks);

}  // namespace tandem
