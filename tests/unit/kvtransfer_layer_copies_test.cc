// LayerCopyQueue (kvtransfer/layer_copies.h): the layer-wise bookkeeping the in-process and the
// CUDA IPC backends share. Copying a queue's batches with memcpy must rebuild the publisher's
// bytes in the puller's ranges, whatever the two sides' range cuts and however the layers are
// announced.
#include "kvtransfer/layer_copies.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

namespace tandem {
namespace {

TEST_CASE("layer copies: layers are released in order, once, empty ones too", "[kvtransfer]") {
  // Layer 1 moves nothing (zero-length ranges on both sides).
  const LayerRanges remote = {{{0, 8}, {16, 8}}, {{32, 0}}, {{40, 4}}};
  const LayerRanges local = {{{100, 16}}, {}, {{0, 4}}};
  StatusOr<std::vector<CopyPiece>> pieces = PlanCopies(remote, 64, local, 128);
  REQUIRE(pieces.ok());
  LayerCopyQueue queue(std::move(*pieces), 3);
  CHECK(queue.pieces().size() == 3);
  CHECK(queue.Release(0).empty());

  std::vector<LayerBatch> first = queue.Release(2);
  REQUIRE(first.size() == 2);
  CHECK(first[0].layer == 0);
  CHECK(first[0].first == 0);
  CHECK(first[0].last == 2);
  CHECK(first[1].layer == 1);
  CHECK(first[1].first == first[1].last);  // nothing to copy, still reported
  CHECK(queue.released_layers() == 2);
  CHECK_FALSE(queue.all_released());
  CHECK(queue.Release(1).empty());  // a lower count than before changes nothing
  CHECK(queue.Release(2).empty());

  std::vector<LayerBatch> rest = queue.Release(kAllLayers);
  REQUIRE(rest.size() == 1);
  CHECK(rest[0].layer == 2);
  CHECK(rest[0].last - rest[0].first == 1);
  CHECK(queue.all_released());
  CHECK(queue.Release(kAllLayers).empty());
}

TEST_CASE("layer copies: memcpy of the batches rebuilds the publisher's bytes", "[kvtransfer]") {
  std::mt19937_64 rng(20);
  for (int round = 0; round < 50; ++round) {
    const uint32_t layers = 1 + rng() % 6;
    const uint64_t layer_bytes = 64 * (1 + rng() % 8);
    // The publisher's layer l is [l * layer_bytes, (l + 1) * layer_bytes) cut at random points;
    // the puller's is the same length at another place, cut elsewhere.
    auto cut = [&](uint64_t base) {
      std::vector<ByteRange> ranges;
      uint64_t at = 0;
      while (at < layer_bytes) {
        const uint64_t n = std::min<uint64_t>(layer_bytes - at, 1 + rng() % 100);
        ranges.push_back({base + at, n});
        at += n;
      }
      return ranges;
    };
    LayerRanges remote, local;
    for (uint32_t l = 0; l < layers; ++l) {
      remote.push_back(cut(l * layer_bytes));
      local.push_back(cut((layers - 1 - l) * layer_bytes));  // layers stored in reverse
    }
    std::vector<unsigned char> src(layers * layer_bytes), dst(src.size(), 0);
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    StatusOr<std::vector<CopyPiece>> pieces = PlanCopies(remote, src.size(), local, dst.size());
    REQUIRE(pieces.ok());
    LayerCopyQueue queue(std::move(*pieces), layers);
    std::vector<uint32_t> reported;
    while (!queue.all_released()) {
      const uint32_t available = queue.released_layers() + 1 + rng() % 3;  // announced in steps
      for (const LayerBatch& b : queue.Release(available)) {
        for (size_t i = b.first; i < b.last; ++i) {
          const CopyPiece& p = queue.pieces()[i];
          CHECK(p.layer == b.layer);
          std::memcpy(dst.data() + p.local_offset, src.data() + p.remote_offset, p.length);
        }
        reported.push_back(b.layer);
      }
    }
    REQUIRE(reported.size() == layers);
    for (uint32_t l = 0; l < layers; ++l) {
      CHECK(reported[l] == l);
      CHECK(std::memcmp(dst.data() + (layers - 1 - l) * layer_bytes, src.data() + l * layer_bytes,
                        layer_bytes) == 0);
    }
  }
}

}  // namespace
}  // namespace tandem
