#include "common/engine/tp_forward.h"

#include <string>

namespace tandem {

TpCpuForward::TpCpuForward(TpPlan plan, std::chrono::milliseconds collective_timeout)
    : plan_(std::move(plan)),
      all_reduce_(plan_.degree, collective_timeout),
      forward_status_(plan_.degree),
      collective_status_(plan_.degree),
      threads_(plan_.degree) {}

StatusOr<std::unique_ptr<TpCpuForward>> TpCpuForward::Create(
    const Model& full, int degree, const ForwardOptions& options,
    std::chrono::milliseconds collective_timeout) {
  TANDEM_ASSIGN_OR_RETURN(TpPlan plan, MakeTpPlan(full.config(), degree));
  if (collective_timeout.count() <= 0)
    return InvalidArgument("tensor-parallel forward: the collective timeout must be positive");
  auto tp = std::unique_ptr<TpCpuForward>(new TpCpuForward(std::move(plan), collective_timeout));
  for (int r = 0; r < degree; ++r) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Model> shard, ShardModel(full, tp->plan_, r));
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CpuForward> forward,
                            CpuForward::Create(*shard, options));
    tp->shards_.push_back(std::move(shard));
    tp->forwards_.push_back(std::move(forward));
    ForwardHooks hooks;
    if (degree > 1) {
      TpCpuForward* self = tp.get();
      hooks.all_reduce = [self, r](float* data, size_t count) {
        Status s = self->all_reduce_.AllReduce(r, data, count);
        if (!s.ok() && self->collective_status_[r].ok()) self->collective_status_[r] = s;
      };
    }
    tp->hooks_.push_back(std::move(hooks));
  }
  return tp;
}

KvLayout TpCpuForward::MakeKvLayout(int block_size) const {
  return forwards_[0]->MakeKvLayout(block_size);
}

void TpCpuForward::RunRank(int rank) {
  StatusOr<std::span<const float>> out =
      forwards_[rank]->Forward(batch_, *caches_[rank], mode_, &hooks_[rank]);
  forward_status_[rank] = out.status();
  if (rank == 0 && out.ok()) logits_ = *out;
}

StatusOr<std::span<const float>> TpCpuForward::Forward(std::span<const SequenceInput> batch,
                                                       std::span<KvCache* const> caches,
                                                       LogitsMode mode) {
  const int t = plan_.degree;
  if (static_cast<int>(caches.size()) != t)
    return InvalidArgument("tensor-parallel forward: " + std::to_string(caches.size()) +
                           " KV pools for " + std::to_string(t) + " ranks");
  // Checked here so that every rank's CpuForward::Validate gives the same answer: a rank that
  // refused the batch alone would leave the others waiting in the collective.
  for (int r = 0; r < t; ++r) {
    if (caches[r] == nullptr ||
        caches[r]->layout() != MakeKvLayout(caches[r]->layout().block_size) ||
        caches[r]->layout() != caches[0]->layout() ||
        caches[r]->num_blocks() != caches[0]->num_blocks())
      return InvalidArgument("tensor-parallel forward: rank " + std::to_string(r) +
                             "'s KV pool is not one of MakeKvLayout's layout (" +
                             MakeKvLayout().ToString() + ") and rank 0's size");
  }
  if (all_reduce_.broken())
    return FailedPrecondition("tensor-parallel forward: the collective broke in an earlier call");
  batch_ = batch;
  caches_ = caches;
  mode_ = mode;
  // Bounded: a rank that waits for another in the collective gives up after its timeout.
  threads_.Run([this](int rank) { RunRank(rank); });
  // A timeout first: the FailedPrecondition of the other ranks follows from it.
  for (int r = 0; r < t; ++r)
    if (collective_status_[r].code() == StatusCode::kDeadlineExceeded) return collective_status_[r];
  for (int r = 0; r < t; ++r) TANDEM_RETURN_IF_ERROR(collective_status_[r]);
  for (int r = 0; r < t; ++r) TANDEM_RETURN_IF_ERROR(forward_status_[r]);
  return logits_;
}

}  // namespace tandem
