#include "common/engine/row_copy.h"

#include <cstring>

namespace tandem {

void CopyRowsOnHost(std::span<const RowCopy> copies) {
  for (const RowCopy& c : copies)
    for (uint64_t i = 0; i < c.rows; ++i)
      std::memcpy(static_cast<char*>(c.dst) + i * c.dst_pitch,
                  static_cast<const char*>(c.src) + i * c.src_pitch, c.width);
}

}  // namespace tandem
