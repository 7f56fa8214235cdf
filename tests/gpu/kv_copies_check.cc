// cuda_kernels_check's KV transfer rows: the re-shard's device copies (cuda_ipc's strided copies,
// NcclLink's staging rounds) against the host, and their time against one D2D memcpy.
#include <algorithm>
#include <functional>

#include "kvtransfer/nccl_packing.h"
#include "kvtransfer/sharded_copies.h"
#include "tests/gpu/check_util.h"

namespace tandem::cuda {
namespace {

// cuda_ipc's copies of a pull into a pool it can reach directly: one cudaMemcpyAsync a long
// contiguous range, the strided ones and short contiguous ones (under 8 KiB) in CopyRowsBatch
// launches (kvtransfer/cuda_ipc/cuda_ipc_transport.cc).
void IpcCopies(const std::vector<StridedCopy>& copies, const uint8_t* from,
               std::vector<DeviceBuffer>& pools, cudaStream_t s) {
  std::vector<RowCopy> strided;
  for (const StridedCopy& c : copies) {
    uint8_t* to = pools[c.local_pool].as<uint8_t>() + c.local_offset;
    if (c.rows > 1 || c.length < 8192)  // as cuda_ipc's kBatchedCopyBelow, peers with access
      strided.push_back({from + c.remote_offset, to, c.remote_stride, c.local_stride, c.length,
                         c.rows});
    else
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(to, from + c.remote_offset, c.length,
                                        cudaMemcpyDeviceToDevice, s));
  }
  Must(CopyRowsBatch(strided.data(), strided.size(), s), "CopyRowsBatch");
}

// NcclLink's copies of a pull, per pair and layer, the NCCL sends left out: the direct messages
// row by row (cudaMemcpyAsync stands in for their sends), each packed round gathered into
// `staging` and scattered out of it (CopyRowsBatch). Returns the rounds.
size_t PackedCopies(const std::vector<StridedCopy>& copies, const uint8_t* from,
                    std::vector<DeviceBuffer>& pools, DeviceBuffer& staging, int num_layers,
                    int num_pools, cudaStream_t s) {
  size_t rounds = 0;
  for (uint32_t pool = 0; pool < static_cast<uint32_t>(num_pools); ++pool)
    for (uint32_t layer = 0; layer < static_cast<uint32_t>(num_layers); ++layer) {
      std::vector<OrderedLink::Message> sent, received;
      for (const StridedCopy& c : copies) {
        if (c.local_pool != pool || c.layer != layer) continue;
        sent.push_back({layer, const_cast<uint8_t*>(from) + c.remote_offset, c.length, c.rows,
                        c.remote_stride});
        received.push_back({layer, pools[pool].as<uint8_t>() + c.local_offset, c.length, c.rows,
                            c.local_stride});
      }
      const LayerSends plan = PlanLayerSends(sent, staging.size());
      for (size_t m : plan.direct)
        for (uint64_t row = 0; row < sent[m].rows; ++row)
          TANDEM_CUDA_CHECK(cudaMemcpyAsync(
              static_cast<uint8_t*>(received[m].data) + row * received[m].stride,
              static_cast<const uint8_t*>(sent[m].data) + row * sent[m].stride, sent[m].bytes,
              cudaMemcpyDeviceToDevice, s));
      for (const PackRound& round : plan.rounds) {
        const std::vector<RowCopy> gather = GatherCopies(round, sent, staging.data());
        Must(CopyRowsBatch(gather.data(), gather.size(), s), "gather");
        const std::vector<RowCopy> scatter = ScatterCopies(round, received, staging.data());
        Must(CopyRowsBatch(scatter.data(), scatter.size(), s), "scatter");
        ++rounds;
      }
    }
  return rounds;
}

// The byte ranges of whole blocks, per layer, in a pool of `shape` (layer-major).
LayerRanges WholeBlocks(const KvPoolShape& shape, const std::vector<int32_t>& blocks) {
  const uint64_t block = shape.rank_layout().block_bytes();
  LayerRanges out(shape.full.num_layers);
  for (int l = 0; l < shape.full.num_layers; ++l)
    for (int32_t b : blocks)
      out[l].push_back({(uint64_t(l) * shape.num_blocks + b) * block, block});
  return out;
}

}  // namespace

