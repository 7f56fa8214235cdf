// In-process backend of KvPublisher / KvPuller: memcpy between two regions of one process, for
// the colocated server and for tests. Publishers register in a process-wide table under their
// instance_id; a puller connects by PeerInfo like with UCX (transport "inprocess").
//
// Differences from UCX, by design: Pull copies the available layers in the calling thread and
// runs on_layer (and on_done, when every layer was available) before it returns; there is no
// network to wait on. SetLayersAvailable copies the newly available layers in its caller's
// thread likewise. The publisher's release callback runs in the thread that finished the pull.
// A small watchdog thread fails a pull whose next layer was not announced within
// `layer_wait_timeout` (counted from Pull and from each SetLayersAvailable that raised the count)
// with DeadlineExceeded (copies are synchronous: a pull in flight only ever waits for layers). A publisher being destroyed waits for a copy from it to finish; after
// that, pulls from it fail with Unavailable. Destroying the puller fails pulls still waiting
// for layers with Cancelled. Thread-safe.
#pragma once

#include <chrono>
#include <memory>

#include "common/base/metrics.h"
#include "common/base/status.h"
#include "kvtransfer/transfer.h"

namespace tandem {

// `region` is not owned and must stay valid until the object is destroyed.
// Errors: InvalidArgument (empty region).
StatusOr<std::unique_ptr<KvPublisher>> CreateInProcessPublisher(MemoryRegion region);
StatusOr<std::unique_ptr<KvPuller>> CreateInProcessPuller(
    MemoryRegion region, MetricsRegistry* metrics = nullptr,
    std::chrono::milliseconds layer_wait_timeout = std::chrono::milliseconds(5000));

}  // namespace tandem
