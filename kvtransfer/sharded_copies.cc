#include "kvtransfer/sharded_copies.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "common/engine/kv_reshard.h"
#include "common/engine/tensor_parallel.h"

namespace tandem {
namespace {

// KVP1: a float32 pool (the record older peers read); KVP2 adds the KV dtype.
constexpr char kShapeMagic[4] = {'K', 'V', 'P', '1'};
constexpr char kShapeMagicDType[4] = {'K', 'V', 'P', '2'};
constexpr size_t kShapeBytes = 4 + 6 * 4;
constexpr size_t kShapeDTypeBytes = 4 + 7 * 4;

std::string Str(uint64_t v) { return std::to_string(v); }

// The blocks of `ranges` (every layer the same blocks, whole-block ranges) in order, read from
// layer 0 and checked against the others. `side` names the side in errors.
StatusOr<std::vector<int32_t>> BlocksOf(const LayerRanges& ranges, const KvPoolShape& shape,
                                        const char* side) {
  const KvLayout layout = shape.rank_layout();
  const uint64_t block = layout.block_bytes();
  std::vector<int32_t> first;
  for (size_t l = 0; l < ranges.size(); ++l) {
    std::vector<int32_t> blocks;
    const uint64_t layer_begin = l * shape.num_blocks * block;
    for (const ByteRange& r : ranges[l]) {
      if (r.length == 0) continue;
      if (r.offset < layer_begin || r.offset % block != 0 || r.length % block != 0 ||
          r.offset + r.length > layer_begin + shape.num_blocks * block)
        return InvalidArgument(std::string("KV re-shard: the ") + side + " ranges of layer " +
                               Str(l) + " are not whole blocks of that layer (block of " +
                               Str(block) + " bytes)");
      for (uint64_t at = r.offset; at < r.offset + r.length; at += block)
        blocks.push_back(static_cast<int32_t>((at - layer_begin) / block));
    }
    if (l == 0) {
      first = std::move(blocks);
    } else if (blocks != first) {
      return InvalidArgument(std::string("KV re-shard: the ") + side + " ranges of layer " +
                             Str(l) + " name other blocks than layer 0's");
    }
  }
  return first;
}

}  // namespace

KvLayout KvPoolShape::rank_layout() const {
  KvLayout layout = full;
  layout.num_kv_heads = TpKvHeads(full.num_kv_heads, degree, 0).size();
  return layout;
}

uint64_t KvPoolShape::pool_bytes() const {
  return static_cast<uint64_t>(KvPoolBytes(rank_layout(), num_blocks));
}

Status KvPoolShape::Validate() const {
  if (full.num_layers < 1 || full.num_kv_heads < 1 || full.head_dim < 1 || full.block_size < 1 ||
      num_blocks < 1)
    return InvalidArgument("KV pool shape: empty layout (" + full.ToString() + ", " +
                           Str(num_blocks) + " blocks)");
  if (degree < 1 || (full.num_kv_heads % degree != 0 && degree % full.num_kv_heads != 0))
    return InvalidArgument("KV pool shape: tensor_parallel " + std::to_string(degree) +
                           " does not split " + Str(full.num_kv_heads) + " KV heads");
  return Status::Ok();
}

namespace {

// What both plans check first: valid shapes of one model.
Status CheckShapes(const KvPoolShape& remote_shape, const KvPoolShape& local_shape) {
  TANDEM_RETURN_IF_ERROR(remote_shape.Validate().WithContext("remote"));
  TANDEM_RETURN_IF_ERROR(local_shape.Validate().WithContext("local"));
  if (remote_shape.full != local_shape.full)
    return InvalidArgument("KV transfer between different models: remote " +
                           remote_shape.full.ToString() + ", local " +
                           local_shape.full.ToString());
  return Status::Ok();
}

// Between different degrees: both sides' blocks (layer 0's, the same in every layer) and the
// plan of which rank's heads go where.
struct Reshard {
  std::vector<int32_t> from, to;
  KvReshardPlan plan;
};
StatusOr<Reshard> PrepareReshard(const LayerRanges& remote, const KvPoolShape& remote_shape,
                                 const LayerRanges& local, const KvPoolShape& local_shape) {
  if (remote.size() != local.size() ||
      remote.size() != static_cast<size_t>(remote_shape.full.num_layers))
    return InvalidArgument("descriptor has " + Str(remote.size()) + " layers, local ranges have " +
                           Str(local.size()) + ", the model " +
                           Str(remote_shape.full.num_layers));
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> from, BlocksOf(remote, remote_shape, "remote"));
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> to, BlocksOf(local, local_shape, "local"));
  if (from.size() != to.size())
    return InvalidArgument("KV re-shard: remote has " + Str(from.size()) +
                           " blocks a layer, local ranges " + Str(to.size()));
  TANDEM_ASSIGN_OR_RETURN(KvReshardPlan plan, KvReshardPlan::Make(remote_shape.full,
                                                                  remote_shape.degree,
                                                                  local_shape.degree));
  return Reshard{std::move(from), std::move(to), std::move(plan)};
}

