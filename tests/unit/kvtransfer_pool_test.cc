// KV pools whose memory the UCX transport allocated (what the servers run on when
// transfer.backend is ucx), and per-layer completion of pulls.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "common/engine/kv_cache.h"
#include "kvtransfer/block_ranges.h"
#include "kvtransfer/factory.h"
#include "kvtransfer/ucx_capabilities.h"
#include "kvtransfer/transfer.h"
#include "kvtransfer/ucx_transport.h"
#include "tests/test_ucx.h"
#include "kvtransfer/wire.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

TEST_CASE("KvCache lives in memory it is given and keeps it alive", "[kv_cache]") {
  KvLayout layout{2, 2, 8, 4};
  const size_t bytes = KvPoolBytes(layout, 6);
  auto memory = AllocateKvPoolMemory(bytes);
  REQUIRE(memory.ok());
  std::memset(memory->base, 0xab, memory->bytes);
  std::weak_ptr<void> alive = memory->owner;
  std::byte* base = memory->base;

  KvPoolMemory small = *memory;
  small.bytes = bytes - 1;
  CHECK(KvCache::Create(layout, 6, small).status().code() == StatusCode::kInvalidArgument);
  KvPoolMemory misaligned = *memory;
  misaligned.base += 4;
  CHECK(KvCache::Create(layout, 6, misaligned).status().code() == StatusCode::kInvalidArgument);

  auto cache = KvCache::Create(layout, 6, std::move(*memory));
  REQUIRE(cache.ok());
  CHECK((*cache)->data() == base);
  CHECK(std::all_of(base, base + bytes, [](std::byte b) { return b == std::byte{0}; }));
  small = {};
  misaligned = {};
  CHECK(!alive.expired());  // the cache holds it
  cache->reset();
  CHECK(alive.expired());
}

TEST_CASE("kvtransfer: caches in UCX-allocated pools exchange blocks, either side going first",
          "[kvtransfer]") {
  std::string tls = GENERATE(as<std::string>{}, "tcp", "sm,self");
  INFO("tls " << tls);
  KvLayout layout{3, 2, 16, 4};  // 2 KiB blocks
  constexpr int kBlocks = 32;
  UcxOptions options = test::TestUcxOptions(tls);
  options.timeout = 5000ms;
  auto src_pool = AllocateUcxPool(KvPoolBytes(layout, kBlocks), options);
  auto dst_pool = AllocateUcxPool(KvPoolBytes(layout, kBlocks), options);
  REQUIRE(src_pool.ok());
  REQUIRE(dst_pool.ok());
  CHECK((*src_pool)->tls() == tls);
  auto publisher = CreateUcxPublisher(*src_pool, options);
  auto puller = CreateUcxPuller(*dst_pool, options);
  REQUIRE(publisher.ok());
  REQUIRE(puller.ok());
  auto as_memory = [](const std::shared_ptr<UcxPool>& pool) {
    KvPoolMemory m;
    m.base = static_cast<std::byte*>(pool->region().base);
    m.bytes = pool->region().bytes;
    m.owner = pool;
    return m;
  };
  auto src = KvCache::Create(layout, kBlocks, as_memory(*src_pool));
  auto dst = KvCache::Create(layout, kBlocks, as_memory(*dst_pool));
  REQUIRE(src.ok());
  REQUIRE(dst.ok());
  src_pool->reset();
  dst_pool->reset();

  std::mt19937_64 rng(7);
  std::vector<int32_t> src_table = {3, 9, 4, 31, 0}, dst_table = {30, 1, 2, 17, 8};
  for (int l = 0; l < layout.num_layers; ++l)
    for (int32_t b : src_table)
      for (size_t i = 0; i < (*src)->block_bytes() / sizeof(float); ++i)
        (*src)->BlockData(l, b)[i] = static_cast<float>(rng() % 1000);
  auto ranges = [&](KvCache& c, const std::vector<int32_t>& table) {
    LayerRanges r(layout.num_layers);
    for (int l = 0; l < layout.num_layers; ++l)
      for (int32_t b : table)
        r[l].push_back(
            {static_cast<uint64_t>(reinterpret_cast<std::byte*>(c.BlockData(l, b)) - c.data()),
             c.block_bytes()});
    return r;
  };
  REQUIRE((*puller)->Connect((*publisher)->peer_info()).ok());
  auto d = (*publisher)->Publish("r", ranges(**src, src_table), [](auto&, auto&) {});
  REQUIRE(d.ok());
  PullWaiter waiter;
  REQUIRE((*puller)->Pull(*d, ranges(**dst, dst_table), waiter.callbacks()).ok());
  REQUIRE(waiter.Wait(5000ms).ok());
  for (int l = 0; l < layout.num_layers; ++l)
    for (size_t i = 0; i < src_table.size(); ++i)
      CHECK(std::memcmp((*src)->BlockData(l, src_table[i]), (*dst)->BlockData(l, dst_table[i]),
                        (*src)->block_bytes()) == 0);

  // The transport goes first: the caches' memory stays valid (they own a share of it).
  publisher->reset();
  puller->reset();
  (*dst)->BlockData(2, 17)[0] = 1.5f;
  CHECK((*dst)->BlockData(2, 17)[0] == 1.5f);
}

