// The router's Backend over the control plane (common/net/control_channel.h): one control
// connection to every configured instance, placement per request (router/placement.h), and the
// token stream of each request routed back to its callback by request id.
//
// Instances: instance I of section S (prefill|decode|colocated) is at 127.0.0.1:(S.port + I).
// The backend connects to each (router speaks first: Hello{role router}), retries with backoff
// (100 ms doubling to 2 s) so that an instance started later or restarted is picked up, and
// counts an instance usable once it has answered Hello and while its LoadReports keep coming
// (none for `heartbeat_timeout_s` = down: the connection is closed).
//
// Requests: Submit places the request and sends Submit to the prefill instance (with the decode
// instance's control address) or to a colocated one. Tokens and Finish come from whichever
// instance holds the request; the first token comes from prefill, and decode's events that
// overtake it are held back so that the callback sees them in order. When an instance's
// connection drops, exactly the requests it held fail with Unavailable naming the instance:
// a prefill instance holds a request until its first token reached the router, a decode
// instance from placement to the end, a colocated one throughout. The other instance of a
// failed request is told to Cancel it. Every accepted request gets exactly one final event.
//
// Load: placement sees, per instance, its latest LoadReport plus what this router placed there
// that the report does not include yet. Reports lag (a server computes one after each engine
// step and takes new requests in only between steps): every Submit carries a per-instance
// sequence number and every report the last one the instance had taken in, so the router adds
// back exactly the Submits the report lacks; a decode instance is counted for a request from
// placement until prefill's first token (it learns of the request from prefill's KvReady).
//
// Latency model: when `router.latency_model` names a file, Start() loads it (a bad file, or one
// without an entry for a configured section's device/threads/tensor_parallel/pipeline_parallel,
// fails Start with the file's own message) and goodput placement predicts from it (see
// router/placement.h); SIGHUP (Reconfigure) reloads it.
//
// Threads: all public methods are thread-safe. Callbacks run on the backend's Asio threads (or
// the monitor thread, or inside Cancel/Submit for failures), never two at once for one request.
// Lifecycle: construct, Start(), ..., Stop() (fails what is still in flight with Unavailable and
// joins the threads; the destructor calls it).
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/config/config.h"
#include "common/net/control_channel.h"
#include "common/engine/latency_model.h"
#include "common/base/metrics.h"
#include "router/backend.h"
#include "router/placement.h"

namespace tandem {

// The latency model a router uses: the file named by config.router.latency_model (a relative
// path is relative to the directory of config.source) and, per instance section, the entry for
// its shape (null for a section with no instances). `file` is null when the key is empty.
struct RouterLatencyModels {
  std::shared_ptr<const LatencyModelFile> file;
  const LatencyModel* prefill = nullptr;
  const LatencyModel* decode = nullptr;
  const LatencyModel* colocated = nullptr;
};
// Errors: the file's NotFound/InvalidArgument (file:line:column: field: ...), or
// InvalidArgument naming the section whose shape has no entry.
StatusOr<RouterLatencyModels> LoadRouterLatencyModels(const ClusterConfig& config);

struct ClusterBackendOptions {
  double heartbeat_timeout_s = 1.0;   // no LoadReport for this long = instance down
  double connect_timeout_s = 0.5;     // one connection attempt
  double backoff_initial_s = 0.1;     // reconnect delay after a failure, doubling ...
  double backoff_max_s = 2.0;         // ... up to this
  double cancel_grace_s = 30.0;       // a cancelled request with no Finish by then is failed
  int io_threads = 2;
  std::string host = "127.0.0.1";     // where the instances listen
  MetricsRegistry* metrics = nullptr;  // not owned; null = no backend metrics
};

// One configured instance as the backend sees it (for logs, tests and /metrics).
struct InstanceStatus {
  std::string name;     // "decode-1"
  std::string address;  // "127.0.0.1:7101"
  InstanceRole role = InstanceRole::kPrefill;
  bool connected = false;  // control connection open and Hello answered
  bool usable = false;     // connected and heartbeat fresh
  int requests = 0;        // requests it holds now
};

class ClusterBackend : public Backend {
 public:
  // Instances and the policy come from `config` (prefill, decode, colocated sections; router
  // policy; slo). The ports must be resolved (non-zero) for every section with instances.
  ClusterBackend(const ClusterConfig& config, ClusterBackendOptions options = {});
  ~ClusterBackend() override;
  ClusterBackend(const ClusterBackend&) = delete;
  ClusterBackend& operator=(const ClusterBackend&) = delete;

  // Validates the config (ports set, policy known) and starts the io and monitor threads.
  // InvalidArgument on a bad config; the backend is then unusable.
  Status Start();
  // Fails every request in flight (Unavailable "router stopping"), closes the connections and
  // joins the threads. Idempotent.
  void Stop();

  // Applies a reloaded config's policy and SLOs to new requests (SIGHUP); requests in flight
  // are untouched. Instance layout changes are not applied (logged). InvalidArgument on a bad
  // policy (nothing changes).
  Status Reconfigure(const ClusterConfig& config);

  // Backend.
  Status Submit(const GenerateRequest& request,
                std::function<void(BackendEvent)> on_event) override;
  void Cancel(const std::string& request_id) override;
  bool Ready() const override;

  std::vector<InstanceStatus> Instances() const;
  // Requests accepted and not yet finished.
  int InFlight() const;

 private:
  struct Instance;
  struct Request;
  using Clock = std::chrono::steady_clock;

  void MonitorLoop();
  void TryConnect(size_t index);
  void OnMessage(size_t index, uint64_t generation, ControlMessage message);
  void OnClosed(size_t index, uint64_t generation, const Status& reason);
  void OnTokens(size_t index, Tokens tokens);
  void OnFinish(size_t index, Finish finish);
  // Delivers queued events of `request` outside mutex_, one deliverer at a time.
  void Drain(const std::shared_ptr<Request>& request);
  // Under mutex_: ends a request with `error` (queues the event, removes it from the maps).
  static void AddSubmit(Instance& instance, int64_t prompt_tokens);
  static void AddHandoff(Instance& instance, int64_t prompt_tokens);
  // The instance's load = its report + what this router sent that the report does not include.
  void ApplyReportLocked(Instance& instance, const LoadReport& report);
  void FailLocked(const std::shared_ptr<Request>& request, const Status& error,
                  std::vector<std::shared_ptr<Request>>* to_drain);
  void SendCancelLocked(int instance, const std::string& request_id);
  bool UsableLocked(const Instance& instance, Clock::time_point now) const;

  const ClusterBackendOptions options_;
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::vector<std::thread> io_threads_;
  std::thread monitor_;

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable monitor_cv_;
  bool started_ = false;
  bool stopping_ = false;
  PlacementPolicy policy_ = PlacementPolicy::kGoodput;
  SloSection slo_;
  RouterLatencyModels latency_;  // entries point into latency_.file
  uint64_t round_robin_ = 0;
  std::vector<std::unique_ptr<Instance>> instances_;  // prefill..., decode..., colocated...
  std::vector<int> prefill_, decode_, colocated_;      // indices into instances_
  std::map<std::string, std::shared_ptr<Request>> requests_;
  ClusterConfig config_;

  Family<Gauge>* instances_up_ = nullptr;
  Family<Counter>* placements_ = nullptr;
  Family<Counter>* instance_failures_ = nullptr;
  Family<Gauge>* decode_model_correction_ = nullptr;
};

}  // namespace tandem
