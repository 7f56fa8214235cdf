#include "common/engine/cpu_all_reduce.h"

#include <string>

namespace tandem {

CpuAllReduce::CpuAllReduce(int participants, std::chrono::milliseconds timeout)
    : participants_(participants),
      timeout_(timeout),
      buffers_(participants, nullptr),
      arrived_(participants, 0) {
  TANDEM_CHECK(participants >= 1, "all-reduce needs a participant");
  TANDEM_CHECK(timeout.count() > 0, "all-reduce needs a positive timeout");
}

bool CpuAllReduce::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

void CpuAllReduce::Break() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
  }
  cv_.notify_all();
}

Status CpuAllReduce::Barrier(std::unique_lock<std::mutex>& lock, int rank) {
  if (broken_) return FailedPrecondition("all-reduce: broken by an earlier timeout");
  const uint64_t generation = generation_;
  arrived_[rank] = generation + 1;
  if (++waiting_ == participants_) {
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
    return Status::Ok();
  }
  const bool passed =
      cv_.wait_for(lock, timeout_, [&] { return generation_ != generation || broken_; });
  if (passed && generation_ != generation) return Status::Ok();
  if (broken_) return FailedPrecondition("all-reduce: broken by an earlier timeout");
  broken_ = true;
  cv_.notify_all();
  std::string missing;
  for (int r = 0; r < participants_; ++r) {
    if (arrived_[r] <= generation) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  return DeadlineExceeded("all-reduce: rank " + std::to_string(rank) + " waited " +
                          std::to_string(timeout_.count()) + " ms for rank(s) " + missing);
}

Status CpuAllReduce::AllReduce(int rank, float* data, size_t count) {
  TANDEM_CHECK(rank >= 0 && rank < participants_, "all-reduce rank " + std::to_string(rank));
  if (participants_ == 1) return Status::Ok();
  std::unique_lock<std::mutex> lock(mu_);
  if (waiting_ == 0) count_ = count;  // the first rank into the call sets it
  TANDEM_CHECK(count == count_, "all-reduce: rank " + std::to_string(rank) + " brings " +
                                    std::to_string(count) + " elements, another " +
                                    std::to_string(count_));
  buffers_[rank] = data;
  TANDEM_RETURN_IF_ERROR(Barrier(lock, rank));
  // Every buffer is registered, and buffers_ does not change until every rank has passed the
  // second barrier, so it is read without the lock. This rank owns elements [begin, end): it
  // reads them from every buffer and writes their sum back into every buffer.
  float* const* buffers = buffers_.data();
  lock.unlock();
  const size_t begin = count * rank / participants_, end = count * (rank + 1) / participants_;
  for (size_t i = begin; i < end; ++i) {
    float sum = buffers[0][i];
    for (int r = 1; r < participants_; ++r) sum += buffers[r][i];
    for (int r = 0; r < participants_; ++r) buffers[r][i] = sum;
  }
  lock.lock();
  return Barrier(lock, rank);
}

}  // namespace tandem
