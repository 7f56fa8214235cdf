// PlanShardedCopies and the pool shape record: the host side of a KV transfer between
// tensor-parallel instances (the end-to-end re-shard through it: tensor_parallel_test.cc).
#include "kvtransfer/sharded_copies.h"
#include "tests/unit/kv_pool_util.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <type_traits>
#include <tuple>
#include <utility>
#include <vector>

namespace tandem {
namespace {

// 2 layers, 4 KV heads of 8 dims, blocks of 4 slots.
const KvLayout kFull{2, 4, 8, 4};

LayerRanges Ranges(const KvPoolShape& shape, const std::vector<int32_t>& blocks) {
  return test::WholeBlocks(shape, blocks);
}

TEST_CASE("PlanShardedCopies between equal degrees copies pool r to pool r", "[kvtransfer]") {
  const KvPoolShape from{kFull, 2, 8}, to{kFull, 2, 16};
  auto pieces = PlanShardedCopies(Ranges(from, {3, 4}), from, Ranges(to, {10, 2}), to);
  REQUIRE(pieces.ok());
  // Per layer: 2 blocks (not contiguous on the destination) x 2 ranks.
  REQUIRE(pieces->size() == 2 * 2 * 2);
  const uint64_t block = from.rank_layout().block_bytes();
  CHECK(block == 2 * 2 * 4 * 8 * 4);  // 2 of the 4 heads a rank
  for (size_t i = 0; i < pieces->size(); ++i) {
    const CopyPiece& p = (*pieces)[i];
    CHECK(p.layer == i / 4);
    CHECK(p.remote_pool == p.local_pool);
    CHECK(p.length == block);
  }
  CHECK((*pieces)[0].remote_offset == 3 * block);
  CHECK((*pieces)[0].local_offset == 10 * block);
  CHECK((*pieces)[4].remote_offset == (8 + 3) * block);  // layer 1 of an 8-block pool
}

TEST_CASE("PlanShardedCopies re-shards heads between degrees, layer by layer", "[kvtransfer]") {
  const KvPoolShape from{kFull, 1, 8}, to{kFull, 2, 8};
  auto pieces = PlanShardedCopies(Ranges(from, {0, 1}), from, Ranges(to, {5, 6}), to);
  REQUIRE(pieces.ok());
  uint32_t layer = 0;
  uint64_t moved = 0;
  for (const CopyPiece& p : *pieces) {
    CHECK(p.layer >= layer);  // ordered by layer
    layer = p.layer;
    CHECK(p.remote_pool == 0);
    CHECK(p.local_pool < 2);
    moved += p.length;
  }
  // Every byte of the source's two blocks in both layers lands once.
  CHECK(moved == 2 * 2 * from.rank_layout().block_bytes());
}

TEST_CASE("PlanShardedCopies refuses what it cannot map", "[kvtransfer]") {
  const KvPoolShape one{kFull, 1, 8}, two{kFull, 2, 8};
  // Re-sharding needs whole blocks.
  LayerRanges half = Ranges(one, {1});
  for (auto& layer : half) layer[0].length /= 2;
  LayerRanges half_dst = Ranges(two, {1});
  for (auto& layer : half_dst) layer[0].length /= 4;
  CHECK(PlanShardedCopies(half, one, half_dst, two).status().message().starts_with(
      "KV re-shard: the remote ranges of layer 0 are not whole blocks"));
  // Different block counts.
  CHECK(PlanShardedCopies(Ranges(one, {1, 2}), one, Ranges(two, {3}), two).status().message() ==
        "KV re-shard: remote has 2 blocks a layer, local ranges 1");
  // Another model.
  KvPoolShape other = two;
  other.full.head_dim = 16;
  CHECK(PlanShardedCopies(Ranges(one, {1}), one, Ranges(other, {1}), other)
            .status()
            .message()
            .starts_with("KV transfer between different models"));
  // A degree that does not split the heads.
  KvPoolShape three{kFull, 3, 8};
  CHECK(PlanShardedCopies(Ranges(one, {1}), one, Ranges(two, {1}), three).status().message() ==
        "local: KV pool shape: tensor_parallel 3 does not split 4 KV heads");
}

// The pieces of `copies`, row by row, sorted (the order within a layer changes).
std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uint64_t, uint32_t, uint32_t>> Rows(
    const std::vector<StridedCopy>& copies) {
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uint64_t, uint32_t, uint32_t>> out;
  for (const StridedCopy& c : copies)
    for (uint64_t i = 0; i < c.rows; ++i) {
      const CopyPiece p = c.row(i);
      out.emplace_back(p.layer, p.remote_offset, p.local_offset, p.length, p.remote_pool,
                       p.local_pool);
    }
  std::sort(out.begin(), out.end());
  return out;
}
std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uint64_t, uint32_t, uint32_t>> Rows(
    const std::vector<CopyPiece>& pieces) {
  std::vector<StridedCopy> ones;
  for (const CopyPiece& p : pieces)
    ones.push_back({p.layer, p.remote_offset, p.local_offset, p.length, 1, 0, 0, p.remote_pool,
                    p.local_pool});
  return Rows(ones);
}

TEST_CASE("re-sharding a run of blocks is one strided copy per head slice, K/V and layer",
          "[kvtransfer]") {
  const KvPoolShape one{kFull, 1, 16}, two{kFull, 2, 16};
  const LayerRanges remote = Ranges(one, {2, 3, 4, 5}), local = Ranges(two, {8, 9, 10, 11});
  StatusOr<std::vector<CopyPiece>> pieces = PlanShardedCopies(remote, one, local, two);
  StatusOr<std::vector<StridedCopy>> copies = PlanStridedCopies(remote, one, local, two);
  REQUIRE(pieces.ok());
  REQUIRE(copies.ok());
  // A layer: 4 blocks x K/V x 2 destination ranks (each takes 2 adjacent heads of the source
  // block in one piece) = 16 pieces; grouped, the 4 blocks are the rows of one copy.
  CHECK(pieces->size() == 2 * 16);
  REQUIRE(copies->size() == 2 * 4);
  uint32_t layer = 0;
  for (const StridedCopy& c : *copies) {
    CHECK(c.layer >= layer);  // still layer-major
    layer = c.layer;
    CHECK(c.rows == 4);
    CHECK(c.remote_stride == one.rank_layout().block_bytes());
    CHECK(c.local_stride == two.rank_layout().block_bytes());
    CHECK(c.length == 2 * 4 * 8 * sizeof(float));  // 2 heads of 4 slots of 8 dims
  }
  CHECK(Rows(*copies) == Rows(*pieces));  // the same bytes from and to the same places

  // A run broken on one side breaks the rows there: 2 + 2.
  const LayerRanges broken = Ranges(one, {2, 3, 7, 8});
  copies = PlanStridedCopies(broken, one, local, two);
  REQUIRE(copies.ok());
  CHECK(copies->size() == 2 * 8);
  for (const StridedCopy& c : *copies) CHECK(c.rows == 2);
  CHECK(Rows(*copies) == Rows(PlanShardedCopies(broken, one, local, two).value()));

  // Equal degrees: the runs are whole pieces already, nothing to group.
  pieces = PlanShardedCopies(Ranges(two, {1, 2, 6}), two, Ranges(two, {3, 4, 9}), two);
  copies = PlanStridedCopies(Ranges(two, {1, 2, 6}), two, Ranges(two, {3, 4, 9}), two);
  REQUIRE(copies.ok());
  CHECK(copies->size() == pieces->size());
  for (const StridedCopy& c : *copies) CHECK(c.rows == 1);
  CHECK(Rows(*copies) == Rows(*pieces));
}

// Both plans applied to byte pools: the destination pools they leave.
template <class Copy>
std::vector<std::vector<uint8_t>> Apply(const std::vector<Copy>& copies,
                                        const std::vector<std::vector<uint8_t>>& sources,
                                        int degree, uint64_t pool_bytes) {
  std::vector<std::vector<uint8_t>> out(degree, std::vector<uint8_t>(pool_bytes, 0));
  for (const Copy& c : copies) {
    uint64_t rows = 1, rs = 0, ls = 0;
    if constexpr (std::is_same_v<Copy, StridedCopy>) rows = c.rows, rs = c.remote_stride,
                                                      ls = c.local_stride;
    for (uint64_t i = 0; i < rows; ++i) {
      REQUIRE(c.local_offset + i * ls + c.length <= pool_bytes);
      std::memcpy(out[c.local_pool].data() + c.local_offset + i * ls,
                  sources[c.remote_pool].data() + c.remote_offset + i * rs, c.length);
    }
  }
  return out;
}

TEST_CASE("strided copies move the same bytes as the pieces, whatever the runs and degrees",
          "[kvtransfer]") {
  std::mt19937 rng(5);
  const KvLayout full{3, 4, 2, 2};  // 3 layers, 4 KV heads of 2 dims, blocks of 2 slots
  const std::vector<std::pair<int, int>> degrees = {{1, 2}, {2, 1}, {1, 4}, {4, 2}, {2, 8},
                                                    {8, 1}, {1, 8}, {4, 8}, {2, 2}};
  for (int trial = 0; trial < 60; ++trial) {
    const auto [from, to] = degrees[trial % degrees.size()];
    const KvPoolShape remote{full, from, 24}, local{full, to, 24};
    // Runs of random lengths at random places on each side, cut independently.
    auto blocks_of = [&](int n) {
      std::vector<int32_t> ids(24);
      std::iota(ids.begin(), ids.end(), 0);
      std::vector<int32_t> out;
      int32_t at = static_cast<int32_t>(rng() % 4);
      while (static_cast<int>(out.size()) < n) {
        if (at >= 24 || rng() % 3 == 0) at = static_cast<int32_t>(rng() % 24);
        if (std::find(out.begin(), out.end(), at) == out.end()) out.push_back(at);
        ++at;
      }
      return out;
    };
    const int n = 1 + static_cast<int>(rng() % 12);
    const LayerRanges r = Ranges(remote, blocks_of(n)), l = Ranges(local, blocks_of(n));
    auto pieces = PlanShardedCopies(r, remote, l, local);
    auto copies = PlanStridedCopies(r, remote, l, local);
    REQUIRE(pieces.ok());
    REQUIRE(copies.ok());
    CHECK(copies->size() <= pieces->size());
    for (size_t i = 1; i < copies->size(); ++i) CHECK((*copies)[i - 1].layer <= (*copies)[i].layer);
    std::vector<std::vector<uint8_t>> sources(from, std::vector<uint8_t>(remote.pool_bytes()));
    for (auto& pool : sources)
      for (uint8_t& b : pool) b = static_cast<uint8_t>(rng());
    CHECK(Apply(*copies, sources, to, local.pool_bytes()) ==
          Apply(*pieces, sources, to, local.pool_bytes()));
  }
}

TEST_CASE("bfloat16 pools re-shard the same values at half the bytes", "[kvtransfer]") {
  KvLayout half = kFull;
  half.dtype = KvDType::kBFloat16;
  for (auto [from, to] : {std::pair{1, 2}, std::pair{2, 1}, std::pair{2, 4}, std::pair{2, 2}}) {
    const KvPoolShape f_from{kFull, from, 8}, f_to{kFull, to, 8};
    const KvPoolShape h_from{half, from, 8}, h_to{half, to, 8};
    auto f = PlanShardedCopies(Ranges(f_from, {1, 2, 6}), f_from, Ranges(f_to, {3, 4, 0}), f_to);
    auto h = PlanShardedCopies(Ranges(h_from, {1, 2, 6}), h_from, Ranges(h_to, {3, 4, 0}), h_to);
    REQUIRE(f.ok());
    REQUIRE(h.ok());
    REQUIRE(f->size() == h->size());
    for (size_t i = 0; i < f->size(); ++i) {  // every offset and length scales by 4 / 2
      CHECK((*h)[i].remote_offset * 2 == (*f)[i].remote_offset);
      CHECK((*h)[i].local_offset * 2 == (*f)[i].local_offset);
      CHECK((*h)[i].length * 2 == (*f)[i].length);
      CHECK((*h)[i].remote_pool == (*f)[i].remote_pool);
      CHECK((*h)[i].local_pool == (*f)[i].local_pool);
    }
  }
  // A float32 pool and a bfloat16 one do not exchange blocks.
  const KvPoolShape f32{kFull, 1, 8}, bf16{half, 1, 8};
  CHECK(PlanShardedCopies(Ranges(f32, {1}), f32, Ranges(bf16, {1}), bf16)
            .status()
            .message()
            .starts_with("KV transfer between different models"));
}

TEST_CASE("the pool shape record round-trips and refuses garbage", "[kvtransfer]") {
  const KvPoolShape shape{KvLayout{30, 3, 64, 16}, 3, 1234};
  const std::string bytes = EncodeKvPoolShape(shape) + "tail";
  size_t used = 0;
  auto back = DecodeKvPoolShape(bytes, &used);
  REQUIRE(back.ok());
  CHECK(*back == shape);
  CHECK(used == 28);
  CHECK_FALSE(DecodeKvPoolShape(bytes.substr(0, 27), &used).ok());
  CHECK_FALSE(DecodeKvPoolShape("XXXX" + bytes.substr(4), &used).ok());
  // bfloat16: the KVP2 record, 4 bytes longer; float32 keeps KVP1 (what older peers read).
  KvPoolShape half = shape;
  half.full.dtype = KvDType::kBFloat16;
  const std::string bf16 = EncodeKvPoolShape(half);
  CHECK(bf16.size() == 32);
  CHECK(bf16.substr(0, 4) == "KVP2");
  CHECK(EncodeKvPoolShape(shape).substr(0, 4) == "KVP1");
  back = DecodeKvPoolShape(bf16 + "tail", &used);
  REQUIRE(back.ok());
  CHECK(*back == half);
  CHECK(used == 32);
  CHECK_FALSE(DecodeKvPoolShape(bf16.substr(0, 31), &used).ok());
  std::string odd = bf16;
  odd[28] = 3;  // 3-byte values
  CHECK(DecodeKvPoolShape(odd, &used).status().message() == "KV pool shape: KV values of 3 bytes");
  KvPoolShape bad = shape;
  bad.degree = 2;  // does not split 3 heads
  CHECK(DecodeKvPoolShape(EncodeKvPoolShape(bad), &used).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("a pool key carries the shape and one handle per pool", "[kvtransfer]") {
  PoolKey key{KvPoolShape{kFull, 2, 8}, {std::string(64, 'a'), std::string(64, 'b')}};
  const std::string blob = PackPoolKey(key);
  CHECK(blob.size() == 28 + 2 * 64);
  auto back = UnpackPoolKey(blob, 64);
  REQUIRE(back.ok());
  CHECK(back->shape == key.shape);
  CHECK(back->handles == key.handles);
  CHECK(UnpackPoolKey(blob.substr(0, blob.size() - 1), 64).status().message() ==
        "pool key of 155 bytes; tensor_parallel 2 needs 156");
  CHECK_FALSE(UnpackPoolKey(blob + "x", 64).ok());
  CHECK_FALSE(UnpackPoolKey(std::string(64, 'a'), 64).ok());  // a bare handle: no shape
}

}  // namespace
}  // namespace tandem
