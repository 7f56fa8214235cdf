// In-process backend of KvPublisher / KvPuller: memcpy between two regions of one process, for
// the colocated server and for tests. Publishers register in a process-wide table under their
// instance_id; a puller connects by PeerInfo like with UCX (transport "inprocess").
//
// Differences from UCX, by design: Pull copies in the calling thread and runs on_layer/on_done
// before it returns (there is no network to wait on), and the publisher's release callback runs
// in that same thread. A publisher being destroyed waits for a copy from it to finish; after
// that, pulls from it fail with Unavailable. Thread-safe.
#pragma once

#include <memory>

#include "common/metrics.h"
#include "common/status.h"
#include "kvtransfer/transfer.h"

namespace tandem {

// `region` is not owned and must stay valid until the object is destroyed.
// Errors: InvalidArgument (empty region).
StatusOr<std::unique_ptr<KvPublisher>> CreateInProcessPublisher(MemoryRegion region);
StatusOr<std::unique_ptr<KvPuller>> CreateInProcessPuller(MemoryRegion region,
                                                          MetricsRegistry* metrics = nullptr);

}  // namespace tandem