TEST_CASE("kvtransfer: layers complete in order, each whole when reported", "[kvtransfer]") {
  std::string tls = GENERATE(as<std::string>{}, "tcp", "sm,self");
  INFO("tls " << tls);
  constexpr int kLayers = 8;
  constexpr size_t kBlockBytes = 8192;
  constexpr size_t kBlocksPerLayer = 64;
  constexpr size_t kBytes = kLayers * kBlocksPerLayer * kBlockBytes;  // 4 MiB
  UcxOptions options = test::TestUcxOptions(tls);
  options.timeout = 5000ms;
  options.max_inflight_gets = 16;  // fewer than a layer's gets: layers finish one after another
  auto src_pool = AllocateUcxPool(kBytes, options);
  auto dst_pool = AllocateUcxPool(kBytes, options);
  REQUIRE(src_pool.ok());
  REQUIRE(dst_pool.ok());
  auto publisher = CreateUcxPublisher(*src_pool, options);
  auto puller = CreateUcxPuller(*dst_pool, options);
  REQUIRE(publisher.ok());
  REQUIRE(puller.ok());
  REQUIRE((*puller)->Connect((*publisher)->peer_info()).ok());
  auto* src = static_cast<uint8_t*>((*src_pool)->region().base);
  auto* dst = static_cast<uint8_t*>((*dst_pool)->region().base);
  std::mt19937_64 rng(11);
  for (size_t i = 0; i < kBytes; ++i) src[i] = static_cast<uint8_t>(rng());

  for (int round = 0; round < 5; ++round) {
    std::memset(dst, 0, kBytes);
    // Scattered blocks on both sides, as in a used pool.
    std::vector<uint32_t> ids(kBlocksPerLayer);
    for (uint32_t i = 0; i < kBlocksPerLayer; ++i) ids[i] = i;
    LayerRanges remote(kLayers), local(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      std::shuffle(ids.begin(), ids.end(), rng);
      for (size_t b = 0; b < kBlocksPerLayer; ++b) {
        remote[l].push_back({(l * kBlocksPerLayer + ids[b]) * kBlockBytes, kBlockBytes});
        local[l].push_back({(l * kBlocksPerLayer + b) * kBlockBytes, kBlockBytes});
      }
    }
    std::string id = "r" + std::to_string(round);
    auto d = (*publisher)->Publish(id, remote, [](auto&, auto&) {});
    REQUIRE(d.ok());
    // on_layer runs on the progress thread: check the layer's bytes right there.
    std::mutex mutex;
    std::vector<uint32_t> order;
    std::vector<bool> whole;
    PullWaiter waiter;
    PullCallbacks callbacks = waiter.callbacks();
    auto waiter_on_layer = callbacks.on_layer;
    callbacks.on_layer = [&, waiter_on_layer](uint32_t layer) {
      bool ok = true;
      for (size_t b = 0; b < kBlocksPerLayer; ++b)
        ok = ok && std::memcmp(dst + local[layer][b].offset, src + remote[layer][b].offset,
                               kBlockBytes) == 0;
      {
        std::lock_guard<std::mutex> lock(mutex);
        order.push_back(layer);
        whole.push_back(ok);
      }
      if (waiter_on_layer) waiter_on_layer(layer);
    };
    REQUIRE((*puller)->Pull(*d, local, callbacks).ok());
    REQUIRE(waiter.Wait(5000ms).ok());
    std::lock_guard<std::mutex> lock(mutex);
    REQUIRE(order.size() == kLayers);
    for (uint32_t l = 0; l < kLayers; ++l) {
      CHECK(order[l] == l);
      CHECK(whole[l]);
    }
  }
}

