// kvtransfer backends against each other: in-process (memcpy), UCX over tcp, UCX over shared
// memory, all in one process. Same seeded requests, every byte compared.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <cstring>
#include <random>
#include <vector>

#include "kvtransfer/inprocess_transport.h"
#include "kvtransfer/transfer.h"
#include "kvtransfer/ucx_capabilities.h"
#include "kvtransfer/ucx_transport.h"
#include "tests/test_ucx.h"

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

TEST_CASE("kvtransfer: pieces that continue each other on both sides move as one",
          "[kvtransfer]") {
  // Blocks 4, 5, 6 of a layer into 10, 11, 20: the first two are adjacent on both sides.
  LayerRanges remote = {{{4 * 64, 64}, {5 * 64, 64}, {6 * 64, 64}}, {{0, 64}, {64, 64}}};
  LayerRanges local = {{{10 * 64, 64}, {11 * 64, 64}, {20 * 64, 64}}, {{128, 64}, {192, 64}}};
  auto pieces = PlanCopies(remote, 4096, local, 4096);
  REQUIRE(pieces.ok());
  REQUIRE(pieces->size() == 3);
  CHECK((*pieces)[0].layer == 0);
  CHECK((*pieces)[0].remote_offset == 4 * 64);
  CHECK((*pieces)[0].local_offset == 10 * 64);
  CHECK((*pieces)[0].length == 128);
  CHECK((*pieces)[1].remote_offset == 6 * 64);
  CHECK((*pieces)[1].local_offset == 20 * 64);
  CHECK((*pieces)[1].length == 64);
  CHECK((*pieces)[2].layer == 1);  // never across layers
  CHECK((*pieces)[2].length == 128);
  // Across layers, pools or a gap on one side: kept apart.
  std::vector<CopyPiece> apart = {{0, 0, 0, 64, 0, 0}, {1, 64, 64, 64, 0, 0},
                                  {1, 128, 128, 64, 1, 0}, {1, 192, 200, 64, 1, 0},
                                  {1, 256, 264, 64, 1, 0}};
  CoalesceCopies(&apart);
  REQUIRE(apart.size() == 4);
  CHECK(apart[3].remote_offset == 192);
  CHECK(apart[3].length == 128);  // the last two continue each other
}

struct Backend {
  std::unique_ptr<KvPublisher> publisher;
  std::unique_ptr<KvPuller> puller;
};

