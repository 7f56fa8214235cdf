// NcclLink: one 2-rank NCCL communicator, its stream, header slots and progress thread
// (kvtransfer/nccl/nccl_transport.h).
#include "kvtransfer/nccl/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <utility>

#include "common/engine/cuda/cuda_util.h"
#include "common/engine/cuda/kernels.h"
#include "kvtransfer/nccl_packing.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kHeaderBytes = kNcclHeaderBytes;
constexpr size_t kMaxInflight = 1024;  // header slots; also the bound on queued + posted

// Aborts: the only NCCL teardown that never waits on the peer.
struct CommDeleter {
  void operator()(ncclComm_t comm) const {
    if (comm != nullptr) ncclCommAbort(comm);
  }
};
using CommPtr = std::unique_ptr<ncclComm, CommDeleter>;

struct PinnedDeleter {
  void operator()(void* p) const {
    if (p != nullptr) cudaFreeHost(p);
  }
};
using PinnedPtr = std::unique_ptr<void, PinnedDeleter>;

class CudaEvent {
 public:
  static StatusOr<CudaEvent> Create() {
    cudaEvent_t event = nullptr;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return CudaEvent(event);
  }
  CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& other) noexcept {
    if (this != &other) {
      Reset();
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent() { Reset(); }
  cudaEvent_t get() const { return event_; }

 private:
  explicit CudaEvent(cudaEvent_t event) : event_(event) {}
  void Reset() {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = nullptr;
  }
  cudaEvent_t event_ = nullptr;
};

Status NcclStatus(ncclResult_t result, const char* what, ncclComm_t comm) {
  std::string message = std::string("NCCL ") + what + ": " + ncclGetErrorString(result);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') message += std::string(" (") + last + ")";
  }
  switch (result) {
    case ncclSystemError:
    case ncclRemoteError:
      return Unavailable(std::move(message));
    default:
      return Internal(std::move(message));
  }
}

}  // namespace

StatusOr<std::string> CreateNcclUniqueId() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) return NcclStatus(result, "ncclGetUniqueId", nullptr);
  static_assert(sizeof(id.internal) == kNcclUniqueIdBytes);
  return std::string(id.internal, sizeof(id.internal));
}

// ---- NcclLink ----------------------------------------------------------------------------------

class NcclLink::Impl {
 public:
  Impl(int rank, int device, std::string unique_id, std::chrono::milliseconds timeout,
       std::unique_ptr<NcclBootstrapRoot> root)
      : rank_(rank),
        device_(device),
        unique_id_(std::move(unique_id)),
        init_timeout_(timeout),
        root_(std::move(root)) {}

  // Starts the progress thread, which sets the link up (Init) before anything else.
  void Start() { thread_ = std::thread([this] { Run(); }); }

  // The progress thread tears the link down (Teardown): no CUDA or NCCL call on the caller's
  // thread, whose current device stays as it was.
  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Progress thread, first thing: the stream, the header slots, the staging buffer and the
  // communicator (the buffers first: no cudaMalloc while this link's NCCL kernels are posted).
  Status Init() {
    TANDEM_RETURN_IF_ERROR(cuda::SetDevice(device_));
    TANDEM_ASSIGN_OR_RETURN(stream_, cuda::CudaStream::Create());
    TANDEM_ASSIGN_OR_RETURN(header_dev_, cuda::DeviceBuffer::Allocate(kMaxInflight * kHeaderBytes));
    TANDEM_ASSIGN_OR_RETURN(staging_, cuda::DeviceBuffer::Allocate(kLinkStagingBytes));
    void* pinned = nullptr;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMallocHost(&pinned, kMaxInflight * kHeaderBytes));
    header_host_.reset(pinned);

