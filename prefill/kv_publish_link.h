// Adapter over kvtransfer's KvPublisher for the prefill server.
//
// Why it exists: common/net/control_wire.h and kvtransfer/wire.h both define tandem::kMaxBlobBytes
// (with different values), so no translation unit can include both. The server speaks the
// control plane; this adapter is the only prefill file that includes kvtransfer headers, and
// its interface carries KV descriptors and peer info as encoded blobs.
//
// Threads: as KvPublisher (any thread); the release callback runs on the transport's thread.
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
using PublishRanges = std::vector<std::vector<std::pair<uint64_t, uint64_t>>>;

struct KvPublishOptions {
  std::string backend = "ucx";  // ucx|inproc
  std::string ucx_tls = "tcp";
  double timeout_s = 5;
  double lease_timeout_s = 60;
  MetricsRegistry* metrics = nullptr;  // not owned
};

class KvPublishLink {
 public:
  // Registers [base, base + bytes) (not owned; must outlive the link).
  static StatusOr<std::unique_ptr<KvPublishLink>> Create(void* base, size_t bytes,
                                                         const KvPublishOptions& options);
  // Creates the link together with the KV pool's memory, `bytes` long, stored in *memory (pass
  // it to KvCache::Create). For ucx the transport allocates it (UCX-mapped, so that shared-memory
  // transports do RMA on it: see kvtransfer/ucx_transport.h UcxPool) and registers it once; for
  // inproc it is heap memory as KvCache would allocate. memory->owner keeps it alive, so the
  // cache and the link may go in either order.
  static StatusOr<std::unique_ptr<KvPublishLink>> CreateWithPool(size_t bytes, const KvPublishOptions& options,
                                                        KvPoolMemory* memory);
  virtual ~KvPublishLink() = default;

  // The encoded PeerInfo (for Hello and KvReady).
  virtual const std::string& peer_info_blob() const = 0;
  // Publishes ranges; returns the encoded KvDescriptor. on_release: see kvtransfer/transfer.h.
  virtual StatusOr<std::string> Publish(
      const std::string& request_id, const PublishRanges& ranges,
      std::function<void(const std::string&, const Status&)> on_release) = 0;
  // Drops the lease (the result came over the control plane). Unknown ids are ignored.
  virtual void Release(const std::string& request_id, const Status& status) = 0;
};

}  // namespace tandem
