// The host-side half of the NCCL KV transport (kvtransfer/nccl_protocol.h): message order and
// where each message lands, the request header and its verdicts, the pull order on the wire.
// The transport itself runs only on GPUs (tests/gpu/nccl_transfer_check.cc); what it decides is
// decided here, and these tests replay it: applying PlanNcclReceives' copies to CPU buffers
// moves exactly the publisher's byte streams into the puller's ranges.
#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvtransfer/nccl_protocol.h"

namespace tandem {
namespace {

// Block lists as the servers make them: per layer, `blocks` blocks of `block` bytes chosen at
// random (without repetition) from a pool of `pool_blocks` blocks per layer.
LayerRanges RandomBlocks(std::mt19937_64& rng, int layers, int blocks, int pool_blocks,
                         uint64_t block) {
  LayerRanges out(layers);
  for (int l = 0; l < layers; ++l) {
    std::vector<int> ids(pool_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int k = 0; k < blocks; ++k)
      out[l].push_back({(uint64_t(l) * pool_blocks + ids[k]) * block, block});
  }
  return out;
}

// The bytes of each layer's stream, read from `region` through `ranges`.
std::vector<std::string> Streams(const std::string& region, const LayerRanges& ranges) {
  std::vector<std::string> out;
  for (const auto& layer : ranges) {
    std::string s;
    for (const ByteRange& r : layer) s += region.substr(r.offset, r.length);
    out.push_back(s);
  }
  return out;
}

}  // namespace

TEST_CASE("nccl protocol: wire order cuts ranges at granules, layer-major", "[kvtransfer]") {
  // Layer 0: ranges of 6 and 3 bytes, granule 4: cuts at stream offsets 4 and 8.
  LayerRanges layers = {{{100, 6}, {200, 3}}, {}, {{0, 0}, {50, 4}}};
  const std::vector<NcclPiece> pieces = NcclWireOrder(layers, 4);
  const std::vector<NcclPiece> want = {
      {0, 0, 100, 4}, {0, 4, 104, 2}, {0, 6, 200, 2}, {0, 8, 202, 1}, {2, 0, 50, 4}};
  CHECK(pieces == want);
  // Granule 0: one message per range.
  CHECK(NcclWireOrder(layers, 0).size() == 3);
}

TEST_CASE("nccl protocol: any two block lists of one block size are compatible", "[kvtransfer]") {
  std::mt19937_64 rng(7);
  constexpr uint64_t kBlock = 48;
  constexpr int kLayers = 3, kPoolBlocks = 16;
  for (int trial = 0; trial < 50; ++trial) {
    const int blocks = 1 + static_cast<int>(rng() % 12);
    const LayerRanges remote = RandomBlocks(rng, kLayers, blocks, kPoolBlocks, kBlock);
    const LayerRanges local = RandomBlocks(rng, kLayers, blocks, kPoolBlocks, kBlock);
    std::string publisher(kLayers * kPoolBlocks * kBlock, '\0');
    for (char& c : publisher) c = static_cast<char>(rng());
    std::string puller(publisher.size(), '\0');

    StatusOr<std::vector<NcclReceive>> receives = PlanNcclReceives(remote, local, kBlock);
    REQUIRE(receives.ok());
    const std::vector<NcclPiece> sends = NcclWireOrder(remote, kBlock);
    REQUIRE(receives->size() == sends.size());
    // NCCL pairs the i-th send with the i-th receive: replay that on the CPU.
    for (size_t i = 0; i < sends.size(); ++i) {
      REQUIRE(sends[i].layer == (*receives)[i].layer);
      REQUIRE(sends[i].length == (*receives)[i].length);
      std::memcpy(puller.data() + (*receives)[i].local_offset,
                  publisher.data() + sends[i].remote_offset, sends[i].length);
    }
    CHECK(Streams(puller, local) == Streams(publisher, remote));
  }
}

TEST_CASE("nccl protocol: receives that cannot line up are refused, naming why",
          "[kvtransfer]") {
  const LayerRanges remote = {{{0, 8}}};
  // The same total, but the local cut at 3 falls inside a message (no granule).
  StatusOr<std::vector<NcclReceive>> crossing = PlanNcclReceives(remote, {{{0, 3}, {10, 5}}}, 0);
  REQUIRE_FALSE(crossing.ok());
  CHECK(crossing.status().message().find("crosses a local range boundary") != std::string::npos);
  // With granule 1 every cut lines up.
  CHECK(PlanNcclReceives(remote, {{{0, 3}, {10, 5}}}, 1).ok());
  StatusOr<std::vector<NcclReceive>> shorter = PlanNcclReceives(remote, {{{0, 7}}}, 0);
  REQUIRE_FALSE(shorter.ok());
  CHECK(shorter.status().message() ==
        "NCCL pull: layer 0 is 8 bytes on the publisher, 7 here");
  CHECK(PlanNcclReceives(remote, {{{0, 8}}, {}}, 0).status().message() ==
        "NCCL pull: the publisher has 1 layers, the puller 2");
}

TEST_CASE("nccl protocol: the header says held, gone, or out of step", "[kvtransfer]") {
  const auto held = EncodeNcclHeader(MakeNcclHeader(5, 4096, "cmpl-1", true));
  const auto gone = EncodeNcclHeader(MakeNcclHeader(5, 4096, "cmpl-1", false));
  CHECK(CheckNcclHeader(held, 5, 4096, "cmpl-1").ok());
  const Status not_held = CheckNcclHeader(gone, 5, 4096, "cmpl-1");
  CHECK(not_held.code() == StatusCode::kNotFound);
  CHECK(not_held.message() == "the prefill instance no longer holds the KV of cmpl-1");
  // Another order, size or request: the link is out of step.
  CHECK(CheckNcclHeader(held, 6, 4096, "cmpl-1").code() == StatusCode::kDataLoss);
  CHECK(CheckNcclHeader(held, 5, 4095, "cmpl-1").code() == StatusCode::kDataLoss);
  CHECK(CheckNcclHeader(gone, 5, 4096, "cmpl-2").code() == StatusCode::kDataLoss);
  std::array<uint8_t, kNcclHeaderBytes> zeros{};  // receives that never got a header
  CHECK(CheckNcclHeader(zeros, 0, 0, "").code() == StatusCode::kDataLoss);
  auto flags = held;
  flags[6] |= 0x80;  // an unknown flag
  CHECK(CheckNcclHeader(flags, 5, 4096, "cmpl-1").code() == StatusCode::kDataLoss);
}

TEST_CASE("nccl protocol: pull orders round-trip and malformed ones are refused",
          "[kvtransfer]") {
  StatusOr<KvDescriptor> d = MakeDescriptor(42, "cmpl-9", {{{0, 64}, {128, 64}}, {{256, 64}}});
  REQUIRE(d.ok());
  NcclPullOrder order;
  order.link_token = 0xfeedface;
  order.unique_id = std::string(kNcclUniqueIdBytes, '\x07');
  order.seq = 3;
  order.descriptor = *d;
  const std::string bytes = Encode(order);
  StatusOr<NcclPullOrder> back = DecodeNcclPullOrder(AsBytes(bytes));
  REQUIRE(back.ok());
  CHECK(*back == order);

  // Every truncation is a clean error; so is any other message type.
  for (size_t n = 0; n < bytes.size(); ++n)
    CHECK_FALSE(DecodeNcclPullOrder(AsBytes(bytes.substr(0, n))).ok());
  CHECK(DecodeNcclPullOrder(AsBytes(Encode(*d))).status().message().find(
            "expected an NCCL pull order") != std::string::npos);
  order.link_token = 0;
  CHECK(DecodeNcclPullOrder(AsBytes(Encode(order))).status().message() ==
        "wire: NCCL pull order with link token 0");
  // Random bit flips never crash the decoder.
  std::mt19937_64 rng(11);
  for (int i = 0; i < 2000; ++i) {
    std::string flipped = bytes;
    flipped[rng() % flipped.size()] ^= static_cast<char>(1u << (rng() % 8));
    StatusOr<NcclPullOrder> r = DecodeNcclPullOrder(AsBytes(flipped));
    if (r.ok()) CHECK(r->unique_id.size() == kNcclUniqueIdBytes);
  }
}

}  // namespace tandem
