// A strided copy described as data: `rows` rows of `width` bytes, row i from
// src + i * src_pitch to dst + i * dst_pitch. The KV transfer builds lists of them (a re-sharded
// head's slices of a run of blocks, kvtransfer/nccl_packing.h) and runs them on the host
// (CopyRowsOnHost: the CPU link of the tests) or on a GPU in one launch per batch
// (cuda::CopyRowsBatch, common/engine/cuda/kernels.h), instead of one copy call per row or
// per strided copy.
#pragma once

#include <cstdint>
#include <span>

namespace tandem {

struct RowCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  uint64_t src_pitch = 0;  // rows > 1: at least width
  uint64_t dst_pitch = 0;
  uint64_t width = 0;
  uint64_t rows = 0;
  uint64_t bytes() const { return width * rows; }
};

// memcpy row by row, in order (host memory).
void CopyRowsOnHost(std::span<const RowCopy> copies);

}  // namespace tandem
