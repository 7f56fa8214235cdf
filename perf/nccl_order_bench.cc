// nccl_order_bench: the host-side cost of the NCCL KV transport's pull orders
// (kvtransfer/nccl_endpoints.h), which the prefill side pays on a control connection's I/O thread
// and the decode side under its puller's lock, for each request and, layer-wise, each batch of
// layers.
//   nccl_order_bench [--tokens 3000,32768] [--reps 5] [--runs 1] [--json nccl_order_bench.json]
//
// For SmolLM2-135M (30 layers, 3 KV heads of 64) and a Llama-3-8B-like model (32 layers, 8 KV
// heads of 128), prompts of --tokens tokens in 16-token blocks scattered over a pool, and
// prefill/decode degrees 1->1 and 1->t: a real publisher and puller over links that accept every
// transfer and move nothing (NCCL needs GPUs), ordering the whole request at once and layer by
// layer (one order per layer, as decode orders when prefill announces each layer). Reported:
// the order's bytes, the publisher's messages (one per strided copy) and the NCCL sends NcclLink
// would post for them (kvtransfer/nccl_packing.h: strided ones packed), and the median time of the
// puller's Pull + SetLayersAvailable calls and of the publisher's OnPullerMessage calls for one
// request. --runs N: the blocks come in runs of N adjacent ids on each side, one range per run
// (as KvBlockRanges makes them from the BlockManager's lowest-first tables); 1: scattered.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base/flags.h"
#include "kvtransfer/nccl_endpoints.h"
#include "kvtransfer/nccl_packing.h"
#include "kvtransfer/nccl_protocol.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<size_t> rank0_messages{0};  // the publishers' messages (a strided copy each)
std::atomic<size_t> rank0_sends{0};     // the NCCL sends NcclLink would post for them

// Accepts every transfer and completes none: what is timed is the endpoints' own work.
class NullLink final : public OrderedLink {
 public:
  explicit NullLink(int rank) : rank_(rank) {}
  Status health() const override { return Status(); }
  StatusOr<uint64_t> Post(Transfer t) override {
    if (rank_ == 0) {
      rank0_messages += t.messages.size();
      rank0_sends += LayerSendCount(t.messages, kLinkStagingBytes);
    }
    return next_++;
  }
  void Abort(const Status&) override {}
  size_t inflight_count() const override { return 0; }

 private:
  int rank_;
  uint64_t next_ = 0;
};

OrderedLinkMaker NullLinks() {
  OrderedLinkMaker maker;
  maker.new_unique_id = [n = 0]() mutable -> StatusOr<std::string> {
    std::string id(kNcclUniqueIdBytes, '\0');
    std::snprintf(id.data(), id.size(), "bench-%d", ++n);
    return id;
  };
  maker.start = [](std::string_view, int rank, int) -> StatusOr<std::shared_ptr<OrderedLink>> {
    return std::shared_ptr<OrderedLink>(std::make_shared<NullLink>(rank));
  };
  return maker;
}

// `blocks` distinct blocks of a pool of `shape` in runs of `run` adjacent ids at random places,
// one range per run per layer.
LayerRanges Scattered(const KvPoolShape& shape, int blocks, int run, std::mt19937& rng) {
  std::vector<int> slots(shape.num_blocks / run);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  const uint64_t block = shape.rank_layout().block_bytes();
  LayerRanges out(shape.full.num_layers);
  for (int l = 0; l < shape.full.num_layers; ++l)
    for (int k = 0, s = 0; k < blocks; ++s) {
      const int n = std::min(run, blocks - k);
      out[l].push_back({(uint64_t(l) * shape.num_blocks + uint64_t(slots[s]) * run) * block,
                        n * block});
      k += n;
    }
  return out;
}