TEST_CASE("kvtransfer factory: pools from the transport, per-layer completion to decode",
          "[kvtransfer]") {
  // What the servers do: the factory gives each side its KV pool's memory; decode sees layers.
  std::string backend = GENERATE(as<std::string>{}, "ucx-sm", "ucx-tcp", "inproc");
  INFO("backend " << backend);
  KvLayout layout{4, 2, 16, 16};  // 8 KiB blocks
  constexpr int kBlocks = 16;
  TransferSection transfer;
  transfer.backend = backend == "inproc" ? "inproc" : "ucx";
  transfer.ucx_tls = backend == "ucx-sm" ? "sm,self" : "tcp";
  TransferFactoryOptions options;
  options.secret = test::kTestClusterSecret;
  auto publish = CreatePublisherWithPool(transfer, KvPoolBytes(layout, kBlocks), options);
  REQUIRE(publish.ok());
  auto pull = CreatePullerWithPool(transfer, KvPoolBytes(layout, kBlocks), options);
  REQUIRE(pull.ok());
  auto src = KvCache::Create(layout, kBlocks, publish->pools.at(0));
  auto dst = KvCache::Create(layout, kBlocks, pull->pools.at(0));
  REQUIRE(src.ok());
  REQUIRE(dst.ok());
  std::vector<int32_t> src_table = {5, 2, 11}, dst_table = {0, 15, 7};
  LayerRanges src_ranges(layout.num_layers), dst_ranges(layout.num_layers);
  std::mt19937 rng(3);
  for (int l = 0; l < layout.num_layers; ++l) {
    for (size_t i = 0; i < src_table.size(); ++i) {
      float* p = (*src)->BlockData(l, src_table[i]);
      for (size_t f = 0; f < (*src)->block_bytes() / sizeof(float); ++f)
        p[f] = static_cast<float>(rng() % 4096);
      auto offset = [](KvCache& c, int layer, int32_t b) {
        return static_cast<uint64_t>(reinterpret_cast<std::byte*>(c.BlockData(layer, b)) -
                                     c.data());
      };
      src_ranges[l].push_back({offset(**src, l, src_table[i]), (*src)->block_bytes()});
      dst_ranges[l].push_back({offset(**dst, l, dst_table[i]), (*dst)->block_bytes()});
    }
  }
  auto descriptor = publish->publisher->Publish("r", src_ranges, [](auto&, auto&) {});
  REQUIRE(descriptor.ok());
  // The blobs travel over the control plane as the servers send them.
  auto peer = DecodePeerInfo(AsBytes(Encode(publish->publisher->peer_info())));
  auto desc = DecodeKvDescriptor(AsBytes(Encode(*descriptor)));
  REQUIRE(peer.ok());
  REQUIRE(desc.ok());
  REQUIRE(pull->puller->Connect(*peer).ok());
  std::mutex mutex;
  std::vector<uint32_t> order;
  std::vector<bool> whole;
  PullWaiter waiter;
  PullCallbacks callbacks = waiter.callbacks();
  callbacks.on_layer = [&](uint32_t layer) {
    bool ok = true;
    for (size_t i = 0; i < src_table.size(); ++i)
      ok = ok && std::memcmp((*src)->BlockData(layer, src_table[i]),
                             (*dst)->BlockData(layer, dst_table[i]), (*src)->block_bytes()) == 0;
    std::lock_guard<std::mutex> lock(mutex);
    order.push_back(layer);
    whole.push_back(ok);
  };
  REQUIRE(pull->puller->Pull(*desc, dst_ranges, callbacks).ok());
  REQUIRE(waiter.Wait(5000ms).ok());
  std::lock_guard<std::mutex> lock(mutex);
  REQUIRE(order.size() == static_cast<size_t>(layout.num_layers));
  for (uint32_t l = 0; l < order.size(); ++l) {
    CHECK(order[l] == l);
    CHECK(whole[l]);
  }
}

