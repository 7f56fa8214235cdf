// UCX backend of KvPublisher / KvPuller: RMA gets over whatever UCX_TLS allows (tcp, sm, ...).
//
// Each publisher or puller owns one ucp context, one worker and one progress thread; the worker
// is touched only by that thread, callers post commands to it. The region is registered once
// (ucp_mem_map); a puller unpacks a publisher's rkey once per peer. Endpoints use
// UCP_ERR_HANDLING_MODE_PEER: when a peer dies (connection reset, endpoint timeout) every pull
// from it fails with Unavailable and the endpoint is dropped, so a restarted peer (new
// PeerInfo) can be connected again. A pull not done within `timeout` has its gets cancelled and
// fails with DeadlineExceeded; if the gets do not come back shortly after cancellation, the
// peer is treated as hung and dropped like a dead one. The puller sends the TransferResult back
// to the publisher as a UCX active message, which fires the publisher's release callback.
//
// Metrics (when `metrics` is set, on the puller): tandem_kv_transfer_seconds,
// tandem_kv_transfer_bytes_total, tandem_kv_transfer_failures_total{reason},
// tandem_kv_transfers_inflight.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "common/metrics.h"
#include "common/status.h"
#include "kvtransfer/transfer.h"

namespace tandem {

struct UcxOptions {
  // UCX_TLS for this instance ("tcp", "sm", "tcp,sm,self", ...); empty keeps UCX's default
  // (which honours the UCX_TLS environment variable).
  std::string tls = "tcp";
  // A pull not finished in this time fails with DeadlineExceeded.
  std::chrono::milliseconds timeout{5000};
  // Publisher: a published request nobody reported on within this time is released with
  // DeadlineExceeded (the puller died or gave up without saying so).
  std::chrono::milliseconds lease_timeout{60000};
  // Puller: RMA gets in flight at once, over all pulls.
  size_t max_inflight_gets = 64;
  MetricsRegistry* metrics = nullptr;  // not owned; must outlive the object
};

// Registers `region` (not owned; must stay mapped until the publisher is destroyed) and starts
// the progress thread. Errors: InvalidArgument (empty region), Internal (UCX init failed).
// Destroying the publisher releases every lease still open with Cancelled.
StatusOr<std::unique_ptr<KvPublisher>> CreateUcxPublisher(MemoryRegion region,
                                                          const UcxOptions& options);

// Like CreateUcxPublisher, but UCX allocates the `bytes`-long region itself (shared memory
// first, per UCX_ALLOC_PRIO), and stores it in *region (owned by the publisher, unmapped when it
// is destroyed). Over sm this is what makes a get one copy through a mapped segment: UCX 1.13's
// shared-memory RMA (sysv/posix) only reaches memory it allocated; for memory allocated
// elsewhere it falls back to emulating gets with active messages (see the bench numbers).
StatusOr<std::unique_ptr<KvPublisher>> CreateUcxPublisherWithPool(size_t bytes,
                                                                  const UcxOptions& options,
                                                                  MemoryRegion* region);

// As CreateUcxPublisher for the decode side. Destroying the puller fails every pull in flight with
// Cancelled (on_done runs before the destructor returns) and closes all endpoints.
StatusOr<std::unique_ptr<KvPuller>> CreateUcxPuller(MemoryRegion region,
                                                    const UcxOptions& options);

}  // namespace tandem
