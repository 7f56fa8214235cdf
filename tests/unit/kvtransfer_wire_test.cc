// Wire format of kvtransfer: round trips, and a seeded fuzz of the decoders on random,
// truncated and bit-flipped bytes (no crash, a clean Status).
#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "kvtransfer/wire.h"

namespace tandem {
namespace {

KvDescriptor RandomDescriptor(std::mt19937_64& rng) {
  std::vector<std::vector<ByteRange>> layers(rng() % 5);
  for (auto& layer : layers) {
    layer.resize(rng() % 6);
    for (ByteRange& r : layer) r = {rng() % (1u << 30), rng() % (1u << 20)};
  }
  auto d = MakeDescriptor(rng(), "req-" + std::to_string(rng() % 100000), std::move(layers));
  REQUIRE(d.ok());
  return *d;
}

PeerInfo RandomPeerInfo(std::mt19937_64& rng) {
  PeerInfo p;
  p.instance_id = rng();
  p.transport = "ucx";
  p.worker_address.assign(rng() % 300, static_cast<char>(rng()));
  p.packed_rkey.assign(rng() % 100, static_cast<char>(rng()));
  p.region_base = rng() % (1ull << 47);
  p.region_bytes = rng() % (1ull << 32);
  return p;
}

TransferResult RandomResult(std::mt19937_64& rng) {
  TransferResult t;
  t.instance_id = rng();
  t.request_id = std::to_string(rng());  // no literal prefix: GCC 12 -Wrestrict false positive
  t.code = static_cast<StatusCode>(rng() % 11);
  t.message = std::string(rng() % 50, 'x');
  t.bytes = rng();
  return t;
}

// Runs all three decoders; each must return either a value or a non-OK status.
int DecodeAll(std::span<const uint8_t> bytes) {
  int ok = 0;
  auto a = DecodePeerInfo(bytes);
  auto b = DecodeKvDescriptor(bytes);
  auto c = DecodeTransferResult(bytes);
  for (const Status* s : {&a.status(), &b.status(), &c.status()}) {
    if (!s->ok()) {
      CHECK(!s->message().empty());
      CHECK((s->code() == StatusCode::kDataLoss || s->code() == StatusCode::kInvalidArgument));
    }
  }
  ok += a.ok() + b.ok() + c.ok();
  return ok;
}

TEST_CASE("kvtransfer wire: round trip", "[kvtransfer]") {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1000; ++i) {
    KvDescriptor d = RandomDescriptor(rng);
    auto d2 = DecodeKvDescriptor(AsBytes(Encode(d)));
    REQUIRE(d2.ok());
    CHECK(*d2 == d);
    PeerInfo p = RandomPeerInfo(rng);
    auto p2 = DecodePeerInfo(AsBytes(Encode(p)));
    REQUIRE(p2.ok());
    CHECK(*p2 == p);
    TransferResult t = RandomResult(rng);
    auto t2 = DecodeTransferResult(AsBytes(Encode(t)));
    REQUIRE(t2.ok());
    CHECK(*t2 == t);
  }
}

TEST_CASE("kvtransfer wire: header framing and wrong types", "[kvtransfer]") {
  std::mt19937_64 rng(8);
  std::string bytes = Encode(RandomDescriptor(rng));
  auto header = DecodeKvWireHeader(AsBytes(bytes));
  REQUIRE(header.ok());
  CHECK(header->type == KvWireType::kKvDescriptor);
  CHECK(header->message_bytes == bytes.size());
  CHECK(DecodePeerInfo(AsBytes(bytes)).status().code() == StatusCode::kInvalidArgument);
  std::string bad_version = bytes;
  bad_version[4] = 9;
  CHECK(DecodeKvDescriptor(AsBytes(bad_version)).status().code() == StatusCode::kInvalidArgument);
  CHECK(DecodeKvDescriptor(AsBytes(bytes + "x")).status().code() == StatusCode::kDataLoss);
  // A total that does not match the ranges is rejected.
  std::string bad_total = bytes;
  bad_total[bad_total.size() - 1] ^= 0x40;
  CHECK(DecodeKvDescriptor(AsBytes(bad_total)).status().code() == StatusCode::kDataLoss);
}

TEST_CASE("kvtransfer wire: huge counts are refused before allocating", "[kvtransfer]") {
  KvDescriptor d;
  d.request_id = "r";
  d.layers.resize(1);
  std::string bytes = Encode(d);
  // layer_count sits after instance_id (8) and the request id (4 + 1) in the body.
  size_t at = kKvWireHeaderBytes + 8 + 4 + 1;
  for (uint32_t count : {kKvMaxLayers + 1, 0xffffffffu, 1000u}) {
    std::string b = bytes;
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<char>(count >> (8 * i));
    CHECK(!DecodeKvDescriptor(AsBytes(b)).ok());
  }
  // A range count of 2^32-1 in a layer.
  std::string b = bytes;
  for (int i = 0; i < 4; ++i) b[at + 4 + i] = static_cast<char>(0xff);
  CHECK(DecodeKvDescriptor(AsBytes(b)).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("kvtransfer wire: fuzz random, truncated and flipped bytes", "[kvtransfer]") {
  std::mt19937_64 rng(20240601);
  int cases = 0;
  int decoded = 0;
  std::vector<uint8_t> buf;
  for (int i = 0; i < 40000; ++i) {
    // Pure random bytes, sometimes with a valid header in front so the body parser runs.
    buf.resize(rng() % 200);
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    if (buf.size() >= kKvWireHeaderBytes && rng() % 2) {
      uint32_t body = static_cast<uint32_t>(buf.size() - kKvWireHeaderBytes);
      uint16_t type = 1 + rng() % 3;
      uint8_t h[12] = {0x54, 0x4B, 0x56, 0x54, 1, 0, static_cast<uint8_t>(type), 0,
                       static_cast<uint8_t>(body), static_cast<uint8_t>(body >> 8), 0, 0};
      std::copy(h, h + 12, buf.begin());
    }
    decoded += DecodeAll(buf);
    ++cases;
  }
  for (int i = 0; i < 20000; ++i) {
    std::string msg;
    switch (rng() % 3) {
      case 0: msg = Encode(RandomDescriptor(rng)); break;
      case 1: msg = Encode(RandomPeerInfo(rng)); break;
      default: msg = Encode(RandomResult(rng)); break;
    }
    // Every truncation of a short message, or a random one of a long one.
    size_t cut = rng() % msg.size();
    decoded += DecodeAll(AsBytes(msg.substr(0, cut)));
    ++cases;
    // Flip 1-4 random bytes (counts, lengths, header).
    std::string flipped = msg;
    for (int k = 0, n = 1 + rng() % 4; k < n; ++k) {
      flipped[rng() % flipped.size()] ^= static_cast<char>(1 + rng() % 255);
    }
    decoded += DecodeAll(AsBytes(flipped));
    ++cases;
    // Overwrite a 4-byte field at a random place with a huge value.
    std::string huge = msg;
    size_t at = rng() % (huge.size() - 3);
    for (int k = 0; k < 4; ++k) huge[at + k] = static_cast<char>(0xff - (rng() % 2));
    decoded += DecodeAll(AsBytes(huge));
    ++cases;
  }
  CHECK(cases >= 100000);
  INFO("decoded " << decoded << " of " << cases);
  SUCCEED();
}

}  // namespace
}  // namespace tandem