    ncclUniqueId id;
    std::memcpy(id.internal, unique_id_.data(), sizeof(id.internal));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t result = ncclCommInitRankConfig(&comm, 2, id, rank_, &config);
    CommPtr owned(comm);  // aborted on every early return below
    if (result != ncclSuccess && result != ncclInProgress) {
      return NcclStatus(result, "ncclCommInitRankConfig", comm).WithContext("NCCL link init");
    }
    const Clock::time_point deadline = Clock::now() + init_timeout_;
    TANDEM_RETURN_IF_ERROR(WaitNotInProgress(comm, deadline, /*check_stop=*/true)
                               .WithContext("NCCL link init"));
    comm_ = std::move(owned);
    return Status();
  }


  Status health() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (health_.ok() && !abort_reason_.ok())  // aborting: as good as failed
      return Unavailable("NCCL link aborted: " + abort_reason_.ToString());
    return health_;
  }

  size_t inflight_count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return active_.size() + queued_.size();
  }

  StatusOr<uint64_t> Post(Transfer transfer) {
    uint64_t seq = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!health_.ok()) return health_;
      if (!abort_reason_.ok()) return Unavailable("NCCL link aborted: " + abort_reason_.ToString());
      if (stop_) return FailedPrecondition("NCCL link is shutting down");
      if (active_.size() + queued_.size() >= kMaxInflight) {
        return ResourceExhausted("NCCL link: " + std::to_string(kMaxInflight) +
                                 " transfers already in flight");
      }
      seq = next_seq_++;
      queued_.push_back(Queued{std::move(transfer), seq});
    }
    cv_.notify_all();
    return seq;
  }

  void Abort(const Status& reason) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!health_.ok() || !abort_reason_.ok()) return;
      abort_reason_ = reason.ok() ? Cancelled("NCCL link aborted") : reason;
    }
    cv_.notify_all();
  }

 private:
  struct Queued {
    Transfer transfer;
    uint64_t seq = 0;
  };
  struct Active {
    Transfer transfer;
    uint64_t seq = 0;
    std::vector<CudaEvent> events;  // one per NCCL group (max(layers, 1))
    size_t events_done = 0;
    Status verdict;  // rank 1: the header's, known once group 0 (header included) completed
  };

  void* HeaderDev(uint64_t seq) const {
    return header_dev_.as<char>() + (seq % kMaxInflight) * kHeaderBytes;
  }
  void* HeaderHost(uint64_t seq) const {
    return static_cast<char*>(header_host_.get()) + (seq % kMaxInflight) * kHeaderBytes;
  }

  // In non-blocking mode an NCCL call may leave the communicator "in progress"; no other call
  // may be made on it until ncclCommGetAsyncError says otherwise.
  Status WaitNotInProgress(ncclComm_t comm, Clock::time_point deadline, bool check_stop) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
      if (result != ncclSuccess) return NcclStatus(result, "ncclCommGetAsyncError", comm);
      if (state == ncclSuccess) return Status();
      if (state != ncclInProgress) return NcclStatus(state, "asynchronous error", comm);
      if (Clock::now() >= deadline) return DeadlineExceeded("NCCL operation still in progress");
      if (check_stop) {  // closing or aborted: stop waiting (the caller fails the link)
        std::lock_guard<std::mutex> lock(mutex_);
        if (stop_) return Cancelled("NCCL link closed");
        if (!abort_reason_.ok()) return abort_reason_;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Posts one transfer's groups on the stream. Progress thread only. The transfer is already
  // at the back of active_, so a failure here is handled by FailLink like any other.
  Status Launch(Active& a) {
    const Transfer& t = a.transfer;
    const size_t groups = std::max<size_t>(t.layers, 1);
    a.events.reserve(groups);
    for (size_t i = 0; i < groups; ++i) {
      TANDEM_ASSIGN_OR_RETURN(CudaEvent event, CudaEvent::Create());
      a.events.push_back(std::move(event));
    }
    ncclComm_t comm = comm_.get();
    cudaStream_t stream = stream_.get();
    const int peer = 1 - rank_;
    const bool send = rank_ == 0;
    if (send) {
      const auto header =
          EncodeNcclHeader(MakeNcclHeader(a.seq, t.total_bytes, t.request_id, t.held,
                                          MessageLayoutOf(t.messages, kLinkStagingBytes)));
      std::memcpy(HeaderHost(a.seq), header.data(), kHeaderBytes);
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(HeaderDev(a.seq), HeaderHost(a.seq), kHeaderBytes,
                                                  cudaMemcpyHostToDevice, stream));
    }
    size_t m = 0;
    for (size_t group = 0; group < groups; ++group) {
      // This layer's messages, and how they go (kvtransfer/nccl_packing.h): the direct ones
      // and the first round of packed rows in one NCCL group, each further round in its own.
      const uint32_t layer = t.first_layer + static_cast<uint32_t>(group);
      const size_t begin = m;
      while (m < t.messages.size() && t.messages[m].layer == layer) ++m;
      const std::span<const Message> msgs(t.messages.data() + begin, m - begin);
      const LayerSends plan = PlanLayerSends(msgs, kLinkStagingBytes);
      const size_t rounds = std::max<size_t>(plan.rounds.size(), 1);
      for (size_t round = 0; round < rounds; ++round) {
        const PackRound* packed = round < plan.rounds.size() ? &plan.rounds[round] : nullptr;
        // The sender gathers the round before the group; stream order keeps the previous
        // round's send done before its bytes are overwritten.
        if (send && packed != nullptr)
          TANDEM_RETURN_IF_ERROR(CopyRound(*packed, msgs, /*gather=*/true, stream));
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess) return NcclStatus(r, "ncclGroupStart", comm);
        if (group == 0 && round == 0) {
          r = send ? ncclSend(HeaderDev(a.seq), kHeaderBytes, ncclUint8, peer, comm, stream)
                   : ncclRecv(HeaderDev(a.seq), kHeaderBytes, ncclUint8, peer, comm, stream);
        }
        for (size_t d = 0; round == 0 && d < plan.direct.size(); ++d) {
          const Message& msg = msgs[plan.direct[d]];
          for (uint64_t row = 0; r == ncclSuccess && row < msg.rows; ++row) {
            char* data = static_cast<char*>(msg.data) + row * msg.stride;
            r = send ? ncclSend(data, msg.bytes, ncclUint8, peer, comm, stream)
                     : ncclRecv(data, msg.bytes, ncclUint8, peer, comm, stream);
          }
        }
        if (r == ncclSuccess && packed != nullptr) {
          r = send ? ncclSend(staging_.data(), packed->bytes, ncclUint8, peer, comm, stream)
                   : ncclRecv(staging_.data(), packed->bytes, ncclUint8, peer, comm, stream);
        }
        const ncclResult_t end = ncclGroupEnd();
        if (r != ncclSuccess) return NcclStatus(r, send ? "ncclSend" : "ncclRecv", comm);
        if (end == ncclInProgress) {
          TANDEM_RETURN_IF_ERROR(WaitNotInProgress(comm, t.deadline, /*check_stop=*/true));
        } else if (end != ncclSuccess) {
          return NcclStatus(end, "ncclGroupEnd", comm);
        }
        if (group == 0 && round == 0 && !send) {
          TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(HeaderHost(a.seq), HeaderDev(a.seq),
                                                      kHeaderBytes, cudaMemcpyDeviceToHost,
                                                      stream));
        }
        if (!send && packed != nullptr)
          TANDEM_RETURN_IF_ERROR(CopyRound(*packed, msgs, /*gather=*/false, stream));
      }
      TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(a.events[group].get(), stream));
    }
    if (m != t.messages.size()) {
      return Internal("NCCL link: messages not in layer-major order for " + t.request_id);
    }
    return Status();
  }

  // One round of packed rows between the messages and the staging buffer: gathered into it
  // (`gather`, the sender) or scattered from it (the receiver), a few launches of strided
  // copies (one thread block per part).
  Status CopyRound(const PackRound& round, std::span<const Message> msgs, bool gather,
                   cudaStream_t stream) {
    const std::vector<RowCopy> copies = gather ? GatherCopies(round, msgs, staging_.data())
                                               : ScatterCopies(round, msgs, staging_.data());
    return cuda::CopyRowsBatch(copies.data(), copies.size(), stream);
  }

  // Aborts the communicator, drains the stream and fails every transfer: the one with
  // `culprit_seq` gets `culprit_status`, the others `status`. Progress thread, or the
  // destructor after the thread stopped.
  void FailLink(Status status, std::optional<uint64_t> culprit_seq, Status culprit_status) {
    comm_.reset();  // ncclCommAbort: kernels waiting on the peer exit
    if (stream_.get() != nullptr) {
      (void)cudaStreamSynchronize(stream_.get());  // nothing touches the buffers after this
      (void)cudaGetLastError();
    }
    std::deque<Active> active;
    std::deque<Queued> queued;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (health_.ok()) {
        const Status& cause = culprit_seq ? culprit_status : status;
        health_ = Unavailable("NCCL link failed: " + cause.ToString());
      }
      active.swap(active_);
      queued.swap(queued_);
    }
    auto done = [&](Transfer& t, uint64_t seq) {
      if (t.on_done) t.on_done(culprit_seq && *culprit_seq == seq ? culprit_status : status);
    };
    for (Active& a : active) done(a.transfer, a.seq);
    for (Queued& q : queued) done(q.transfer, q.seq);
  }

  // Completes finished transfers and enforces deadlines; true when something changed.
  bool Poll() {
    bool progressed = false;
    while (!active_.empty()) {
      Active& a = active_.front();
      while (a.events_done < a.events.size()) {
        const cudaError_t q = cudaEventQuery(a.events[a.events_done].get());
        if (q == cudaErrorNotReady) break;
        if (q != cudaSuccess) {
          FailLink(cuda::CudaErrorStatus(q, "cudaEventQuery", __FILE__, __LINE__), std::nullopt,
                   Status());
          return true;
        }
        // The header's copy to the host is in group 0: check it before any layer is reported,
        // so that no layer of filler or of another request counts as landed.
        if (a.events_done == 0 && rank_ == 1) {
          a.verdict = CheckNcclHeader(
              std::span<const uint8_t, kHeaderBytes>(
                  static_cast<const uint8_t*>(HeaderHost(a.seq)), kHeaderBytes),
              a.seq, a.transfer.total_bytes, a.transfer.request_id,
              MessageLayoutOf(a.transfer.messages, kLinkStagingBytes));
          if (a.verdict.code() == StatusCode::kDataLoss) {  // out of step: nothing after counts
            FailLink(Unavailable("NCCL link out of step at " + a.transfer.request_id), a.seq,
                     a.verdict);
            return true;
          }
        }
        if (a.verdict.ok() && a.events_done < a.transfer.layers && a.transfer.on_layer) {
          a.transfer.on_layer(a.transfer.first_layer + static_cast<uint32_t>(a.events_done));
        }
        ++a.events_done;
        progressed = true;
      }
      if (a.events_done < a.events.size()) break;
      Active finished = std::move(a);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        active_.pop_front();
      }
      if (finished.transfer.on_done) finished.transfer.on_done(finished.verdict);
      progressed = true;
    }
    if (active_.empty()) return progressed;

    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm_.get(), &state);
    if (result != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      Status cause = NcclStatus(result != ncclSuccess ? result : state, "peer or network error",
                                comm_.get());
      FailLink(Unavailable(cause.message()), std::nullopt, Status());
      return true;
    }
    const Clock::time_point now = Clock::now();
    for (const Active& a : active_) {
      if (now >= a.transfer.deadline) {
        FailLink(Unavailable("NCCL link aborted: transfer " + a.transfer.request_id + " timed out"),
                 a.seq, DeadlineExceeded("NCCL transfer " + a.transfer.request_id +
                                         " not done within its timeout"));
        return true;
      }
    }
    return progressed;
  }

  void Run() {
    cudaSetDevice(device_);
    Status ready = Init();
    root_.reset();  // set up or failed: the bootstrap root is done with, either way
    if (!ready.ok()) {
      FailLink(Unavailable("NCCL link setup failed: " + ready.ToString()), std::nullopt, Status());
      {  // posts are refused from now on (health_); wait for the destructor
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return stop_; });
      }
      return Teardown();
    }
    for (;;) {
      std::optional<Queued> next;
      Status abort_reason;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (active_.empty()) {
          cv_.wait_for(lock, std::chrono::milliseconds(10), [this] {
            return stop_ || !queued_.empty() || !abort_reason_.ok();
          });
        }
        if (stop_) break;
        abort_reason = std::exchange(abort_reason_, Status());
        if (!abort_reason.ok() && health_.ok())  // failed from now on, before FailLink runs
          health_ = Unavailable("NCCL link failed: " + abort_reason.ToString());
        if (abort_reason.ok() && !queued_.empty() && health_.ok()) {
          next.emplace(std::move(queued_.front()));
          queued_.pop_front();
        }
      }
      if (!abort_reason.ok()) {
        FailLink(abort_reason, std::nullopt, Status());
        continue;
      }
      if (!health_ok_unlocked()) continue;
      bool progressed = false;
      if (next) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          active_.push_back(Active{std::move(next->transfer), next->seq, {}, 0, Status()});
        }
        const uint64_t seq = active_.back().seq;
        Status launched = Launch(active_.back());
        if (!launched.ok()) {
          FailLink(Unavailable("NCCL link aborted: " + launched.ToString()), seq, launched);
          continue;
        }
        progressed = true;
      }
      progressed |= Poll();
      if (!progressed && !active_.empty()) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
    Teardown();
  }

  // Progress thread, last: fails what is still in flight (Cancelled; the communicator aborted
  // and the stream drained first), then frees the communicator, the stream and the buffers.
  void Teardown() {
    bool busy;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy = !active_.empty() || !queued_.empty();
    }
    if (busy) FailLink(Cancelled("NCCL link closed"), std::nullopt, Status());
    comm_.reset();
    header_dev_ = cuda::DeviceBuffer();
    staging_ = cuda::DeviceBuffer();
    header_host_.reset();
    stream_ = cuda::CudaStream();
  }

  // health_ is written only by this thread (FailLink), so this thread may read it unlocked.
  bool health_ok_unlocked() const { return health_.ok(); }

  const int rank_;
  const int device_;
  const std::string unique_id_;
  const std::chrono::milliseconds init_timeout_;
  std::unique_ptr<NcclBootstrapRoot> root_;  // the progress thread ends it once Init has ended
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  Status health_;
  Status abort_reason_;
  uint64_t next_seq_ = 0;
  std::deque<Queued> queued_;  // guarded by mutex_
  std::deque<Active> active_;  // mutated by the progress thread under mutex_
  std::thread thread_;
  cuda::CudaStream stream_;
  cuda::DeviceBuffer header_dev_;
  cuda::DeviceBuffer staging_;  // kLinkStagingBytes, made by Init
  PinnedPtr header_host_;
  CommPtr comm_;  // last: destroyed (aborted) first
};