struct Result {
  std::string model, degrees, mode;
  int tokens = 0;
  size_t orders = 0;
  double order_kib = 0;  // all orders of the request
  size_t messages = 0;   // the strided messages of the request, over all pairs
  size_t sends = 0;      // the NCCL sends they take (kvtransfer/nccl_packing.h)
  double pull_ms = 0;    // the puller's calls
  double serve_ms = 0;   // the publisher's calls
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Result Run(const std::string& model, KvLayout layout, int from, int to, int tokens, bool layerwise,
           int reps, int run) {
  const int blocks = (tokens + layout.block_size - 1) / layout.block_size;
  const KvPoolShape prefill{layout, from, blocks * 2}, decode{layout, to, blocks * 2};
  // The null links never touch the pools: regions at a made-up address, nothing allocated (a
  // 32k-token Llama pool would be 100+ GiB of host memory).
  void* const nowhere = reinterpret_cast<void*>(uintptr_t{1} << 40);
  const std::vector<MemoryRegion> prefill_regions(from, {nowhere, prefill.pool_bytes()});
  const std::vector<MemoryRegion> decode_regions(to, {nowhere, decode.pool_bytes()});
  auto publisher =
      std::move(CreatePullDrivenPublisher(prefill_regions, prefill, {}, NullLinks())).value();
  auto puller = std::move(CreatePullDrivenPuller(decode_regions, decode, {}, NullLinks())).value();
  if (!puller->Connect(publisher->peer_info()).ok()) std::abort();
  std::mt19937 rng(7);
  Result r{model, std::to_string(from) + "->" + std::to_string(to),
           layerwise ? "layer by layer" : "whole request", tokens};
  std::vector<double> pull_ms, serve_ms;
  for (int rep = 0; rep < reps; ++rep) {
    const std::string id = "r" + std::to_string(rep);
    StatusOr<KvDescriptor> d = publisher->Publish(id, Scattered(prefill, blocks, run, rng), {});
    if (!d.ok()) std::abort();
    std::vector<std::string> orders;
    PullCallbacks callbacks;
    callbacks.to_publisher = [&](std::string bytes) { orders.push_back(std::move(bytes)); };
    const LayerRanges local = Scattered(decode, blocks, run, rng);
    const auto t0 = Clock::now();
    if (!puller->Pull(*d, local, callbacks, layerwise ? 1 : kAllLayers).ok()) std::abort();
    for (uint32_t l = 2; layerwise && l <= static_cast<uint32_t>(layout.num_layers); ++l)
      if (!puller->SetLayersAvailable(id, l).ok()) std::abort();
    const auto t1 = Clock::now();
    rank0_messages = 0;
    rank0_sends = 0;
    for (const std::string& order : orders)
      if (!publisher->OnPullerMessage(AsBytes(order)).ok()) std::abort();
    const auto t2 = Clock::now();
    pull_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    serve_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    r.orders = orders.size();
    r.messages = rank0_messages;
    r.sends = rank0_sends;
    r.order_kib = 0;
    for (const std::string& order : orders) r.order_kib += order.size() / 1024.0;
  }
  r.pull_ms = Median(pull_ms);
  r.serve_ms = Median(serve_ms);
  return r;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  using namespace tandem;
  FlagParser flags("nccl_order_bench [flags]",
                   "Host-side cost of the NCCL transport's pull orders.");
  flags.AddString("tokens", "3000,32768", "prompt lengths, comma-separated");
  flags.AddInt("reps", 5, "requests per row (the median is reported)");
  flags.AddInt("runs", 1, "blocks in runs of this many adjacent ids (1: scattered)");
  flags.AddString("json", "nccl_order_bench.json", "raw numbers go here");
  Status parsed = flags.Parse(std::vector<std::string>(argv + 1, argv + argc));
  std::vector<int> tokens;
  const std::string list = parsed.ok() ? flags.GetString("tokens") : "";
  for (size_t at = 0; parsed.ok() && at < list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string part = list.substr(at, comma - at);
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 1 || v > 1000000)
      parsed = InvalidArgument("--tokens: '" + part + "' is not in [1, 1000000]");
    else
      tokens.push_back(static_cast<int>(v));
    at = comma + 1;
  }
  const int reps = parsed.ok() ? static_cast<int>(flags.GetInt("reps")) : 0;
  if (parsed.ok() && (reps < 1 || reps > 1000)) parsed = InvalidArgument("--reps must be in [1, 1000]");
  const int run = parsed.ok() ? static_cast<int>(flags.GetInt("runs")) : 0;
  if (parsed.ok() && (run < 1 || run > 1024)) parsed = InvalidArgument("--runs must be in [1, 1024]");
  if (!parsed.ok() || flags.help_requested()) {
    std::fputs(parsed.ok() ? flags.Help().c_str() : (parsed.message() + "\n").c_str(),
               parsed.ok() ? stdout : stderr);
    return parsed.ok() ? 0 : 2;
  }
  const std::string json_path = flags.GetString("json");
  struct Model {
    std::string name;
    KvLayout layout;
    int tp;
  };
  const std::vector<Model> models = {{"SmolLM2-135M", KvLayout{30, 3, 64, 16}, 3},
                                     {"Llama-3-8B-like", KvLayout{32, 8, 128, 16}, 2}};
  std::vector<Result> results;
  std::printf("| model | degrees | tokens | ordered | orders | order KiB | messages | NCCL sends | "
              "puller ms | publisher ms |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Model& m : models)
    for (int t : tokens)
      for (int to : {1, m.tp})
        for (bool layerwise : {false, true}) {
          Result r = Run(m.name, m.layout, 1, to, t, layerwise, reps, run);
          std::printf("| %s | %s | %d | %s | %zu | %.0f | %zu | %zu | %.2f | %.2f |\n",
                      r.model.c_str(), r.degrees.c_str(), r.tokens, r.mode.c_str(), r.orders,
                      r.order_kib, r.messages, r.sends, r.pull_ms, r.serve_ms);
          std::fflush(stdout);
          results.push_back(r);
        }
  {
    nlohmann::json out = nlohmann::json::array();
    for (const Result& r : results)
      out.push_back({{"model", r.model}, {"degrees", r.degrees}, {"tokens", r.tokens},
                     {"mode", r.mode}, {"orders", r.orders}, {"order_kib", r.order_kib},
                     {"runs", run}, {"messages", r.messages}, {"nccl_sends", r.sends},
                     {"puller_ms", r.pull_ms}, {"publisher_ms", r.serve_ms}});
    std::ofstream(json_path) << out.dump(2) << "\n";
  }
  return 0;
}
