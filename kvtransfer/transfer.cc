#include "kvtransfer/transfer.h"

#include <algorithm>

namespace tandem {

Status CheckRanges(const LayerRanges& layers, uint64_t region_bytes) {
  for (size_t l = 0; l < layers.size(); ++l) {
    for (const ByteRange& r : layers[l]) {
      if (r.offset > region_bytes || r.length > region_bytes - r.offset) {
        return InvalidArgument("layer " + std::to_string(l) + ": range [" +
                               std::to_string(r.offset) + ", +" + std::to_string(r.length) +
                               ") is outside the region of " + std::to_string(region_bytes) +
                               " bytes");
      }
    }
  }
  return Status();
}

StatusOr<std::vector<CopyPiece>> PlanCopies(const LayerRanges& remote, uint64_t remote_bytes,
                                            const LayerRanges& local, uint64_t local_bytes) {
  if (remote.size() != local.size()) {
    return InvalidArgument("descriptor has " + std::to_string(remote.size()) +
                           " layers, local ranges have " + std::to_string(local.size()));
  }
  TANDEM_RETURN_IF_ERROR(CheckRanges(remote, remote_bytes).WithContext("remote"));
  TANDEM_RETURN_IF_ERROR(CheckRanges(local, local_bytes).WithContext("local"));
  std::vector<CopyPiece> pieces;
  for (size_t l = 0; l < remote.size(); ++l) {
    TANDEM_ASSIGN_OR_RETURN(uint64_t remote_total, TotalBytes({remote[l]}));
    TANDEM_ASSIGN_OR_RETURN(uint64_t local_total, TotalBytes({local[l]}));
    if (remote_total != local_total) {
      return InvalidArgument("layer " + std::to_string(l) + ": remote has " +
                             std::to_string(remote_total) + " bytes, local ranges " +
                             std::to_string(local_total));
    }
    // Two cursors over the two range lists; each piece ends where either range ends.
    size_t ri = 0, li = 0;
    uint64_t r_used = 0, l_used = 0;
    while (ri < remote[l].size() && li < local[l].size()) {
      const ByteRange& r = remote[l][ri];
      const ByteRange& q = local[l][li];
      if (r.length == r_used) { ++ri; r_used = 0; continue; }
      if (q.length == l_used) { ++li; l_used = 0; continue; }
      uint64_t n = std::min(r.length - r_used, q.length - l_used);
      pieces.push_back({static_cast<uint32_t>(l), r.offset + r_used, q.offset + l_used, n});
      r_used += n;
      l_used += n;
    }
  }
  CoalesceCopies(&pieces);
  return pieces;
}

void CoalesceCopies(std::vector<CopyPiece>* pieces) {
  size_t kept = 0;
  for (size_t i = 0; i < pieces->size(); ++i) {
    const CopyPiece& p = (*pieces)[i];
    if (kept > 0) {
      CopyPiece& last = (*pieces)[kept - 1];
      if (last.layer == p.layer && last.remote_pool == p.remote_pool &&
          last.local_pool == p.local_pool && last.remote_offset + last.length == p.remote_offset &&
          last.local_offset + last.length == p.local_offset) {
        last.length += p.length;
        continue;
      }
    }
    (*pieces)[kept++] = p;
  }
  pieces->resize(kept);
}

TransferMetrics::TransferMetrics(MetricsRegistry* registry) {
  if (registry == nullptr) return;
  seconds_ = &registry
                  ->AddHistogram("tandem_kv_transfer_seconds",
                                 "Time to pull one request's KV, start to last byte or failure "
                                 "(layer-wise: less the time spent waiting for layers to be computed)",
                                 {}, LatencyBuckets())
                  .Get();
  bytes_ = &registry->AddCounter("tandem_kv_transfer_bytes_total", "KV bytes pulled").Get();
  failures_ = &registry->AddCounter("tandem_kv_transfer_failures_total",
                                    "KV pulls that failed, by reason", {"reason"});
  inflight_ = &registry->AddGauge("tandem_kv_transfers_inflight", "KV pulls in progress").Get();
}

void TransferMetrics::Started() {
  if (inflight_) inflight_->Inc();
}

void TransferMetrics::Succeeded(double seconds, uint64_t bytes) {
  if (!inflight_) return;
  inflight_->Dec();
  seconds_->Observe(seconds);
  bytes_->Inc(static_cast<double>(bytes));
}

void TransferMetrics::Failed(double seconds, std::string_view reason) {
  if (!inflight_) return;
  inflight_->Dec();
  seconds_->Observe(seconds);
  failures_->WithLabels({std::string(reason)}).Inc();
}

std::string_view TransferMetrics::ReasonFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kDeadlineExceeded: return "timeout";
    case StatusCode::kUnavailable: return "peer_unavailable";
    case StatusCode::kCancelled: return "cancelled";
    case StatusCode::kInvalidArgument: return "invalid";
    case StatusCode::kPermissionDenied: return "refused";  // the publisher refused a read
    case StatusCode::kNotFound: return "released";  // the publisher no longer holds it
    default: return "transport";
  }
}

PullCallbacks PullWaiter::callbacks() {
  PullCallbacks cb;
  std::shared_ptr<State> state = state_;
  cb.on_layer = [state](uint32_t) {
    MutexLock lock(&state->mutex);
    ++state->layers_done;
  };
  cb.on_done = [state](const std::string&, const Status& status) {
    MutexLock lock(&state->mutex);
    state->status = status;
    state->cv.notify_all();
  };
  return cb;
}

Status PullWaiter::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&state_->mutex);
  while (!state_->status.has_value()) {
    if (state_->cv.wait_until(state_->mutex, deadline) != std::cv_status::timeout) continue;
    if (state_->status.has_value()) break;
    return DeadlineExceeded("pull did not finish within " + std::to_string(timeout.count()) +
                            " ms");
  }
  return *state_->status;
}

uint32_t PullWaiter::layers_done() const {
  MutexLock lock(&state_->mutex);
  return state_->layers_done;
}

}  // namespace tandem