StatusOr<std::shared_ptr<NcclLink>> NcclLink::Start(std::string_view unique_id_bytes, int rank,
                                                    int device, std::chrono::milliseconds timeout,
                                                    std::unique_ptr<NcclBootstrapRoot> root) {
  if (unique_id_bytes.size() != kNcclUniqueIdBytes) {
    return InvalidArgument("NCCL unique id must be " + std::to_string(kNcclUniqueIdBytes) +
                           " bytes, got " + std::to_string(unique_id_bytes.size()));
  }
  if (rank != 0 && rank != 1) return InvalidArgument("NCCL link rank must be 0 or 1");
  auto impl =
      std::make_unique<Impl>(rank, device, std::string(unique_id_bytes), timeout, std::move(root));
  impl->Start();
  return std::shared_ptr<NcclLink>(new NcclLink(std::move(impl)));
}

NcclLink::NcclLink(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclLink::~NcclLink() = default;
Status NcclLink::health() const { return impl_->health(); }
StatusOr<uint64_t> NcclLink::Post(Transfer transfer) { return impl_->Post(std::move(transfer)); }
void NcclLink::Abort(const Status& reason) { impl_->Abort(reason); }
size_t NcclLink::inflight_count() const { return impl_->inflight_count(); }

}  // namespace tandem