// The KV transfer's device copies, on one GPU: a 1 -> 2 re-shard of runs of blocks as cuda_ipc
// copies it (PlanStridedCopies; the strided copies by CopyRowsBatch) and as NcclLink packs it
// (each layer's rounds gathered into a staging buffer and scattered out of it,
// kvtransfer/nccl_packing.h; the NCCL send between is left out), against the plan's pieces
// copied one by one on the host. The error is the count of bytes that differ.
void CheckStridedCopies(cudaStream_t s) {
  const KvLayout full{4, 4, 64, 16};
  const KvPoolShape one{full, 1, 32}, two{full, 2, 32};
  const LayerRanges remote = WholeBlocks(one, {3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  const LayerRanges local = WholeBlocks(two, {20, 21, 22, 23, 24, 7, 8, 9, 10, 11});
  const std::vector<CopyPiece> pieces = Must(PlanShardedCopies(remote, one, local, two), "plan");
  const std::vector<StridedCopy> copies = Must(PlanStridedCopies(remote, one, local, two), "plan");

  std::vector<uint8_t> src(one.pool_bytes());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(g_rng());
  std::vector<std::vector<uint8_t>> want(2, std::vector<uint8_t>(two.pool_bytes(), 0));
  for (const CopyPiece& p : pieces)
    std::memcpy(want[p.local_pool].data() + p.local_offset, src.data() + p.remote_offset, p.length);
  auto differing = [&](const std::vector<DeviceBuffer>& pools) {
    double bad = 0;
    for (int r = 0; r < 2; ++r) {
      const std::vector<uint8_t> got = Download<uint8_t>(pools[r], want[r].size());
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[r][i];
    }
    return bad;
  };
  auto zeroed_pools = [&] {
    std::vector<DeviceBuffer> pools;
    for (int r = 0; r < 2; ++r) pools.push_back(Upload(std::vector<uint8_t>(two.pool_bytes(), 0)));
    return pools;
  };
  const DeviceBuffer dsrc = Upload(src);
  const auto* from = dsrc.as<const uint8_t>();

  // cuda_ipc's way.
  std::vector<DeviceBuffer> pools = zeroed_pools();
  IpcCopies(copies, from, pools, s);
  Report("KV re-shard 1->2: " + std::to_string(copies.size()) + " strided copies for " +
             std::to_string(pieces.size()) + " pieces",
         differing(pools), 0.0);

  // NcclLink's way: per pair and layer, direct messages copied straight, the packed rounds
  // through a staging buffer of a few rows (so that layers take several rounds).
  pools = zeroed_pools();
  const uint64_t staging_bytes = 3 * 16 * 64 * sizeof(float);  // 3 rows of one head's K
  DeviceBuffer staging = Must(DeviceBuffer::Allocate(staging_bytes), "cudaMalloc");
  const size_t rounds = PackedCopies(copies, from, pools, staging, full.num_layers, 2, s);
  Report("KV re-shard 1->2 packed: " + std::to_string(rounds) + " staging rounds",
         differing(pools), 0.0);
}

// CopyRowsBatch's two paths against CopyRowsOnHost: copies whose addresses, pitches and widths
// are multiples of 16 (the 16-byte path, as KV head slices are) and copies with any of them odd
// (the byte path: a bf16 KV of head_dim 36 has 72-byte rows, and a packed round's offsets need
// not be aligned), more than one launch of them, some of one row, every byte compared.
void CheckRowCopies(cudaStream_t s) {
  const size_t pool = 1 << 20;
  std::vector<uint8_t> src(pool);
  for (uint8_t& b : src) b = static_cast<uint8_t>(g_rng());
  const DeviceBuffer dsrc = Upload(src);
  for (bool aligned : {true, false}) {
    std::uniform_int_distribution<uint64_t> rows(1, 12), width(1, 300), pad(0, 40);
    std::vector<RowCopy> host, device;
    uint64_t src_at = 0, dst_at = 0;
    for (size_t k = 0; k < 3 * kRowCopiesPerLaunch + 5; ++k) {
      const uint64_t round = aligned ? 16 : 1;
      RowCopy c;
      c.rows = rows(g_rng);
      c.width = (width(g_rng) + round - 1) / round * round;
      c.src_pitch = c.width + pad(g_rng) / round * round;
      c.dst_pitch = c.width + pad(g_rng) / round * round;
      src_at = (src_at + pad(g_rng)) / round * round;
      dst_at = (dst_at + pad(g_rng)) / round * round;
      if (src_at + c.rows * c.src_pitch > pool) src_at = 0;
      if (dst_at + c.rows * c.dst_pitch > pool) break;  // destinations never overlap
      c.src = src.data() + src_at;
      c.dst = reinterpret_cast<void*>(dst_at);  // an offset here; made a pointer below
      host.push_back(c);
      src_at += c.rows * c.src_pitch;
      dst_at += c.rows * c.dst_pitch;
    }
    std::vector<uint8_t> want(pool, 0);
    DeviceBuffer ddst = Upload(want);
    for (RowCopy c : host) {
      const uint64_t src_off = static_cast<const uint8_t*>(c.src) - src.data();
      const uint64_t dst_off = reinterpret_cast<uint64_t>(c.dst);
      c.src = dsrc.as<const uint8_t>() + src_off;
      c.dst = ddst.as<uint8_t>() + dst_off;
      device.push_back(c);
    }
    for (RowCopy& c : host) c.dst = want.data() + reinterpret_cast<uint64_t>(c.dst);
    CopyRowsOnHost(host);
    Must(CopyRowsBatch(device.data(), device.size(), s), "CopyRowsBatch");
    const std::vector<uint8_t> got = Download<uint8_t>(ddst, pool);
    double bad = 0;
    for (size_t i = 0; i < pool; ++i) bad += got[i] != want[i];
    Report(std::string("CopyRowsBatch vs host, ") + (aligned ? "16-byte" : "byte") + " path: " +
               std::to_string(device.size()) + " copies",
           bad, 0.0);
  }
}

// What the re-shard's copies cost on the device, at serving size: a 32k-token SmolLM2-shape
// request (30 layers, 3 KV heads of 64, 16-token blocks in runs of 8, bf16 KV as served)
// re-sharded 1 -> 3, all pools on this GPU. Timed: one cudaMemcpyAsync of the same bytes (the
// device's D2D rate), cuda_ipc's strided copies (CopyRowsBatch), and NcclLink's gather into a
// 16 MiB staging buffer and scatter out of it, round by round (the NCCL send between is left
// out). Printed as info rows for run.sh's table: the cost of packing against moving the bytes
// once.
void TimeStridedCopies(cudaStream_t s) {
  const KvLayout full{30, 3, 64, 16, KvDType::kBFloat16};
  const int blocks = 2048, pool_blocks = 2 * blocks;
  const KvPoolShape one{full, 1, pool_blocks}, three{full, 3, pool_blocks};
  std::vector<int32_t> from(blocks), to(blocks);
  for (int i = 0; i < blocks; ++i) {
    from[i] = (i / 8) * 16 + i % 8;  // runs of 8, with gaps between them
    to[i] = ((blocks / 8 - 1 - i / 8) * 16) + i % 8;  // the runs in another order
  }
  const std::vector<StridedCopy> copies =
      Must(PlanStridedCopies(WholeBlocks(one, from), one, WholeBlocks(three, to), three), "plan");
  uint64_t bytes = 0;
  for (const StridedCopy& c : copies) bytes += c.bytes();
  DeviceBuffer src = Must(DeviceBuffer::Allocate(one.pool_bytes()), "cudaMalloc");
  std::vector<DeviceBuffer> pools;
  for (int r = 0; r < 3; ++r)
    pools.push_back(Must(DeviceBuffer::Allocate(three.pool_bytes()), "cudaMalloc"));
  DeviceBuffer flat = Must(DeviceBuffer::Allocate(bytes), "cudaMalloc");
  DeviceBuffer staging = Must(DeviceBuffer::Allocate(kLinkStagingBytes), "cudaMalloc");
  const auto* base = src.as<uint8_t>();
  const double flat_s = MedianSeconds(s, [&] {
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(flat.data(), base, bytes, cudaMemcpyDeviceToDevice, s));
  });
  const double ipc_s = MedianSeconds(s, [&] { IpcCopies(copies, base, pools, s); });
  size_t rounds = 0;
  const double packed_s = MedianSeconds(s, [&] {
    rounds = PackedCopies(copies, base, pools, staging, full.num_layers, 3, s);
  });
  const double gb = bytes / 1e9;
  std::printf("ROW|KV re-shard copies: one D2D memcpy|info|%.1f MB in %.2f ms: %.0f GB/s\n",
              gb * 1e3, flat_s * 1e3, gb / flat_s);
  std::printf("ROW|KV re-shard copies: cuda_ipc|info|%zu strided copies in %.2f ms: %.0f GB/s "
              "(%.2fx the memcpy's time)\n",
              copies.size(), ipc_s * 1e3, gb / ipc_s, ipc_s / flat_s);
  std::printf("ROW|KV re-shard copies: NCCL packing|info|%zu rounds gathered + scattered in "
              "%.2f ms: %.0f GB/s each way (%.2fx the memcpy's time, both sides)\n",
              rounds, packed_s * 1e3, 2 * gb / packed_s, packed_s / flat_s);
}

}  // namespace tandem::cuda
