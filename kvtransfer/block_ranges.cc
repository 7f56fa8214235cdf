#include "kvtransfer/block_ranges.h"

namespace tandem {

LayerRanges KvBlockRanges(const KvCache& cache, std::span<const int32_t> blocks) {
  const KvLayout& layout = cache.layout();
  const uint64_t block_bytes = layout.block_bytes();
  const std::byte* base = cache.data();
  LayerRanges ranges(layout.num_layers);
  for (int l = 0; l < layout.num_layers; ++l) {
    std::vector<ByteRange>& layer = ranges[l];
    for (int32_t b : blocks) {
      const auto offset = static_cast<uint64_t>(
          reinterpret_cast<const std::byte*>(cache.BlockData(l, b)) - base);
      if (!layer.empty() && layer.back().offset + layer.back().length == offset) {
        layer.back().length += block_bytes;  // the next block of a run
      } else {
        layer.push_back({offset, block_bytes});
      }
    }
  }
  return ranges;
}

}  // namespace tandem