// layer_wait: the longest wait for the next layer to be announced (0: timeout).
Backend MakeBackend(const std::string& name, MemoryRegion src, MemoryRegion dst,
                    MetricsRegistry* metrics, std::chrono::milliseconds timeout = 5000ms,
                    std::chrono::milliseconds layer_wait = 0ms) {
  Backend b;
  if (name == "inprocess") {
    b.publisher = std::move(CreateInProcessPublisher(src)).value();
    b.puller = std::move(
        CreateInProcessPuller(dst, metrics, layer_wait.count() > 0 ? layer_wait : timeout)).value();
  } else {
    UcxOptions options = test::TestUcxOptions(name == "ucx-sm" ? "sm,self" : "tcp");
    options.timeout = timeout;
    options.layer_wait_timeout = layer_wait;
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

TEST_CASE("kvtransfer: UCX says at run time which memory it can move", "[kvtransfer]") {
  StatusOr<UcxCapabilities> caps = ProbeUcx();
  REQUIRE(caps.ok());
  CHECK_FALSE(caps->version.empty());
  CHECK(std::find(caps->memory_types.begin(), caps->memory_types.end(), "host") !=
        caps->memory_types.end());
  const bool cuda = std::find(caps->memory_types.begin(), caps->memory_types.end(), "cuda") !=
                    caps->memory_types.end();
  CHECK(caps->cuda_memory == cuda);
  const std::string line = DescribeUcx(caps);
  INFO(line);
  CHECK(line.rfind("UCX " + caps->version + ": memory types host", 0) == 0);
  CHECK(line.find(cuda ? "over UCX: yes" : "over UCX: no (") != std::string::npos);
  CHECK(DescribeUcx(Unavailable("no transport")) == "UCX: unavailable (no transport)");
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

namespace tandem {
namespace {

// Layer-wise streaming: kLayers layers of kLayerBytes, remote at l * kLayerBytes, local at
// kLocalBase + l * kLayerBytes (cut in two ranges per layer, to differ from the remote cut).
constexpr uint32_t kStreamLayers = 4;
constexpr uint64_t kLayerBytes = 64 << 10;
constexpr uint64_t kLocalBase = 512 << 10;

struct Stream {
  LayerRanges remote, local;
  std::mutex mutex;
  std::vector<uint32_t> order;  // on_layer calls
  PullWaiter waiter;
  PullCallbacks Callbacks() {
    PullCallbacks cb = waiter.callbacks();
    auto count = cb.on_layer;
    cb.on_layer = [this, count](uint32_t layer) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        order.push_back(layer);
      }
      count(layer);
    };
    return cb;
  }
  Stream() {
    for (uint32_t l = 0; l < kStreamLayers; ++l) {
      remote.push_back({{l * kLayerBytes, kLayerBytes}});
      local.push_back({{kLocalBase + l * kLayerBytes, 1000},
                       {kLocalBase + l * kLayerBytes + 1000, kLayerBytes - 1000}});
    }
  }
};

bool LayerEquals(const std::vector<uint8_t>& src, const std::vector<uint8_t>& dst, uint32_t l) {
  return std::memcmp(&src[l * kLayerBytes], &dst[kLocalBase + l * kLayerBytes], kLayerBytes) == 0;
}
bool LayerZero(const std::vector<uint8_t>& dst, uint32_t l) {
  const uint8_t* p = &dst[kLocalBase + l * kLayerBytes];
  return std::all_of(p, p + kLayerBytes, [](uint8_t b) { return b == 0; });
}

TEST_CASE("kvtransfer streams layers as they become available", "[kvtransfer]") {
  auto name = GENERATE(as<std::string>{}, "inprocess", "ucx-tcp", "ucx-sm");
  INFO("backend " << name);
  constexpr size_t kBytes = 1 << 20;
  std::vector<uint8_t> src(kBytes), dst(kBytes, 0);
  std::mt19937_64 rng(7);
  for (auto& b : src) b = static_cast<uint8_t>(rng() | 1);  // never zero
  MetricsRegistry metrics;
  // Each layer is announced 0.4 s after the last: longer than the transfer timeout (0.3 s),
  // which does not count the wait for layers, shorter than the wait allowed for one (1 s).
  Backend backend =
      MakeBackend(name, {src.data(), kBytes}, {dst.data(), kBytes}, &metrics, 300ms, 1000ms);
  REQUIRE(backend.puller->Connect(backend.publisher->peer_info()).ok());
  Stream stream;
  std::atomic<int> released_ok{0};
  auto d = backend.publisher->Publish("stream", stream.remote, [&](const std::string&, const Status& s) {
    if (s.ok()) released_ok++;
  });
  REQUIRE(d.ok());
  REQUIRE(backend.puller->Pull(*d, stream.local, stream.Callbacks(), 0).ok());
  for (uint32_t available = 1; available <= kStreamLayers; ++available) {
    std::this_thread::sleep_for(400ms);
    // Nothing beyond what was announced has been read.
    CHECK(stream.waiter.layers_done() == available - 1);
    for (uint32_t l = available - 1; l < kStreamLayers; ++l) CHECK(LayerZero(dst, l));
    REQUIRE(backend.puller->SetLayersAvailable("stream", available).ok());
    for (int i = 0; i < 500 && stream.waiter.layers_done() < available; ++i)
      std::this_thread::sleep_for(10ms);
    REQUIRE(stream.waiter.layers_done() == available);
    for (uint32_t l = 0; l < available; ++l) CHECK(LayerEquals(src, dst, l));
  }
  REQUIRE(stream.waiter.Wait(5000ms).ok());
  CHECK(stream.order == std::vector<uint32_t>{0, 1, 2, 3});
  for (int i = 0; i < 500 && released_ok < 1; ++i) std::this_thread::sleep_for(10ms);
  CHECK(released_ok == 1);
  CHECK(backend.publisher->published_count() == 0);
  CHECK(backend.puller->inflight_count() == 0);
  CHECK(backend.puller->SetLayersAvailable("stream", kAllLayers).code() == StatusCode::kNotFound);
  // The seconds exclude the 1.6 s spent waiting for layers.
  std::string text = metrics.Render();
  CHECK(text.find("tandem_kv_transfer_seconds_count 1") != std::string::npos);
  CHECK(text.find("tandem_kv_transfer_seconds_bucket{le=\"1\"} 1") != std::string::npos);
}

TEST_CASE("kvtransfer pull whose layers never come fails within the timeout", "[kvtransfer]") {
  auto name = GENERATE(as<std::string>{}, "inprocess", "ucx-tcp", "ucx-sm");
  INFO("backend " << name);
  constexpr size_t kBytes = 1 << 20;
  std::vector<uint8_t> src(kBytes, 1), dst(kBytes, 0);
  MetricsRegistry metrics;
  Backend backend =
      MakeBackend(name, {src.data(), kBytes}, {dst.data(), kBytes}, &metrics, 300ms);
  REQUIRE(backend.puller->Connect(backend.publisher->peer_info()).ok());
  Stream stream;
  std::atomic<int> released{0};
  Status release_status;
  auto d = backend.publisher->Publish("never", stream.remote, [&](const std::string&, const Status& s) {
    release_status = s;
    released++;
  });
  REQUIRE(d.ok());
  const auto start = std::chrono::steady_clock::now();
  // One layer is there, the rest never is.
  REQUIRE(backend.puller->Pull(*d, stream.local, stream.Callbacks(), 1).ok());
  Status s = stream.waiter.Wait(5000ms);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(s.code() == StatusCode::kDeadlineExceeded);
  CHECK(stream.waiter.layers_done() == 1);
  for (uint32_t l = 1; l < kStreamLayers; ++l) CHECK(LayerZero(dst, l));
  // Both sides release: the puller at on_done, the publisher on the puller's result.
  for (int i = 0; i < 500 && released < 1; ++i) std::this_thread::sleep_for(10ms);
  CHECK(released == 1);
  CHECK(release_status.code() == StatusCode::kDeadlineExceeded);
  CHECK(backend.publisher->published_count() == 0);
  CHECK(backend.puller->inflight_count() == 0);
  CHECK(metrics.Render().find("tandem_kv_transfer_failures_total{reason=\"timeout\"} 1") !=
        std::string::npos);
  WARN(name << ": a pull with no new layer failed after " << seconds << " s (timeout 0.3 s)");
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST_CASE("kvtransfer: a publisher without transport reports acts on no UCX message",
          "[kvtransfer]") {
  // The servers' publishers (report_results off) release KV only on the authenticated control
  // plane's KvReleased: a result message that arrives over UCX, from any process that reaches
  // the worker, releases nothing.
  constexpr size_t kBytes = 1 << 16;
  std::vector<uint8_t> src(kBytes, 7), dst(kBytes, 0);
  UcxOptions quiet = test::TestUcxOptions("tcp");
  quiet.report_results = false;
  UcxOptions chatty = quiet;
  chatty.report_results = true;  // a puller that sends its result over UCX anyway
  auto pub = CreateUcxPublisher(MemoryRegion{src.data(), kBytes}, quiet);
  REQUIRE(pub.ok());
  auto pull = CreateUcxPuller(MemoryRegion{dst.data(), kBytes}, chatty);
  REQUIRE(pull.ok());
  REQUIRE((*pull)->Connect((*pub)->peer_info()).ok());
  std::atomic<int> released{0};
  LayerRanges ranges = {{{0, 4096}}};
  auto d = (*pub)->Publish("r", ranges, [&](const std::string&, const Status&) { released++; });
  REQUIRE(d.ok());
  PullWaiter waiter;
  REQUIRE((*pull)->Pull(*d, ranges, waiter.callbacks()).ok());
  REQUIRE(waiter.Wait(5000ms).ok());
  CHECK(dst[100] == 7);
  std::this_thread::sleep_for(300ms);  // the result message has arrived by now, if it ever will
  CHECK(released == 0);
  CHECK((*pub)->published_count() == 1);  // still held: only its owner releases it
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// What the factory does for a pool in GPU memory, on host memory: a pool registered from memory
// allocated elsewhere, and the puller's copy of eager read replies through copy_into_pool (a
// GPU pool's is cudaMemcpy: UCX hands eager bytes over in its own host buffer).
TEST_CASE("kvtransfer: UCX copies eager read replies through copy_into_pool", "[kvtransfer]") {
  constexpr size_t kBytes = 1 << 16;
  auto src = std::make_shared<std::vector<uint8_t>>(kBytes);
  auto dst = std::make_shared<std::vector<uint8_t>>(kBytes);
  std::mt19937_64 rng(7);
  for (auto& b : *src) b = static_cast<uint8_t>(rng());
  UcxOptions options = test::TestUcxOptions("tcp");  // read messages: replies are AM
  auto src_pool = RegisterUcxPool({src->data(), kBytes}, UcxMemory::kHost, src, options);
  auto dst_pool = RegisterUcxPool({dst->data(), kBytes}, UcxMemory::kHost, dst, options);
  REQUIRE(src_pool.ok());
  REQUIRE(dst_pool.ok());
  CHECK((*dst_pool)->region().base == dst->data());
  std::atomic<int> copies{0};
  std::atomic<bool> fail_copies{false};
  UcxOptions puller_options = options;
  puller_options.copy_into_pool = [&](void* at, const void* bytes, size_t length) -> Status {
    if (fail_copies) return Internal("device copy failed");
    std::memcpy(at, bytes, length);
    ++copies;
    return Status();
  };
  auto publisher = std::move(CreateUcxPublisher(*src_pool, options)).value();
  auto puller = std::move(CreateUcxPuller(*dst_pool, puller_options)).value();
  REQUIRE(puller->Connect(publisher->peer_info()).ok());

  // Small ranges (eager replies): every byte goes through the copy.
  LayerRanges remote = {{{0, 256}, {4096, 512}}, {{8192, 128}}};
  LayerRanges local = {{{1000, 768}}, {{20000, 128}}};
  auto ignore = [](const std::string&, const Status&) {};
  auto d = publisher->Publish("small", remote, ignore);
  REQUIRE(d.ok());
  PullWaiter waiter;
  REQUIRE(puller->Pull(*d, local, waiter.callbacks()).ok());
  REQUIRE(waiter.Wait(5000ms).ok());
  CHECK(copies > 0);
  CHECK(std::memcmp(dst->data() + 1000, src->data(), 256) == 0);
  CHECK(std::memcmp(dst->data() + 1256, src->data() + 4096, 512) == 0);
  CHECK(std::memcmp(dst->data() + 20000, src->data() + 8192, 128) == 0);

  // A copy that fails fails the pull, naming it.
  fail_copies = true;
  auto d2 = publisher->Publish("broken", {{{0, 64}}}, ignore);
  REQUIRE(d2.ok());
  PullWaiter broken;
  REQUIRE(puller->Pull(*d2, {{{30000, 64}}}, broken.callbacks()).ok());
  const Status s = broken.Wait(5000ms);
  CHECK(s.code() == StatusCode::kInternal);
  CHECK(s.message().find("copying a read reply into the KV pool") != std::string::npos);
  CHECK(puller->inflight_count() == 0);
  // The pools keep the memory alive as long as they live.
  std::weak_ptr<std::vector<uint8_t>> kept = dst;
  dst.reset();
  CHECK_FALSE(kept.expired());
}

}  // namespace
}  // namespace tandem
