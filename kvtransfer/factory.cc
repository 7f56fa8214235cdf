#include "kvtransfer/factory.h"

#include <chrono>

#include "kvtransfer/inprocess_transport.h"
#include "kvtransfer/shm_sweep.h"
#include "kvtransfer/ucx_transport.h"

namespace tandem {
namespace {

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

Status CheckBackend(const TransferSection& transfer) {
  if (transfer.backend == "ucx" || transfer.backend == "inproc") return Status();
  return InvalidArgument("transfer.backend '" + transfer.backend +
                         "' is not supported by the instance servers (ucx or inproc)");
}

UcxOptions UcxOptionsFor(const TransferSection& transfer, const TransferFactoryOptions& options) {
  UcxOptions uo;
  uo.tls = transfer.ucx_tls;
  uo.timeout = Millis(transfer.timeout_s);
  uo.layer_wait_timeout =
      Millis(options.layer_wait_timeout_s > 0 ? options.layer_wait_timeout_s : transfer.timeout_s);
  uo.lease_timeout = Millis(options.lease_timeout_s);
  uo.max_inflight_gets = static_cast<size_t>(transfer.max_inflight);
  uo.report_results = false;  // the control plane's KvReleased is the one report
  uo.metrics = options.metrics;
  return uo;
}

KvPoolMemory MemoryOf(std::shared_ptr<UcxPool> pool) {
  const MemoryRegion region = pool->region();
  KvPoolMemory memory;
  memory.base = static_cast<std::byte*>(region.base);
  memory.bytes = region.bytes;
  memory.owner = std::move(pool);
  return memory;
}

MemoryRegion RegionOf(const KvPoolMemory& memory) { return {memory.base, memory.bytes}; }

}  // namespace

StatusOr<PublisherWithPool> CreatePublisherWithPool(const TransferSection& transfer,
                                                    size_t pool_bytes,
                                                    const TransferFactoryOptions& options) {
  TANDEM_RETURN_IF_ERROR(CheckBackend(transfer));
  PublisherWithPool out;
  if (transfer.backend == "inproc") {
    TANDEM_ASSIGN_OR_RETURN(out.memory, AllocateKvPoolMemory(pool_bytes));
    TANDEM_ASSIGN_OR_RETURN(out.publisher, CreateInProcessPublisher(RegionOf(out.memory)));
    return out;
  }
  const UcxOptions uo = UcxOptionsFor(transfer, options);
  SweepOrphanedSharedMemory();  // what killed instances left: the new pool may need the room
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<UcxPool> pool, AllocateUcxPool(pool_bytes, uo));
  TANDEM_ASSIGN_OR_RETURN(out.publisher, CreateUcxPublisher(pool, uo));
  out.memory = MemoryOf(std::move(pool));
  return out;
}

StatusOr<PullerWithPool> CreatePullerWithPool(const TransferSection& transfer, size_t pool_bytes,
                                              const TransferFactoryOptions& options) {
  TANDEM_RETURN_IF_ERROR(CheckBackend(transfer));
  PullerWithPool out;
  const UcxOptions uo = UcxOptionsFor(transfer, options);
  if (transfer.backend == "inproc") {
    TANDEM_ASSIGN_OR_RETURN(out.memory, AllocateKvPoolMemory(pool_bytes));
    TANDEM_ASSIGN_OR_RETURN(out.puller, CreateInProcessPuller(RegionOf(out.memory), options.metrics,
                                                              uo.layer_wait_timeout));
    return out;
  }
  SweepOrphanedSharedMemory();
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<UcxPool> pool, AllocateUcxPool(pool_bytes, uo));
  TANDEM_ASSIGN_OR_RETURN(out.puller, CreateUcxPuller(pool, uo));
  out.memory = MemoryOf(std::move(pool));
  return out;
}

}  // namespace tandem
