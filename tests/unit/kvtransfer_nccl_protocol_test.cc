// The host-side half of the NCCL KV transport (kvtransfer/nccl_protocol.h): which pairs of pools
// carry which pieces (equal degrees and re-sharding), the request header and its verdicts, the
// pull order on the wire. The transport runs only on GPUs (tests/gpu/nccl_transfer_check.cc);
// its publisher and puller run here over a CPU link pair (kvtransfer_nccl_endpoints_test.cc).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvtransfer/nccl_packing.h"
#include "kvtransfer/nccl_protocol.h"
#include "tests/unit/kv_pool_util.h"

namespace tandem {
namespace {

LayerRanges Blocks(const KvPoolShape& shape, const std::vector<int32_t>& blocks) {
  return test::WholeBlocks(shape, blocks);
}

}  // namespace

TEST_CASE("nccl protocol: equal degrees pair each pool with its own, pool by pool",
          "[kvtransfer]") {
  const KvLayout model{2, 4, 8, 4};  // 2 layers, 4 KV heads
  for (int degree : {1, 2, 4}) {
    const KvPoolShape shape{model, degree, 16};
    // Different blocks on each side, cut differently: the plan pieces them up the same way.
    StatusOr<std::vector<NcclPairPlan>> pairs =
        PlanNcclPairs(Blocks(shape, {3, 4, 5}), shape, Blocks(shape, {9, 1, 2}), shape);
    REQUIRE(pairs.ok());
    REQUIRE(pairs->size() == static_cast<size_t>(degree));
    for (int r = 0; r < degree; ++r) {
      const NcclPairPlan& pair = (*pairs)[r];
      CHECK(pair.remote_pool == static_cast<uint32_t>(r));
      CHECK(pair.local_pool == static_cast<uint32_t>(r));
      CHECK(pair.bytes == 2 * 3 * shape.rank_layout().block_bytes());
      for (const StridedCopy& p : pair.pieces) CHECK(p.remote_pool == p.local_pool);
    }
  }
}

TEST_CASE("nccl protocol: between degrees every head goes from the pool that has it to the one "
          "that wants it", "[kvtransfer]") {
  const KvLayout model{2, 4, 8, 4};
  const uint64_t head_block = 2 * 8 * 4 * sizeof(float);  // K and V of one head, one block
  for (auto [from, to] : {std::pair{1, 4}, std::pair{4, 1}, std::pair{2, 4}, std::pair{4, 2}}) {
    const KvPoolShape remote{model, from, 16}, local{model, to, 16};
    const std::vector<int32_t> blocks = {0, 7, 3};
    StatusOr<std::vector<NcclPairPlan>> pairs =
        PlanNcclPairs(Blocks(remote, blocks), remote, Blocks(local, {5, 6, 1}), local);
    REQUIRE(pairs.ok());
    // Every head of every block of every layer moves exactly once, over the pair of pools
    // whose ranks hold it (head h: rank h / (4 / degree)).
    uint64_t moved = 0;
    for (const NcclPairPlan& pair : *pairs) {
      CHECK(pair.pieces.size() > 0);
      for (const StridedCopy& p : pair.pieces) {
        CHECK(p.remote_pool == pair.remote_pool);
        CHECK(p.local_pool == pair.local_pool);
      }
      moved += pair.bytes;
    }
    CHECK(moved == 2 * blocks.size() * 4 * head_block);
    const size_t want_pairs = static_cast<size_t>(std::max(from, to));
    CHECK(pairs->size() == want_pairs);
  }
  // Another model, or ranges that are not whole blocks between degrees: refused, as cuda_ipc's.
  const KvPoolShape one{model, 1, 16}, two{model, 2, 16};
  const KvPoolShape other{KvLayout{2, 4, 8, 8}, 1, 16};
  CHECK(PlanNcclPairs(Blocks(one, {0}), one, Blocks(other, {0}), other).status().message().find(
            "KV transfer between different models") == 0);
  LayerRanges half = Blocks(one, {0});
  half[0][0].length /= 2;
  half[1][0].length /= 2;
  LayerRanges half_local = Blocks(two, {0});
  half_local[0][0].length /= 2;
  half_local[1][0].length /= 2;
  CHECK_FALSE(PlanNcclPairs(half, one, half_local, two).ok());
}

TEST_CASE("nccl protocol: a batch of layers takes exactly its layers' pieces", "[kvtransfer]") {
  const KvLayout model{5, 4, 8, 4};
  const KvPoolShape one{model, 1, 16}, two{model, 2, 16};
  StatusOr<std::vector<NcclPairPlan>> whole =
      PlanNcclPairs(Blocks(one, {4, 1, 9}), one, Blocks(two, {0, 2, 3}), two);
  REQUIRE(whole.ok());
  for (uint32_t first = 0; first < 5; ++first)
    for (uint32_t end = first + 1; end <= 5; ++end) {
      const std::vector<NcclPairPlan> part = NcclPairsOfLayers(*whole, first, end);
      REQUIRE(part.size() == whole->size());  // every pair moves some of every layer here
      for (size_t i = 0; i < part.size(); ++i) {
        std::vector<StridedCopy> want;
        uint64_t bytes = 0;
        for (const StridedCopy& p : (*whole)[i].pieces)
          if (p.layer >= first && p.layer < end) {
            want.push_back(p);
            bytes += p.bytes();
          }
        REQUIRE(part[i].pieces.size() == want.size());
        for (size_t k = 0; k < want.size(); ++k) {
          CHECK(part[i].pieces[k].layer == want[k].layer);
          CHECK(part[i].pieces[k].local_offset == want[k].local_offset);
        }
        CHECK(part[i].bytes == bytes);
      }
    }
  CHECK(NcclPairsOfLayers(*whole, 5, 7).empty());
}

TEST_CASE("nccl protocol: the header says held, gone, or out of step", "[kvtransfer]") {
  const uint16_t packed = kNcclLayoutPacked;
  const auto held = EncodeNcclHeader(MakeNcclHeader(5, 4096, "cmpl-1", true, packed));
  const auto gone = EncodeNcclHeader(MakeNcclHeader(5, 4096, "cmpl-1", false, packed));
  CHECK(CheckNcclHeader(held, 5, 4096, "cmpl-1", packed).ok());
  const Status not_held = CheckNcclHeader(gone, 5, 4096, "cmpl-1", packed);
  CHECK(not_held.code() == StatusCode::kNotFound);
  CHECK(not_held.message() == "the prefill instance no longer holds the KV of cmpl-1");
  // Another order, size or request: the link is out of step.
  CHECK(CheckNcclHeader(held, 6, 4096, "cmpl-1", packed).code() == StatusCode::kDataLoss);
  CHECK(CheckNcclHeader(held, 5, 4095, "cmpl-1", packed).code() == StatusCode::kDataLoss);
  CHECK(CheckNcclHeader(gone, 5, 4096, "cmpl-2", packed).code() == StatusCode::kDataLoss);
  std::array<uint8_t, kNcclHeaderBytes> zeros{};  // receives that never got a header
  CHECK(CheckNcclHeader(zeros, 0, 0, "", packed).code() == StatusCode::kDataLoss);
  auto flags = held;
  flags[6] |= 0x80;  // an unknown flag
  CHECK(CheckNcclHeader(flags, 5, 4096, "cmpl-1", packed).code() == StatusCode::kDataLoss);
  // A peer that cuts its messages another way (a message per piece, before packing): refused
  // before any of its bytes count, naming the two layouts; where this side packs nothing
  // either, the two cut them alike and it is accepted.
  CHECK(held[4] == kNcclLayoutPacked);
  const auto older =
      EncodeNcclHeader(MakeNcclHeader(5, 4096, "cmpl-1", true, kNcclLayoutPerRow));
  CHECK(older[4] == 1);
  CHECK(CheckNcclHeader(older, 5, 4096, "cmpl-1", kNcclLayoutPerRow).ok());
  CHECK(CheckNcclHeader(held, 5, 4096, "cmpl-1", kNcclLayoutPerRow).code() ==
        StatusCode::kDataLoss);
  const Status other_layout = CheckNcclHeader(older, 5, 4096, "cmpl-1", packed);
  CHECK(other_layout.code() == StatusCode::kDataLoss);
  CHECK(other_layout.message() ==
        "NCCL header of cmpl-1: message layout 1, this side's is 2 (prefill and decode of "
        "different Tandem versions)");
}

TEST_CASE("nccl protocol: pull orders round-trip and malformed ones are refused",
          "[kvtransfer]") {
  StatusOr<KvDescriptor> d = MakeDescriptor(42, "cmpl-9", {{{0, 64}, {128, 64}}, {{256, 64}}});
  REQUIRE(d.ok());
  NcclPullOrder order;
  order.descriptor = *d;
  order.local_shape = KvPoolShape{KvLayout{2, 4, 8, 4}, 2, 16};
  order.local = {{{512, 128}}, {{1024, 64}}};
  order.first_layer = 1;
  order.end_layer = 2;
  order.pairs = {{0, 0, std::string(kNcclUniqueIdBytes, '\x07'), 3},
                 {0, 1, std::string(kNcclUniqueIdBytes, '\x08'), 0}};
  const std::string bytes = Encode(order);
  StatusOr<NcclPullOrder> back = DecodeNcclPullOrder(AsBytes(bytes));
  REQUIRE(back.ok());
  CHECK(*back == order);

  // Every truncation is a clean error; so is any other message type.
  for (size_t n = 0; n < bytes.size(); ++n)
    CHECK_FALSE(DecodeNcclPullOrder(AsBytes(bytes.substr(0, n))).ok());
  CHECK(DecodeNcclPullOrder(AsBytes(Encode(*d))).status().message().find(
            "expected an NCCL pull order") != std::string::npos);
  NcclPullOrder past = order;
  past.end_layer = 3;  // the request has 2 layers
  CHECK(DecodeNcclPullOrder(AsBytes(Encode(past))).status().message() ==
        "wire: NCCL pull order for layers [1, 3) of a request of 2");
  // Random bit flips never crash the decoder, and what decodes is well formed.
  std::mt19937_64 rng(11);
  for (int i = 0; i < 2000; ++i) {
    std::string flipped = bytes;
    flipped[rng() % flipped.size()] ^= static_cast<char>(1u << (rng() % 8));
    StatusOr<NcclPullOrder> r = DecodeNcclPullOrder(AsBytes(flipped));
    if (!r.ok()) continue;
    CHECK(r->local_shape.Validate().ok());
    for (const NcclPairOrder& pair : r->pairs) CHECK(pair.unique_id.size() == kNcclUniqueIdBytes);
  }
}

TEST_CASE("nccl packing: strided messages fill staging rounds, the rest go straight",
          "[kvtransfer]") {
  char region[4096];
  using Message = OrderedLink::Message;
  const std::vector<Message> layer = {
      {0, region, 100, 1, 0},        // one row: direct
      {0, region + 200, 8, 5, 32},   // 40 bytes: round 0 exactly
      {0, region + 400, 16, 3, 64},  // 48 bytes: 2 rows in round 1, 1 in round 2
      {0, region + 800, 1000, 2, 1000},  // rows longer than the buffer: direct, row by row
      {0, region, 0, 1, 0},          // nothing: left out
  };
  const LayerSends plan = PlanLayerSends(layer, 40);
  CHECK(plan.direct == std::vector<size_t>{0, 3});
  REQUIRE(plan.rounds.size() == 3);
  CHECK(plan.rounds[0].bytes == 40);
  CHECK(plan.rounds[0].parts == std::vector<PackedRows>{{1, 0, 5, 0}});
  CHECK(plan.rounds[1].bytes == 32);
  CHECK(plan.rounds[1].parts == std::vector<PackedRows>{{2, 0, 2, 0}});
  CHECK(plan.rounds[2].bytes == 16);
  CHECK(plan.rounds[2].parts == std::vector<PackedRows>{{2, 2, 1, 0}});
  // Sends: 1 + 2 direct rows, 3 rounds.
  CHECK(LayerSendCount(layer, 40) == 6);
  // The header's message layout: packed where any message packs; where none does (one row
  // each, or rows longer than the buffer), every message goes row by row, as before packing.
  CHECK(MessageLayoutOf(layer, 40) == kNcclLayoutPacked);
  CHECK(MessageLayoutOf(std::span(layer).subspan(3), 40) == kNcclLayoutPerRow);
  CHECK(MessageLayoutOf(std::vector<Message>{layer[0], layer[4]}, 40) == kNcclLayoutPerRow);
  CHECK(MessageLayoutOf({}, 40) == kNcclLayoutPerRow);
  // One row: packed while shorter than kSmallMessageBytes (a fragmented re-shard's head slices),
  // straight from there up (whole blocks of a layer).
  std::vector<char> big(2 * kSmallMessageBytes);
  const std::vector<Message> one_row = {{0, big.data(), kSmallMessageBytes - 1, 1, 0},
                                        {0, big.data(), kSmallMessageBytes, 1, 0}};
  const LayerSends one_row_plan = PlanLayerSends(one_row, 1 << 20);
  CHECK(one_row_plan.direct == std::vector<size_t>{1});
  REQUIRE(one_row_plan.rounds.size() == 1);
  CHECK(one_row_plan.rounds[0].parts == std::vector<PackedRows>{{0, 0, 1, 0}});
  CHECK(MessageLayoutOf(std::span(one_row).subspan(1), 1 << 20) == kNcclLayoutPerRow);
  CHECK(MessageLayoutOf(one_row, 1 << 20) == kNcclLayoutPacked);

  // Through the rounds, rows land at the receiver's strides: gather on one side, scatter on
  // the other (another layout of the same rows), as NcclLink does on the GPU.
  std::vector<char> from(1024), to(1024, 0);
  for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<char>(i * 7 + 1);
  const std::vector<Message> sent = {{0, from.data(), 8, 5, 32}, {0, from.data() + 300, 16, 3, 64}};
  const std::vector<Message> received = {{0, to.data() + 3, 8, 5, 11},
                                         {0, to.data() + 500, 16, 3, 20}};
  const LayerSends rounds = PlanLayerSends(sent, 40);
  std::vector<char> staging(40);
  for (const PackRound& round : rounds.rounds) {
    const std::vector<RowCopy> gather = GatherCopies(round, sent, staging.data());
    CHECK(gather.size() == round.parts.size());  // one strided copy per part
    CopyRowsOnHost(gather);
    CopyRowsOnHost(ScatterCopies(round, received, staging.data()));
  }
  for (size_t m = 0; m < sent.size(); ++m)
    for (uint64_t row = 0; row < sent[m].rows; ++row)
      CHECK(std::memcmp(static_cast<char*>(received[m].data) + row * received[m].stride,
                        static_cast<char*>(sent[m].data) + row * sent[m].stride,
                        sent[m].bytes) == 0);

  // Random layers: every row of every packed message is in exactly one round, in order, the
  // rounds never overflow, and a plan depends only on the rows and lengths (both ranks agree).
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<Message> msgs, other;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      const uint64_t bytes = 1 + rng() % 64, rows = 1 + rng() % 9;
      msgs.push_back({0, region + i, bytes, rows, bytes + rng() % 5});
      other.push_back({0, region + 2 * i, bytes, rows, bytes + 7});
    }
    const uint64_t staging = 16 + rng() % 200;
    const LayerSends p = PlanLayerSends(msgs, staging);
    const LayerSends q = PlanLayerSends(other, staging);
    CHECK(p.direct == q.direct);
    REQUIRE(p.rounds.size() == q.rounds.size());
    std::vector<uint64_t> next_row(msgs.size(), 0);
    for (size_t r = 0; r < p.rounds.size(); ++r) {
      CHECK(p.rounds[r].parts == q.rounds[r].parts);
      CHECK(p.rounds[r].bytes <= staging);
      CHECK(p.rounds[r].bytes > 0);
      uint64_t at = 0;
      for (const PackedRows& part : p.rounds[r].parts) {
        CHECK(part.staging_offset == at);
        CHECK(part.first_row == next_row[part.message]);
        next_row[part.message] += part.rows;
        at += part.rows * msgs[part.message].bytes;
      }
      CHECK(at == p.rounds[r].bytes);
    }
    for (size_t m = 0; m < msgs.size(); ++m) {
      const bool direct = std::find(p.direct.begin(), p.direct.end(), m) != p.direct.end();
      CHECK(direct == (msgs[m].bytes > staging ||
                       (msgs[m].rows == 1 && msgs[m].bytes >= kSmallMessageBytes)));
      CHECK(next_row[m] == (direct ? 0 : msgs[m].rows));
    }
  }
}

}  // namespace tandem
