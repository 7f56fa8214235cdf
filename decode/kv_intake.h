// The decode side of the KV handoff: every request announced by a prefill instance's KvReady,
// from its arrival until its KV is in the batch engine (or given up), as one state with one
// transition function:
//
//   kWaiting ──▶ kPulling ──▶ kStreaming ──▶ kReleased
//      │            │  │  └──▶ kPulled ───▶ kReleased
//      │            │  └─────────────────▶ kReleased
//      │            └──▶ kAbandoned ──────▶ kReleased | kFailed
//      └─────────────────────────────────▶ kFailed   (and every non-terminal state ▶ kFailed)
//
//   kWaiting    in the pull queue until AdmitPulls lets it in (blocks for prompt + 1, KV usage
//               under the watermark, a batch slot); prefill holds the KV meanwhile.
//   kPulling    blocks allocated (held here), the pull in flight, not in the batch.
//   kStreaming  layer-wise: the first token is known and the request runs in the batch while
//               its KV arrives (the engine owns the blocks; each step waits per layer).
//   kPulled     layer-wise: the pull ended OK before the first token came (blocks held here).
//   kAbandoned  nobody wants the request any more (Cancel, its router session closed, prefill
//               ended it at its first token) but its pull is in flight: the blocks are freed
//               when the pull ends.
//   kReleased   terminal: the request continues in the batch engine, or ended quietly.
//   kFailed     terminal: it ended with an error (the router got a Finish unless it was gone).
// Any other transition is a bug and aborts (TANDEM_CHECK).
//
// One release path back to prefill: KvReleased goes to the prefill connection exactly once per
// accepted KvReady, in the transition function, when the request leaves a state in which
// prefill must keep the KV (kWaiting, kPulling, kStreaming, kAbandoned). The transport does not
// report to the publisher as well (kvtransfer/factory.h).
//
// Threads: the engine thread only; pull callbacks reach it through InstanceHost::Post.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/metrics.h"
#include "common/net/control_wire.h"
#include "common/serving/instance_host.h"
#include "decode/batch_engine.h"
#include "kvtransfer/transfer.h"

namespace tandem {

enum class IntakeState { kWaiting, kPulling, kStreaming, kPulled, kAbandoned, kReleased, kFailed };
const char* IntakeStateName(IntakeState state);
bool IntakeTransitionAllowed(IntakeState from, IntakeState to);

// How long before prefill's hold on a request's KV ends (prefill.kv_hold_timeout_s) decode stops
// starting its pull and fails it instead (KvIntake::ExpireWaiting): a pull must be over before
// prefill may reuse the blocks. 1 s; with cuda_ipc the transfer timeout, since its copies read
// prefill's pool directly and nothing would tell a reused block from the request's (ucx reads
// are served by the publisher, which refuses a released request; nccl sends a header that says
// so): CudaIpcPullMarginSeconds, whatever the hold (configs with a hold shorter than twice it
// are refused). The 1 s of the others is at most a fifth of the hold: a short hold must still
// leave time to pull.
double PullStartMarginSeconds(std::string_view transfer_backend, double transfer_timeout_s,
                              double hold_timeout_s);

struct KvIntakeOptions {
  int32_t block_size = 16;
  int32_t max_batch_size = 64;
  double kv_usage_watermark = 0.95;
  double hold_timeout_s = 20;  // prefill.kv_hold_timeout_s: prefill frees unpulled KV then
  double pull_start_margin_s = 1;  // PullStartMarginSeconds
  bool layerwise = false;      // a request may join the batch mid-pull
  Histogram* handoff_wait = nullptr;  // from learning the first token to having all of the KV
};

class KvIntake {
 public:
  using Clock = std::chrono::steady_clock;

  // `sink` receives the router-bound Finish of a request that fails here (it routes by id).
  // Everything passed must outlive the intake.
  KvIntake(InstanceHost& host, BatchEngine& engine, KvPuller& puller, EngineSink& sink,
           KvIntakeOptions options);

  // KvReady from prefill connection `prefill`: validated, then kWaiting. A refused one gets a
  // Finish (to the router) and a KvReleased (to prefill) with the reason.
  void Accept(ConnId prefill, KvReady ready);
  // Refuses a KvReady nobody wants any more (its router session is closed, or it was cancelled
  // before it came): KvReleased to prefill at once, nothing to the router.
  void RefuseQuietly(ConnId prefill, const KvReady& ready, const Status& why);
  // Layer-wise progress from prefill.
  void Progress(const KvProgress& progress);

  bool Known(const std::string& id) const { return entries_.count(id) > 0; }
  // The router cancelled `id` (a Finish with Cancelled goes out), or gave it up (`quietly`:
  // nothing goes out). False when the intake does not hold it.
  bool Cancel(const std::string& id, bool quietly);
  // Prefill connection `conn` closed: requests that cannot get their KV or first token any more
  // fail.
  void PrefillClosed(ConnId conn);
  // Expires waiting requests and starts the pulls that fit now.
  void Admit();
  // Ends what is not in the engine with `why` (drain over). Pulls in flight are left to the
  // puller's destruction.
  void FailAll(const Status& why);

  bool empty() const { return entries_.empty(); }
  int32_t waiting() const { return static_cast<int32_t>(waiting_.size()); }
  // Pulls in flight whose request is not in the batch (layer-wise ones that joined count there).
  int32_t outside_engine() const;

 private:
  struct Entry {
    IntakeState state = IntakeState::kWaiting;
    KvReady ready;  // layers_ready and first_token follow KvProgress
    ConnId prefill = 0;
    int32_t blocks_needed = 0;
    std::vector<int32_t> blocks;  // held here in kPulling, kPulled, kAbandoned
    Clock::time_point first_token_at;  // when this instance learned the first token
    std::shared_ptr<KvArrival> arrival;  // layer-wise pulls
    bool prefill_gone = false;
  };

  // The one transition function (see the file comment for what it sends and frees).
  void Transition(const std::string& id, Entry& entry, IntakeState to, const Status& why);
  void StartPull(const std::string& id, Entry& entry);
  void PullDone(const std::string& id, const Status& status);
  // The first token is known and the pull ended OK: the request continues in the engine.
  void Complete(const std::string& id, Entry& entry);
  void JoinEngine(const std::string& id, Entry& entry);
  void ExpireWaiting();
  void FinishError(const std::string& id, const Status& status);
  void SendReleased(ConnId prefill, const std::string& id, const Status& status);

  InstanceHost& host_;
  BatchEngine& engine_;
  KvPuller& puller_;
  EngineSink& sink_;
  const KvIntakeOptions options_;
  std::map<std::string, Entry> entries_;
  std::deque<std::string> waiting_;  // kWaiting ids, FCFS
};

}  // namespace tandem