// The pieces that fill destination rank d's blocks `to` from the source ranks' `from`, layer
// by layer.
StatusOr<std::vector<CopyPiece>> ReshardPieces(const KvReshardPlan& plan, int d,
                                               std::span<const int32_t> from,
                                               std::span<const int32_t> to,
                                               const KvPoolShape& remote_shape,
                                               const KvPoolShape& local_shape) {
  const std::vector<KvRankBlocks> sources(remote_shape.degree,
                                          KvRankBlocks{remote_shape.num_blocks, from});
  TANDEM_ASSIGN_OR_RETURN(std::vector<KvRangeCopy> copies,
                          plan.Copies(d, sources, KvRankBlocks{local_shape.num_blocks, to}));
  std::vector<CopyPiece> pieces;
  pieces.reserve(copies.size());
  for (const KvRangeCopy& c : copies)
    pieces.push_back({static_cast<uint32_t>(c.layer), c.src_offset, c.dst_offset, c.length,
                      static_cast<uint32_t>(c.src_rank), static_cast<uint32_t>(d)});
  return pieces;
}

void SortByLayer(auto* copies) {
  std::stable_sort(copies->begin(), copies->end(),
                   [](const auto& a, const auto& b) { return a.layer < b.layer; });
}

}  // namespace

StatusOr<std::vector<CopyPiece>> PlanShardedCopies(const LayerRanges& remote,
                                                   const KvPoolShape& remote_shape,
                                                   const LayerRanges& local,
                                                   const KvPoolShape& local_shape) {
  TANDEM_RETURN_IF_ERROR(CheckShapes(remote_shape, local_shape));
  if (remote_shape.degree == local_shape.degree) {
    // Pool r to pool r: the same pieces in each.
    TANDEM_ASSIGN_OR_RETURN(std::vector<CopyPiece> one,
                            PlanCopies(remote, remote_shape.pool_bytes(), local,
                                       local_shape.pool_bytes()));
    std::vector<CopyPiece> pieces;
    pieces.reserve(one.size() * remote_shape.degree);
    for (const CopyPiece& p : one)  // layer-major already: keep it so, ranks inside a layer
      for (int r = 0; r < remote_shape.degree; ++r) {
        CopyPiece q = p;
        q.remote_pool = q.local_pool = static_cast<uint32_t>(r);
        pieces.push_back(q);
      }
    return pieces;
  }
  TANDEM_ASSIGN_OR_RETURN(Reshard r, PrepareReshard(remote, remote_shape, local, local_shape));
  std::vector<CopyPiece> pieces;
  for (int d = 0; d < local_shape.degree; ++d) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<CopyPiece> of_d,
                            ReshardPieces(r.plan, d, r.from, r.to, remote_shape, local_shape));
    pieces.insert(pieces.end(), of_d.begin(), of_d.end());
  }
  // Layer-major for LayerCopyQueue; within a layer, by destination rank as made.
  SortByLayer(&pieces);
  CoalesceCopies(&pieces);
  return pieces;
}

StatusOr<std::vector<StridedCopy>> PlanStridedCopies(const LayerRanges& remote,
                                                     const KvPoolShape& remote_shape,
                                                     const LayerRanges& local,
                                                     const KvPoolShape& local_shape) {
  TANDEM_RETURN_IF_ERROR(CheckShapes(remote_shape, local_shape));
  std::vector<StridedCopy> copies;
  auto one_row = [](const CopyPiece& p) {
    return StridedCopy{p.layer, p.remote_offset, p.local_offset, p.length, 1, 0, 0,
                       p.remote_pool, p.local_pool};
  };
  if (remote_shape.degree == local_shape.degree) {  // runs are whole pieces already
    TANDEM_ASSIGN_OR_RETURN(std::vector<CopyPiece> pieces,
                            PlanShardedCopies(remote, remote_shape, local, local_shape));
    copies.reserve(pieces.size());
    for (const CopyPiece& p : pieces) copies.push_back(one_row(p));
    return copies;
  }
  TANDEM_ASSIGN_OR_RETURN(Reshard r, PrepareReshard(remote, remote_shape, local, local_shape));
  const uint64_t remote_stride = remote_shape.rank_layout().block_bytes();
  const uint64_t local_stride = local_shape.rank_layout().block_bytes();
  // A run: blocks adjacent on both sides. Its first block's pieces, each repeated one block
  // further on both sides for every other block of the run, are the run's strided copies.
  for (int d = 0; d < local_shape.degree; ++d) {
    for (size_t begin = 0, end = 0; begin < r.from.size(); begin = end) {
      end = begin + 1;
      while (end < r.from.size() && r.from[end] == r.from[end - 1] + 1 &&
             r.to[end] == r.to[end - 1] + 1)
        ++end;
      const uint64_t rows = end - begin;
      TANDEM_ASSIGN_OR_RETURN(
          std::vector<CopyPiece> first,
          ReshardPieces(r.plan, d, std::span(r.from).subspan(begin, 1),
                        std::span(r.to).subspan(begin, 1), remote_shape, local_shape));
      CoalesceCopies(&first);  // one layer's heads that continue each other, within the block
      for (const CopyPiece& p : first) {
        StridedCopy c = one_row(p);
        if (rows > 1 && p.length == remote_stride && p.length == local_stride) {
          c.length *= rows;  // whole blocks on both sides: the run is one contiguous range
        } else if (rows > 1) {
          c.rows = rows;
          c.remote_stride = remote_stride;
          c.local_stride = local_stride;
        }
        copies.push_back(c);
      }
    }
  }
  SortByLayer(&copies);  // layer-major; within a layer by destination rank, run, head
  return copies;
}

