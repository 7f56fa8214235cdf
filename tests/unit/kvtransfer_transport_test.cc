// kvtransfer backends against each other: in-process (memcpy), UCX over tcp, UCX over shared
// memory, all in one process. Same seeded requests, every byte compared.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <random>
#include <vector>

#include "kvtransfer/inprocess_transport.h"
#include "kvtransfer/transfer.h"
#include "kvtransfer/ucx_transport.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

TEST_CASE("kvtransfer PlanCopies cuts two views of one stream", "[kvtransfer]") {
  LayerRanges remote = {{{0, 10}, {100, 6}}, {}};
  LayerRanges local = {{{50, 4}, {60, 12}}, {}};
  auto pieces = PlanCopies(remote, 1000, local, 1000);
  REQUIRE(pieces.ok());
  REQUIRE(pieces->size() == 3);
  CHECK((*pieces)[0].remote_offset == 0);
  CHECK((*pieces)[0].local_offset == 50);
  CHECK((*pieces)[0].length == 4);
  CHECK((*pieces)[1].remote_offset == 4);
  CHECK((*pieces)[1].local_offset == 60);
  CHECK((*pieces)[1].length == 6);
  CHECK((*pieces)[2].remote_offset == 100);
  CHECK((*pieces)[2].local_offset == 66);
  CHECK((*pieces)[2].length == 6);
  CHECK(PlanCopies(remote, 105, local, 1000).status().code() == StatusCode::kInvalidArgument);
  CHECK(PlanCopies({{{0, 10}}}, 1000, {{{0, 9}}}, 1000).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(PlanCopies({{{0, 10}}}, 1000, {}, 1000).status().code() ==
        StatusCode::kInvalidArgument);
}

struct Backend {
  std::unique_ptr<KvPublisher> publisher;
  std::unique_ptr<KvPuller> puller;
};

Backend MakeBackend(const std::string& name, MemoryRegion src, MemoryRegion dst,
                    MetricsRegistry* metrics) {
  Backend b;
  if (name == "inprocess") {
    b.publisher = std::move(CreateInProcessPublisher(src)).value();
    b.puller = std::move(CreateInProcessPuller(dst, metrics)).value();
  } else {
    UcxOptions options;
    options.tls = name == "ucx-sm" ? "sm,self" : "tcp";
    options.timeout = 5000ms;
    options.metrics = metrics;
    auto pub = CreateUcxPublisher(src, options);
    REQUIRE(pub.ok());
    auto pull = CreateUcxPuller(dst, options);
    REQUIRE(pull.ok());
    b.publisher = std::move(pub).value();
    b.puller = std::move(pull).value();
  }
  return b;
}

// Random ranges in a region, `layers` layers; the local side cuts each layer's total differently.
void RandomRequest(std::mt19937_64& rng, uint64_t region_bytes, LayerRanges* remote,
                   LayerRanges* local) {
  size_t layers = 1 + rng() % 4;
  remote->assign(layers, {});
  local->assign(layers, {});
  uint64_t at = rng() % 4096;  // local ranges of all layers must not overlap
  for (size_t l = 0; l < layers; ++l) {
    uint64_t total = 0;
    for (int i = 0, n = 1 + rng() % 5; i < n; ++i) {
      uint64_t len = 1 + rng() % 4096;
      (*remote)[l].push_back({rng() % (region_bytes - len), len});
      total += len;
    }
    // The local side in chunks of up to 3000 bytes with gaps.
    while (total > 0) {
      uint64_t len = std::min<uint64_t>(total, 1 + rng() % 3000);
      (*local)[l].push_back({at, len});
      at += len + rng() % 64;
      total -= len;
    }
  }
}

TEST_CASE("kvtransfer backends move the same bytes", "[kvtransfer]") {
  auto name = GENERATE(as<std::string>{}, "inprocess", "ucx-tcp", "ucx-sm");
  INFO("backend " << name);
  constexpr size_t kBytes = 1 << 20;
  std::vector<uint8_t> src(kBytes), dst(kBytes);
  std::mt19937_64 rng(42);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  MetricsRegistry metrics;
  Backend backend = MakeBackend(name, {src.data(), kBytes}, {dst.data(), kBytes}, &metrics);
  REQUIRE(backend.puller->Connect(backend.publisher->peer_info()).ok());
  REQUIRE(backend.puller->Connect(backend.publisher->peer_info()).ok());  // idempotent

  std::atomic<int> released_ok{0};
  for (int r = 0; r < 200; ++r) {
    LayerRanges remote, local;
    RandomRequest(rng, kBytes, &remote, &local);
    std::string id = "req-" + std::to_string(r);
    auto d = backend.publisher->Publish(id, remote, [&](const std::string&, const Status& s) {
      if (s.ok()) released_ok++;
    });
    REQUIRE(d.ok());
    // Through the wire, as the servers will do.
    auto decoded = DecodeKvDescriptor(AsBytes(Encode(*d)));
    REQUIRE(decoded.ok());
    std::memset(dst.data(), 0, kBytes);
    PullWaiter waiter;
    REQUIRE(backend.puller->Pull(*decoded, local, waiter.callbacks()).ok());
    Status s = waiter.Wait(5000ms);
    REQUIRE(s.ok());
    CHECK(waiter.layers_done() == remote.size());
    for (size_t l = 0; l < remote.size(); ++l) {
      std::vector<uint8_t> want, got;
      for (auto& q : remote[l]) want.insert(want.end(), &src[q.offset], &src[q.offset] + q.length);
      for (auto& q : local[l]) got.insert(got.end(), &dst[q.offset], &dst[q.offset] + q.length);
      REQUIRE(want == got);
    }
  }
  // The release callback arrives over the transport after on_done: wait for it.
  for (int i = 0; i < 500 && released_ok < 200; ++i) std::this_thread::sleep_for(10ms);
  CHECK(released_ok == 200);
  CHECK(backend.publisher->published_count() == 0);
  CHECK(backend.puller->inflight_count() == 0);
  std::string text = metrics.Render();
  CHECK(text.find("tandem_kv_transfer_seconds_count 200") != std::string::npos);
  CHECK(text.find("tandem_kv_transfers_inflight 0") != std::string::npos);
}

TEST_CASE("kvtransfer pull errors are reported without callbacks", "[kvtransfer]") {
  auto name = GENERATE(as<std::string>{}, "inprocess", "ucx-tcp");
  std::vector<uint8_t> src(4096), dst(4096);
  MetricsRegistry metrics;
  Backend b = MakeBackend(name, {src.data(), 4096}, {dst.data(), 4096}, &metrics);
  auto d = b.publisher->Publish("r1", {{{0, 100}}}, [](const std::string&, const Status&) {});
  REQUIRE(d.ok());
  CHECK(b.publisher->Publish("r1", {{{0, 100}}}, nullptr).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(b.publisher->Publish("r2", {{{4000, 100}}}, nullptr).status().code() ==
        StatusCode::kInvalidArgument);
  bool called = false;
  PullCallbacks cb;
  cb.on_done = [&](const std::string&, const Status&) { called = true; };
  CHECK(b.puller->Pull(*d, {{{0, 100}}}, cb).code() == StatusCode::kNotFound);
  REQUIRE(b.puller->Connect(b.publisher->peer_info()).ok());
  CHECK(b.puller->Pull(*d, {{{0, 99}}}, cb).code() == StatusCode::kInvalidArgument);
  CHECK(b.puller->Pull(*d, {{{4090, 100}}}, cb).code() == StatusCode::kInvalidArgument);
  CHECK(!called);
  PeerInfo wrong = b.publisher->peer_info();
  wrong.transport = "nccl";
  CHECK(b.puller->Connect(wrong).code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
