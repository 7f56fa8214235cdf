// What the NCCL transport's publisher (nccl_publisher.cc) and puller (nccl_puller.cc) share:
// argument checks, when a link may close, and a pair's transfer. Internal to those two files;
// the contract is kvtransfer/nccl_endpoints.h.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/base/reaper.h"
#include "common/base/status.h"
#include "kvtransfer/nccl_endpoints.h"
#include "kvtransfer/nccl_protocol.h"
#include "kvtransfer/wire.h"

namespace tandem::nccl_detail {

using Clock = std::chrono::steady_clock;

constexpr auto kIdleLinkTimeout = std::chrono::seconds(kIdleLinkSeconds);

inline Status CheckRequestId(const std::string& id) {
  if (id.empty()) return InvalidArgument("empty request id");
  if (id.size() > kKvMaxRequestIdBytes) return InvalidArgument("request id too long");
  return Status();
}

inline Status CheckPools(const std::vector<MemoryRegion>& pools, const KvPoolShape& shape,
                  const OrderedLinkMaker& maker) {
  TANDEM_RETURN_IF_ERROR(shape.Validate());
  if (pools.size() != static_cast<size_t>(shape.degree))
    return InvalidArgument(std::to_string(pools.size()) + " KV pools for tensor_parallel " +
                           std::to_string(shape.degree));
  for (const MemoryRegion& pool : pools)
    if (pool.base == nullptr || pool.bytes < shape.pool_bytes())
      return InvalidArgument("a KV pool smaller than its shape's " +
                             std::to_string(shape.pool_bytes()) + " bytes");
  if (!maker.new_unique_id || !maker.start) return InvalidArgument("a link maker without functions");
  return Status();
}

// The links one endpoint call lets go of, handed to the endpoint's reaper when this goes out of
// scope: declared before the call takes its lock, so that happens after the lock is released,
// and the calling thread (an engine's, the I/O thread) never waits on a link's teardown (an
// NCCL link's frees wait for its GPU to go idle).
struct LinksToReap {
  explicit LinksToReap(Reaper& reaper) : reaper(reaper) {}
  ~LinksToReap() {
    for (std::shared_ptr<OrderedLink>& link : links) reaper.Drop(std::move(link));
  }
  LinksToReap(const LinksToReap&) = delete;
  LinksToReap& operator=(const LinksToReap&) = delete;
  Reaper& reaper;
  std::vector<std::shared_ptr<OrderedLink>> links;
};

// A link that failed, or that nothing used for a minute and has nothing in flight.
inline bool Closable(const OrderedLink& link, Clock::time_point last_used, Clock::time_point now) {
  if (link.inflight_count() > 0) return false;
  return !link.health().ok() || now - last_used > kIdleLinkTimeout;
}

// The transfer of one pair's pieces of layers [first, end), on one side.
inline OrderedLink::Transfer TransferOf(const std::string& id, uint32_t first, uint32_t end,
                                 const NcclPairPlan& pair, const MemoryRegion& pool,
                                 bool remote_side) {
  OrderedLink::Transfer t;
  t.request_id = id;
  t.first_layer = first;
  t.layers = end - first;
  t.total_bytes = pair.bytes;
  for (const StridedCopy& c : pair.pieces) {
    const uint64_t offset = remote_side ? c.remote_offset : c.local_offset;
    const uint64_t stride = remote_side ? c.remote_stride : c.local_stride;
    t.messages.push_back(
        {c.layer, static_cast<char*>(pool.base) + offset, c.length, c.rows, stride});
  }
  return t;
}

}  // namespace tandem::nccl_detail