std::string EncodeKvPoolShape(const KvPoolShape& shape) {
  const bool f32 = shape.full.dtype == KvDType::kFloat32;
  std::string out(f32 ? kShapeMagic : kShapeMagicDType, 4);
  std::vector<uint32_t> fields = {
      static_cast<uint32_t>(shape.degree),       static_cast<uint32_t>(shape.full.num_layers),
      static_cast<uint32_t>(shape.full.num_kv_heads), static_cast<uint32_t>(shape.full.head_dim),
      static_cast<uint32_t>(shape.full.block_size), static_cast<uint32_t>(shape.num_blocks)};
  if (!f32) fields.push_back(static_cast<uint32_t>(KvValueBytes(shape.full.dtype)));
  for (uint32_t u : fields)
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  return out;
}

StatusOr<KvPoolShape> DecodeKvPoolShape(std::string_view bytes, size_t* consumed) {
  const bool v1 = bytes.size() >= 4 && std::memcmp(bytes.data(), kShapeMagic, 4) == 0;
  const bool v2 = bytes.size() >= 4 && std::memcmp(bytes.data(), kShapeMagicDType, 4) == 0;
  const size_t size = v2 ? kShapeDTypeBytes : kShapeBytes;
  if ((!v1 && !v2) || bytes.size() < size)
    return InvalidArgument("KV pool shape: not a KVP1 or KVP2 record (" + Str(bytes.size()) +
                           " bytes)");
  uint32_t v[7] = {};
  for (size_t k = 0; k < (size - 4) / 4; ++k) {
    for (int i = 0; i < 4; ++i)
      v[k] |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[4 + 4 * k + i])) << (8 * i);
    if (v[k] > (1u << 30)) return InvalidArgument("KV pool shape: field out of range");
  }
  KvPoolShape shape;
  shape.degree = static_cast<int>(v[0]);
  shape.full = KvLayout{static_cast<int>(v[1]), static_cast<int>(v[2]), static_cast<int>(v[3]),
                        static_cast<int>(v[4])};
  shape.num_blocks = static_cast<int>(v[5]);
  if (v2) {
    if (v[6] != 2)  // bytes a value: only bfloat16 needs this record
      return InvalidArgument("KV pool shape: KV values of " + Str(v[6]) + " bytes");
    shape.full.dtype = KvDType::kBFloat16;
  }
  TANDEM_RETURN_IF_ERROR(shape.Validate());
  if (consumed != nullptr) *consumed = size;
  return shape;
}

std::string PackPoolKey(const PoolKey& key) {
  std::string out = EncodeKvPoolShape(key.shape);
  for (const std::string& h : key.handles) out += h;
  return out;
}

StatusOr<PoolKey> UnpackPoolKey(std::string_view blob, size_t handle_bytes) {
  size_t used = 0;
  PoolKey key;
  TANDEM_ASSIGN_OR_RETURN(key.shape, DecodeKvPoolShape(blob, &used));
  const size_t want = used + static_cast<size_t>(key.shape.degree) * handle_bytes;
  if (blob.size() != want)
    return InvalidArgument("pool key of " + Str(blob.size()) + " bytes; tensor_parallel " +
                           Str(key.shape.degree) + " needs " + Str(want));
  for (int r = 0; r < key.shape.degree; ++r)
    key.handles.emplace_back(blob.substr(used + r * handle_bytes, handle_bytes));
  return key;
}

}  // namespace tandem
