#include "common/engine/kv_cache.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

namespace tandem {
namespace {

TEST_CASE("BlockManager allocates all or nothing and counts references", "[kv_cache]") {
  BlockManager blocks(8);
  CHECK(blocks.num_free() == 8);
  std::vector<int32_t> a, b;
  REQUIRE(blocks.Allocate(3, &a).ok());
  CHECK(a.size() == 3);
  CHECK(blocks.num_free() == 5);
  Status s = blocks.Allocate(6, &b);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK(b.empty());  // all or nothing
  CHECK(blocks.num_free() == 5);
  REQUIRE(blocks.Allocate(5, &b).ok());
  CHECK(blocks.num_free() == 0);

  // A shared prefix block: two owners, freed only when both let go.
  blocks.AddRef(a[0]);
  CHECK(blocks.ref_count(a[0]) == 2);
  blocks.Free(a);
  CHECK(blocks.num_free() == 2);
  CHECK(blocks.ref_count(a[0]) == 1);
  blocks.Free(std::span<const int32_t>(&a[0], 1));
  CHECK(blocks.num_free() == 3);
  blocks.Free(b);
  CHECK(blocks.num_free() == 8);
  // Every id is handed out again exactly once.
  std::vector<int32_t> all;
  REQUIRE(blocks.Allocate(8, &all).ok());
  std::sort(all.begin(), all.end());
  for (int i = 0; i < 8; ++i) CHECK(all[i] == i);
}

TEST_CASE("KvCache layout: (layer, block) is one contiguous range", "[kv_cache]") {
  KvLayout layout{3, 2, 8, 4};
  auto cache = KvCache::Create(layout, 5);
  REQUIRE(cache.ok());
  KvCache& c = **cache;
  CHECK(c.block_bytes() == 2 * 2 * 4 * 8 * sizeof(float));
  CHECK(c.total_bytes() == c.block_bytes() * 5 * 3);
  for (int l = 0; l < 3; ++l) {
    for (int b = 0; b < 5; ++b) {
      const std::byte* base = reinterpret_cast<const std::byte*>(c.BlockData(l, b));
      CHECK(base - c.data() == static_cast<ptrdiff_t>((l * 5 + b) * c.block_bytes()));
      // K of head 1 and V of head 0 sit where the header says.
      CHECK(c.HeadData(l, b, 0, 1) == c.BlockData(l, b) + 1 * 4 * 8);
      CHECK(c.HeadData(l, b, 1, 0) == c.BlockData(l, b) + 2 * 4 * 8);
    }
  }
  CHECK(KvCache::Create(KvLayout{0, 2, 8, 4}, 5).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("KV export then import into another pool copies the blocks", "[kv_cache]") {
  KvLayout layout{2, 2, 4, 4};
  auto src = KvCache::Create(layout, 6);
  auto dst = KvCache::Create(layout, 9);
  REQUIRE(src.ok());
  REQUIRE(dst.ok());
  std::vector<int32_t> src_table = {4, 1, 3};
  for (int l = 0; l < 2; ++l)
    for (int32_t b : src_table) {
      float* p = (*src)->BlockData(l, b);
      for (size_t i = 0; i < layout.block_bytes() / 4; ++i) p[i] = l * 1000 + b * 100 + i * 0.5f;
    }
  std::vector<std::byte> bytes(ExportedKvBytes(layout, src_table.size()));
  REQUIRE(ExportBlocks(**src, src_table, bytes).ok());
  std::vector<int32_t> dst_table = {7, 0, 8};
  REQUIRE(ImportBlocks(**dst, dst_table, bytes).ok());
  for (int l = 0; l < 2; ++l)
    for (size_t i = 0; i < src_table.size(); ++i)
      CHECK(std::memcmp((*src)->BlockData(l, src_table[i]), (*dst)->BlockData(l, dst_table[i]),
                        layout.block_bytes()) == 0);

  // Size mismatch and bad ids are errors, not crashes.
  std::vector<std::byte> short_buffer(bytes.size() - 4);
  CHECK(ExportBlocks(**src, src_table, short_buffer).code() == StatusCode::kInvalidArgument);
  std::vector<int32_t> bad = {0, 9, 1};
  CHECK(ImportBlocks(**dst, bad, bytes).code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
