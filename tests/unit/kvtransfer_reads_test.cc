// The KV data plane's reads (kvtransfer/ucx_transport.h UcxReads, kvtransfer/ucx_reads.h): over
// tcp a stranger that reaches a publisher's UCX worker reads nothing by address, and a read
// message without the cluster secret, or for a range that was not published, is refused.
#include <catch2/catch.hpp>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "common/base/metrics.h"
#include "kvtransfer/transfer.h"
#include "kvtransfer/ucx_transport.h"
#include "tests/test_ucx.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST_CASE("kvtransfer reads: RMA only where no transport lacks enforced memory keys",
          "[kvtransfer]") {
  CHECK(ReadsForTls("tcp") == UcxReads::kMessages);
  CHECK(ReadsForTls("") == UcxReads::kMessages);  // UCX's default lets tcp in
  CHECK(ReadsForTls("tcp,sm,self") == UcxReads::kMessages);
  CHECK(ReadsForTls("^ud") == UcxReads::kMessages);
  CHECK(ReadsForTls("sm,self") == UcxReads::kRma);
  CHECK(ReadsForTls("rc_x,sm,self") == UcxReads::kRma);
  CHECK(ReadsForTls("rc,cuda_copy,cuda_ipc") == UcxReads::kRma);
}

TEST_CASE("kvtransfer reads: authenticated reads need the cluster secret", "[kvtransfer]") {
  std::vector<uint8_t> memory(4096);
  UcxOptions options = test::TestUcxOptions("tcp");
  options.secret.clear();
  auto publisher = CreateUcxPublisher(MemoryRegion{memory.data(), memory.size()}, options);
  REQUIRE_FALSE(publisher.ok());
  CHECK(publisher.status().code() == StatusCode::kInvalidArgument);
  CHECK(publisher.status().message().find("secret") != std::string::npos);
}

// A process that is no member: its own UCX context (with RMA) and a key to its own memory.
// Reads `bytes` at `address` in the worker at `worker_address`; returns what arrived within
// `wait` (zeros when nothing did).
std::vector<uint8_t> StrangerGet(const std::string& worker_address, uint64_t address,
                                 size_t bytes, std::chrono::milliseconds wait) {
  ucp_config_t* config = nullptr;
  REQUIRE(ucp_config_read(nullptr, nullptr, &config) == UCS_OK);
  REQUIRE(ucp_config_modify(config, "TLS", "tcp") == UCS_OK);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  ucp_context_h context = nullptr;
  REQUIRE(ucp_init(&params, config, &context) == UCS_OK);
  ucp_config_release(config);
  ucp_worker_params_t worker_params{};
  ucp_worker_h worker = nullptr;
  REQUIRE(ucp_worker_create(context, &worker_params, &worker) == UCS_OK);

  std::vector<uint8_t> own(bytes), got(bytes, 0);
  ucp_mem_map_params_t map{};
  map.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  map.address = own.data();
  map.length = own.size();
  ucp_mem_h memh = nullptr;
  REQUIRE(ucp_mem_map(context, &map, &memh) == UCS_OK);
  void* packed = nullptr;
  size_t packed_size = 0;
  REQUIRE(ucp_rkey_pack(context, memh, &packed, &packed_size) == UCS_OK);

  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep_params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ucp_ep_h ep = nullptr;
  REQUIRE(ucp_ep_create(worker, &ep_params, &ep) == UCS_OK);
  ucp_rkey_h rkey = nullptr;
  REQUIRE(ucp_ep_rkey_unpack(ep, packed, &rkey) == UCS_OK);

  ucp_request_param_t get_params{};
  ucs_status_ptr_t request = ucp_get_nbx(ep, got.data(), bytes, address, rkey, &get_params);
  const auto give_up = Clock::now() + wait;
  while (UCS_PTR_IS_PTR(request) && ucp_request_check_status(request) == UCS_INPROGRESS &&
         Clock::now() < give_up) {
    ucp_worker_progress(worker);
  }
  std::vector<uint8_t> result = got;  // before closing fails the get (which may touch `got`)

  ucp_request_param_t close_params{};
  close_params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  close_params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t closing = ucp_ep_close_nbx(ep, &close_params);
  const auto close_deadline = Clock::now() + 2s;
  while (UCS_PTR_IS_PTR(closing) && ucp_request_check_status(closing) == UCS_INPROGRESS &&
         Clock::now() < close_deadline) {
    ucp_worker_progress(worker);
  }
  if (UCS_PTR_IS_PTR(closing)) ucp_request_free(closing);
  if (UCS_PTR_IS_PTR(request)) ucp_request_free(request);
  ucp_rkey_destroy(rkey);
  ucp_rkey_buffer_release(packed);
  ucp_mem_unmap(context, memh);
  ucp_worker_destroy(worker);
  ucp_cleanup(context);
  return result;
}