TEST_CASE("kvtransfer: a request's blocks are one range per run of adjacent ids", "[kvtransfer]") {
  KvLayout layout{3, 2, 8, 4};
  auto cache = KvCache::Create(layout, 16);
  REQUIRE(cache.ok());
  const uint64_t block = layout.block_bytes();
  // Blocks 3, 4, 5 then 9, 10 then 2 (before 3 in the pool, after it in the table).
  const std::vector<int32_t> table = {3, 4, 5, 9, 10, 2};
  const LayerRanges ranges = KvBlockRanges(**cache, table);
  REQUIRE(ranges.size() == 3);
  for (int l = 0; l < 3; ++l) {
    INFO("layer " << l);
    const uint64_t layer = static_cast<uint64_t>(l) * 16 * block;
    REQUIRE(ranges[l].size() == 3);
    CHECK(ranges[l][0].offset == layer + 3 * block);
    CHECK(ranges[l][0].length == 3 * block);
    CHECK(ranges[l][1].offset == layer + 9 * block);
    CHECK(ranges[l][1].length == 2 * block);
    CHECK(ranges[l][2].offset == layer + 2 * block);
    CHECK(ranges[l][2].length == block);
  }
  // The same bytes, in the same order, as a range per block.
  LayerRanges per_block(3);
  for (int l = 0; l < 3; ++l)
    for (int32_t b : table)
      per_block[l].push_back({static_cast<uint64_t>(
                                  reinterpret_cast<std::byte*>((*cache)->BlockData(l, b)) -
                                  (*cache)->data()),
                              block});
  auto merged = PlanCopies(ranges, (*cache)->total_bytes(), per_block, (*cache)->total_bytes());
  REQUIRE(merged.ok());
  for (const CopyPiece& p : *merged) CHECK(p.remote_offset == p.local_offset);
}

TEST_CASE("kvtransfer factory: refuses a backend the servers do not run", "[kvtransfer]") {
  TransferSection transfer;
  transfer.backend = "carrier-pigeon";
  auto publish = CreatePublisherWithPool(transfer, 4096, {});
  REQUIRE_FALSE(publish.ok());
  CHECK(publish.status().code() == StatusCode::kInvalidArgument);
  CHECK(publish.status().message().find("carrier-pigeon") != std::string::npos);
  CHECK_FALSE(CreatePullerWithPool(transfer, 4096, {}).ok());
}

TEST_CASE("kvtransfer factory: a pool per GPU needs cuda_ipc or nccl, the shape the bytes",
          "[kvtransfer]") {
  TransferSection transfer;
  transfer.backend = "inproc";
  TransferFactoryOptions options;
  options.pool_shape = KvPoolShape{KvLayout{2, 4, 8, 4}, 2, 16};
  auto publish = CreatePublisherWithPool(transfer, options.pool_shape.pool_bytes(), options);
  CHECK(publish.status().message() ==
        "transfer.backend inproc moves one KV pool; tensor_parallel 2 keeps one per GPU: use "
        "cuda_ipc or nccl");
  options.pool_shape.degree = 1;
  CHECK(CreatePullerWithPool(transfer, 4096, options).status().message().starts_with(
      "KV pool of 4096 bytes, its shape says"));
  auto pull = CreatePullerWithPool(transfer, options.pool_shape.pool_bytes(), options);
  REQUIRE(pull.ok());
  CHECK(pull->pools.size() == 1);
}

TEST_CASE("kvtransfer factory: ucx takes a GPU pool only where the UCX at hand moves GPU memory",
          "[kvtransfer]") {
  TransferSection transfer;
  transfer.backend = "ucx";
  transfer.ucx_tls = "tcp";
  TransferFactoryOptions options;
  options.secret = test::kTestClusterSecret;
  options.device = "cuda";
  StatusOr<UcxCapabilities> ucx = ProbeUcx("tcp");
  REQUIRE(ucx.ok());
  if (ucx->cuda_memory) {  // a CUDA-aware UCX: the GPU checks (tests/gpu) cover it
    WARN("this UCX moves CUDA memory over tcp: nothing to refuse");
    return;
  }
  const std::string want =
      "transfer.backend ucx cannot move this instance's KV: it is in GPU memory (device cuda), "
      "and with transfer.ucx_tls 'tcp' " + DescribeUcx(ucx) +
      "; use cuda_ipc or nccl, or a UCX built with CUDA";
  auto publish = CreatePublisherWithPool(transfer, 4096, options);
  REQUIRE_FALSE(publish.ok());
  CHECK(publish.status().code() == StatusCode::kInvalidArgument);
  CHECK(publish.status().message() == want);
  CHECK(CreatePullerWithPool(transfer, 4096, options).status().message() == want);
  // A tls UCX does not take is named as such.
  CHECK(ProbeUcx("no-such-transport").status().message().find("no-such-transport") !=
        std::string::npos);
}

}  // namespace
}  // namespace tandem
