#include "decode/decode_scheduler.h"

namespace tandem {

size_t AdmitPulls(std::span<const int32_t> blocks_needed, const PullLimits& limits,
                  int32_t free_blocks, int32_t active) {
  size_t admitted = 0;
  for (int32_t need : blocks_needed) {
    if (active + static_cast<int32_t>(admitted) >= limits.max_batch_size) break;
    const int32_t used = limits.total_blocks - free_blocks;
    if (limits.total_blocks <= 0 ||
        static_cast<double>(used) >= limits.kv_usage_watermark * limits.total_blocks)
      break;
    if (need > free_blocks) break;
    free_blocks -= need;
    ++admitted;
  }
  return admitted;
}

}  // namespace tandem