TEST_CASE("kvtransfer reads: a stranger reads nothing by address from a publisher over tcp",
          "[kvtransfer]") {
  constexpr size_t kBytes = 1 << 16;
  std::vector<uint8_t> kv(kBytes);
  for (size_t i = 0; i < kBytes; ++i) kv[i] = static_cast<uint8_t>(i * 7 + 1);
  const std::vector<uint8_t> want(kv.begin(), kv.begin() + 64);

  // The control: a publisher with RMA over tcp hands its memory to anyone (UCX emulates RMA
  // with messages and checks no key): why Tandem does not use RMA over tcp.
  UcxOptions rma = test::TestUcxOptions("tcp");
  rma.reads = UcxReads::kRma;
  {
    auto open = CreateUcxPublisher(MemoryRegion{kv.data(), kBytes}, rma);
    REQUIRE(open.ok());
    const PeerInfo& info = (*open)->peer_info();
    CHECK(StrangerGet(info.worker_address, info.region_base, 64, 3000ms) == want);
  }

  // Tandem's default over tcp: no RMA on the context, so nothing is served by address.
  auto guarded = CreateUcxPublisher(MemoryRegion{kv.data(), kBytes}, test::TestUcxOptions("tcp"));
  REQUIRE(guarded.ok());
  const PeerInfo& info = (*guarded)->peer_info();
  CHECK(info.packed_rkey.empty());
  CHECK(StrangerGet(info.worker_address, info.region_base, 64, 1000ms) ==
        std::vector<uint8_t>(64, 0));
}

TEST_CASE("kvtransfer reads: a read without the secret, or of what was not published, is refused",
          "[kvtransfer]") {
  constexpr size_t kBytes = 1 << 16;
  std::vector<uint8_t> src(kBytes, 7), dst(kBytes, 0);
  MetricsRegistry metrics;
  UcxOptions publisher_options = test::TestUcxOptions("tcp");
  publisher_options.metrics = &metrics;
  auto publisher = CreateUcxPublisher(MemoryRegion{src.data(), kBytes}, publisher_options);
  REQUIRE(publisher.ok());
  const LayerRanges published = {{{0, 4096}}};
  auto d = (*publisher)->Publish("r", published, [](const std::string&, const Status&) {});
  REQUIRE(d.ok());

  SECTION("a puller with another secret") {
    UcxOptions other = test::TestUcxOptions("tcp");
    other.secret = "not-the-cluster-secret-0123456789";
    auto puller = CreateUcxPuller(MemoryRegion{dst.data(), kBytes}, other);
    REQUIRE(puller.ok());
    REQUIRE((*puller)->Connect((*publisher)->peer_info()).ok());
    PullWaiter waiter;
    REQUIRE((*puller)->Pull(*d, published, waiter.callbacks()).ok());
    Status s = waiter.Wait(5000ms);
    CHECK(s.code() == StatusCode::kPermissionDenied);
    CHECK(dst[100] == 0);
    CHECK(metrics.Render().find("tandem_kv_read_refusals_total{reason=\"mac\"}") !=
          std::string::npos);
  }
  SECTION("a member asking for a range that was not published") {
    auto puller = CreateUcxPuller(MemoryRegion{dst.data(), kBytes}, test::TestUcxOptions("tcp"));
    REQUIRE(puller.ok());
    REQUIRE((*puller)->Connect((*publisher)->peer_info()).ok());
    KvDescriptor forged = *d;
    forged.layers = {{{8192, 4096}}};  // same size, elsewhere in the pool
    PullWaiter waiter;
    REQUIRE((*puller)->Pull(forged, published, waiter.callbacks()).ok());
    Status s = waiter.Wait(5000ms);
    CHECK(s.code() == StatusCode::kPermissionDenied);
    CHECK(dst[100] == 0);
    CHECK(metrics.Render().find("tandem_kv_read_refusals_total{reason=\"range\"}") !=
          std::string::npos);

    // A published range reads fine (a new request: the failed pull's result released "r").
    auto fresh = (*publisher)->Publish("r2", published, [](const std::string&, const Status&) {});
    REQUIRE(fresh.ok());
    PullWaiter ok;
    REQUIRE((*puller)->Pull(*fresh, published, ok.callbacks()).ok());
    Status again = ok.Wait(5000ms);
    INFO(again.ToString());
    REQUIRE(again.ok());
    CHECK(dst[100] == 7);
  }
}

}  // namespace
}  // namespace tandem
