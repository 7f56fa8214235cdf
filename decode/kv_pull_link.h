// Adapter over kvtransfer's KvPuller for the decode server.
//
// Why it exists: common/net/control_wire.h and kvtransfer/wire.h both define tandem::kMaxBlobBytes
// (with different values), so no translation unit can include both. This adapter is the only
// decode file that includes kvtransfer headers; its interface takes the encoded PeerInfo and
// KvDescriptor blobs exactly as they arrive in KvReady.
//
// Threads: as KvPuller (any thread); on_done runs on the transport's thread (or, for the
// in-process backend, inside Pull).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/engine/kv_cache.h"
#include "common/base/metrics.h"
#include "common/base/status.h"

namespace tandem {

// Per layer, (offset, length) byte ranges in the registered region.
using PullRanges = std::vector<std::vector<std::pair<uint64_t, uint64_t>>>;

struct KvPullOptions {
  std::string backend = "ucx";  // ucx|inproc
  std::string ucx_tls = "tcp";
  double timeout_s = 5;
  // Layer-wise: the longest wait for prefill to announce the next layer (0 = timeout_s).
  double layer_wait_timeout_s = 0;
  size_t max_inflight = 64;
  MetricsRegistry* metrics = nullptr;  // not owned
};

class KvPullLink {
 public:
  // Registers [base, base + bytes) (not owned; must outlive the link).
  static StatusOr<std::unique_ptr<KvPullLink>> Create(void* base, size_t bytes,
                                                      const KvPullOptions& options);
  // Creates the link together with the KV pool's memory, `bytes` long, stored in *memory (pass
  // it to KvCache::Create). For ucx the transport allocates it (UCX-mapped, so that shared-memory
  // transports do RMA on it: see kvtransfer/ucx_transport.h UcxPool) and registers it once; for
  // inproc it is heap memory as KvCache would allocate. memory->owner keeps it alive, so the
  // cache and the link may go in either order.
  static StatusOr<std::unique_ptr<KvPullLink>> CreateWithPool(size_t bytes, const KvPullOptions& options,
                                                        KvPoolMemory* memory);
  virtual ~KvPullLink() = default;  // fails pulls in flight with Cancelled

  // Decodes both blobs, connects to the publisher (once per instance id) and checks that the
  // descriptor has `num_layers` layers. InvalidArgument/DataLoss on bad blobs.
  virtual Status Prepare(const std::string& peer_info_blob, const std::string& descriptor_blob,
                         int num_layers) = 0;
  // Starts the pull; on_done runs exactly once unless an error is returned. on_layer (optional)
  // runs once per layer, in layer order 0, 1, ..., when every byte of that layer is in `local`
  // (the UCX puller issues its gets in layer order): an engine could start layer l of the first
  // decode step then. It runs on the transport's thread, before on_done.
  // layers_available (layer-wise streaming, negative = all): only layers below it are read
  // until SetLayersAvailable raises it (timeouts: kvtransfer/transfer.h KvPuller::Pull).
  virtual Status Pull(const std::string& descriptor_blob, const PullRanges& local,
                      std::function<void(const std::string&, const Status&)> on_done,
                      std::function<void(uint32_t layer)> on_layer = nullptr,
                      int32_t layers_available = -1) = 0;
  // Raises the layers of a pull in flight that may be read (negative = all). NotFound when the
  // pull is over.
  virtual Status SetLayersAvailable(const std::string& request_id, int32_t layers) = 0;
};

}  // namespace tandem
