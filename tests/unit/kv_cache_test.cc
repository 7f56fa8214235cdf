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

TEST_CASE("BlockManager shares published prefix blocks until their last owner frees them",
          "[kv_cache]") {
  BlockManager blocks(8, /*block_size=*/4);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 2 full blocks + 2
  std::vector<int32_t> a;
  REQUIRE(blocks.Allocate(3, &a).ok());
  blocks.Publish(a[0], -1, std::span(prompt).subspan(0, 4));
  blocks.Publish(a[1], a[0], std::span(prompt).subspan(4, 4));
  blocks.Publish(a[1], a[0], std::span(prompt).subspan(4, 4));  // again: no effect
  CHECK(blocks.num_published() == 2);
  CHECK(blocks.FirstBlockKey(prompt) != 0);
  CHECK(blocks.FirstBlockKey(std::vector<int32_t>{1, 2, 3}) == 0);  // shorter than a block

  // The same prompt takes both blocks; max_blocks caps it; another prompt stops where it differs.
  std::vector<int32_t> b;
  CHECK(blocks.MatchPrefix(prompt, 8, &b) == 2);
  CHECK(b == std::vector<int32_t>{a[0], a[1]});
  CHECK(blocks.ref_count(a[0]) == 2);
  std::vector<int32_t> c;
  CHECK(blocks.MatchPrefix(prompt, 1, &c) == 1);
  CHECK(c == std::vector<int32_t>{a[0]});
  std::vector<int32_t> d;
  CHECK(blocks.MatchPrefix(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 0}, 8, &d) == 1);
  std::vector<int32_t> e;
  CHECK(blocks.MatchPrefix(std::vector<int32_t>{5, 6, 7, 8}, 8, &e) == 0);  // a block out of place
  CHECK(e.empty());
  // The same tokens after another first block are another block.
  std::vector<int32_t> f;
  REQUIRE(blocks.Allocate(1, &f).ok());
  blocks.Publish(f[0], -1, std::vector<int32_t>{0, 0, 0, 0});
  std::vector<int32_t> g;
  CHECK(blocks.MatchPrefix(std::vector<int32_t>{0, 0, 0, 0, 5, 6, 7, 8}, 8, &g) == 1);

  // Published blocks stay shared while any owner holds them; freed by the last, they stay
  // cached (counted free) until Allocate needs them.
  blocks.Free(a);
  for (auto* table : {&b, &c, &d, &g}) blocks.Free(*table);
  CHECK(blocks.num_published() == 3);
  CHECK(blocks.num_cached() == 2);  // a[0], a[1]; f[0] is still f's
  CHECK(blocks.num_free() == 7);
  std::vector<int32_t> h;
  CHECK(blocks.MatchPrefix(prompt, 8, &h) == 2);  // a cached prefix is taken back
  CHECK(h == std::vector<int32_t>{a[0], a[1]});
  CHECK(blocks.num_cached() == 0);
  CHECK(blocks.num_free() == 5);
  blocks.Free(h);
  blocks.Free(f);
  CHECK(blocks.num_cached() == 3);
  CHECK(blocks.num_free() == 8);

  // Allocate hands out never-published blocks first, then the least recently freed cached one.
  // A table is freed last block first, so a cached sequence loses its tail before its head: its
  // prefix stays matchable as long as it can.
  std::vector<int32_t> fresh;
  REQUIRE(blocks.Allocate(5, &fresh).ok());
  CHECK(blocks.num_cached() == 3);
  std::vector<int32_t> evicted;
  REQUIRE(blocks.Allocate(1, &evicted).ok());
  CHECK(evicted[0] == a[1]);
  CHECK(blocks.num_published() == 2);
  std::vector<int32_t> head;
  CHECK(blocks.MatchPrefix(prompt, 8, &head) == 1);
  CHECK(head == std::vector<int32_t>{a[0]});
  blocks.Free(head);
  // The evicted tail holds the second block's tokens again, now after no parent: it is another
  // block, and the prompt's chain does not go through it.
  blocks.Publish(evicted[0], -1, std::span(prompt).subspan(4, 4));
  std::vector<int32_t> i;
  CHECK(blocks.MatchPrefix(prompt, 8, &i) == 1);
  CHECK(i == std::vector<int32_t>{a[0]});
  blocks.Free(i);
  blocks.Free(fresh);
  blocks.Free(evicted);
  CHECK(blocks.num_free() == 8);
}

TEST_CASE("BlockManager gives freed blocks back in their table's order", "[kv_cache]") {
  BlockManager blocks(16);
  std::vector<int32_t> a, b;
  REQUIRE(blocks.Allocate(6, &a).ok());
  CHECK(a == std::vector<int32_t>{0, 1, 2, 3, 4, 5});  // a fresh pool: lowest ids first
  REQUIRE(blocks.Allocate(2, &b).ok());
  blocks.Free(a);
  // A run of adjacent blocks comes back as the same run, in order (one KV copy for the run).
  std::vector<int32_t> again;
  REQUIRE(blocks.Allocate(6, &again).ok());
  CHECK(again == a);
  blocks.Free(again);
  blocks.Free(b);
  CHECK(blocks.num_free() == 16);
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

TEST_CASE("a bfloat16 KV layout halves the block, and lives in device memory only",
          "[kv_cache]") {
  const KvLayout f32{3, 2, 8, 4};
  KvLayout bf16 = f32;
  bf16.dtype = KvDType::kBFloat16;
  CHECK(bf16.block_bytes() * 2 == f32.block_bytes());
  CHECK(bf16 != f32);  // pools of the two cannot exchange blocks
  CHECK(bf16.ToString() == "layers=3 kv_heads=2 head_dim=8 block_size=4 bf16");
  CHECK(KvPoolBytes(bf16, 10) * 2 == KvPoolBytes(f32, 10));
  // The CPU backend reads and writes float32 values: a bf16 pool in host memory is refused.
  CHECK(KvCache::Create(bf16, 5).status().message() ==
        "KV cache: a bfloat16 pool in host memory (the CPU backend keeps KV in float32)");
  // Device memory (the host only computes addresses in it): accepted, blocks at bf16 strides.
  StatusOr<KvPoolMemory> memory = AllocateKvPoolMemory(KvPoolBytes(bf16, 5));
  REQUIRE(memory.ok());
  memory->kind = KvMemoryKind::kCudaDevice;  // stands in for a device pool: nothing dereferenced
  auto cache = KvCache::Create(bf16, 5, std::move(*memory));
  REQUIRE(cache.ok());
  const std::byte* block = reinterpret_cast<const std::byte*>((*cache)->BlockData(2, 3));
  CHECK(block - (*cache)->data() == static_cast<ptrdiff_t>((2 * 5 + 3) * bf16.block_bytes()));
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
