// The router's Backend over the control plane (common/net/control_channel.h): one control
// connection to every configured instance, placement per request (router/placement.h), and the
// token stream of each request routed back to its callback by request id.
//
// Instances: instance I of section S (prefill|decode|colocated) is at host:(S.port + I). The
// backend connects to each and speaks first: Hello{role router, instance_id = a fresh random
// session id}, new on every connection, so that an instance can tell this connection's requests
// from those of a connection the router has given up (control wire v5). It retries with backoff
// (100 ms doubling to 2 s), so that an instance started later or restarted is picked up, and
// counts an instance usable once it has answered Hello and while its LoadReports keep coming.
// An instance silent for `control.heartbeat_timeout_s` (or without a Hello within
// `control.connect_timeout_s`) is down: its requests fail and its connection is closed, which
// ends the session (the instance drops the session's requests when it reads the close).
//
// Requests: Submit places the request and sends Submit to the prefill instance (with the decode
// instance's control address and the router's session id with it) or to a colocated one. Each
// request's phase is a router/request_phase.h RequestPhase. Tokens and Finish come from
// whichever instance holds the request; the first token comes from prefill, and decode's events
// that overtake it are held back so that the callback sees them in order. When an instance's
// connection drops, exactly the requests it holds fail with Unavailable naming the instance; the
// other instance of each is told to Cancel it. Cancel (client gone, stop string) sends Cancel to
// every instance of the request, prefill and decode both, always after its Submit. Every
// accepted request gets exactly one final event.
//
// SLO classes: GenerateRequest::slo_class must be "" or a class of the config's `slo.classes`;
// Submit refuses another name with InvalidArgument naming the x-tandem-slo-class header.
//
// Load: placement sees, per instance, its latest LoadReport plus what this router placed there
// that the report does not include yet. Reports lag (a server computes one after each engine
// step and takes new requests in only between steps): every Submit carries a per-instance
// sequence number and every report the last one the instance had taken in, so the router adds
// back exactly the Submits the report lacks. A decode instance learns of a request from
// prefill's KvReady, not from a Submit: the router counts the request there from placement until
// a report that follows the instance's first output for it (reports and tokens share the
// connection, in order), so a burst placed before any report spreads over the decode instances.
//
// Latency model: when `router.latency_model` names a file, Start() loads it (a bad file, or one
// without an entry for a configured section's device/threads/tensor_parallel/pipeline_parallel,
// fails Start with the file's own message) and goodput placement predicts from it (see
// router/placement.h); SIGHUP (Reconfigure) reloads it.
//
// Threads: all public methods are thread-safe. Callbacks run on the backend's Asio threads (or
// the monitor thread, or inside Cancel/Submit for failures), never two at once for one request,
// never under the backend's lock.
// Lifecycle: construct, Start(), ..., Stop() (fails what is still in flight with Unavailable and
// joins the threads; the destructor calls it).
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/config/config.h"
#include "common/net/control_channel.h"
#include "common/engine/latency_model.h"
#include "common/base/metrics.h"
#include "common/base/thread_annotations.h"
#include "router/backend.h"
#include "router/placement.h"
#include "router/request_phase.h"

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

// Heartbeat and connect timeouts come from the config's `control` section.
struct ClusterBackendOptions {
  double backoff_initial_s = 0.1;     // reconnect delay after a failure, doubling ...
  double backoff_max_s = 2.0;         // ... up to this
  double cancel_grace_s = 30.0;       // a cancelled request with no Finish by then is failed
  // A request whose prefill instance went away after its first token, and whose decode
  // instance has sent nothing for this long, is failed.
  double orphan_grace_s = 10.0;
  int io_threads = 2;
  std::string host = "127.0.0.1";     // where the instances listen
  ControlOptions control;             // the cluster secret and connection bounds
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
  uint64_t session = 0;    // the router's session id on the current connection; 0 = none
};

class ClusterBackend : public Backend {
 public:
  // Instances and the policy come from `config` (prefill, decode, colocated sections; router
  // policy; slo; control). The ports must be resolved (non-zero) for every section with
  // instances.
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

  // Applies a reloaded config's policy, SLOs and SLO classes to new requests (SIGHUP); requests
  // in flight are untouched. Instance layout and control timing changes are not applied
  // (logged). InvalidArgument on a bad policy (nothing changes).
  Status Reconfigure(const ClusterConfig& config);

  // Backend.
  Status Submit(const GenerateRequest& request,
                std::function<void(BackendEvent)> on_event) override;
  void Cancel(const std::string& request_id) override;
  bool Ready() const override;
  // The config's slo.classes (as last reloaded).
  Status CheckSloClass(const std::string& slo_class) const override;
  std::optional<SloTarget> SloOf(const std::string& slo_class) const override;

  std::vector<InstanceStatus> Instances() const;
  // Requests accepted and not yet finished.
  int InFlight() const;

 private:
  struct Instance;
  struct Request;
  using Clock = std::chrono::steady_clock;
  using RequestList = std::vector<std::shared_ptr<Request>>;

  // Connections (cluster_backend.cc).
  void MonitorLoop();
  // Under mutex_, once per tick: gives up the instances silent too long (InstanceDownLocked),
  // expires cancelled and orphaned requests, and lists the instances to connect.
  void MonitorTickLocked(Clock::time_point now, std::vector<size_t>* to_connect,
                         RequestList* to_drain) TANDEM_REQUIRES(mutex_);
  void TryConnect(size_t index) TANDEM_EXCLUDES(mutex_);
  void OnMessage(size_t index, uint64_t generation, ControlMessage message);
  void OnHelloLocked(size_t index, const Hello& hello) TANDEM_REQUIRES(mutex_);
  void OnReportLocked(Instance& instance, const LoadReport& report) TANDEM_REQUIRES(mutex_);
  void OnClosed(size_t index, uint64_t generation, const Status& reason);
  // Under mutex_: the instance is down (its connection closed, or the router gives it up):
  // closes the connection (ending the session), fails exactly the requests it holds and tells
  // their other instance to Cancel them.
  void InstanceDownLocked(size_t index, const std::string& why, RequestList* to_drain)
      TANDEM_REQUIRES(mutex_);
  bool UsableLocked(const Instance& instance, Clock::time_point now) const
      TANDEM_REQUIRES(mutex_);

  // DNS discovery (router/cluster_discovery.cc): S.dns_name of each section, resolved every
  // control.discovery_interval_s by its own thread, so that a slow resolver (getaddrinfo has no
  // deadline of ours; resolv.conf's timeout and attempts bound it) never delays the monitor's
  // heartbeat checks.
  struct DnsTarget {
    InstanceRole role;
    std::string name;  // host part of S.dns_name
    int port = 0;
  };
  // Every address `target` resolves to now ("ip:port"); an error (the set is kept) when it does
  // not resolve. Blocking (getaddrinfo): never under mutex_.
  static StatusOr<std::vector<std::string>> Resolve(const DnsTarget& target);
  // Resolves every target (outside mutex_) and applies the answers.
  void Discover() TANDEM_EXCLUDES(mutex_);
  // The discovery thread: Discover() every control.discovery_interval_s until Stop.
  void DiscoveryLoop() TANDEM_EXCLUDES(mutex_);
  // A new address joins as a new instance (or brings a drained one back); an instance whose
  // address is gone is retired: it gets no new request, and is closed once it holds none.
  void ApplyDiscoveryLocked(const DnsTarget& target, const std::vector<std::string>& addresses)
      TANDEM_REQUIRES(mutex_);
  // Adds an instance of `role` at `address`; its index.
  int AddInstanceLocked(InstanceRole role, const std::string& address) TANDEM_REQUIRES(mutex_);
  std::vector<int>& IdsOfLocked(InstanceRole role) TANDEM_REQUIRES(mutex_);
  // The instances of a config section: its DNS name, else S.addresses, else the local ones.
  void AddSectionLocked(const InstanceSection& section, InstanceRole role)
      TANDEM_REQUIRES(mutex_);
  // Whether the config gives instances of `role` (known now, or by a DNS name).
  bool ConfiguredLocked(InstanceRole role) TANDEM_REQUIRES(mutex_);

  // Requests (cluster_backend_requests.cc).
  // The load snapshot placement sees for `request`, under mutex_.
  struct Snapshot;
  void SnapshotLocked(const GenerateRequest& request, Clock::time_point now, Snapshot* out)
      TANDEM_REQUIRES(mutex_);
  // Where request `sibling` was placed, when it is still running there and those instances are
  // usable (GenerateRequest::place_with); nullopt otherwise.
  std::optional<Placement> SiblingPlacementLocked(const std::string& sibling,
                                                  Clock::time_point now) TANDEM_REQUIRES(mutex_);
  // Records a placed request and builds its Submit; returns the instance to send it to.
  Instance& RecordPlacementLocked(const std::shared_ptr<Request>& entry, const Placement& placed,
                                  const GenerateRequest& request, tandem::Submit* message)
      TANDEM_REQUIRES(mutex_);
  Status CheckSloClassLocked(const std::string& slo_class) const TANDEM_REQUIRES(mutex_);
  // tandem_router_slo_target_seconds and tandem_router_slo_attainment_target from slo_.
  void ExportSloLocked() TANDEM_REQUIRES(mutex_);
  // Tokens and Finish from instance `index`: under mutex_, queue the request's events; the
  // caller drains them.
  std::shared_ptr<Request> OnTokensLocked(size_t index, Tokens tokens) TANDEM_REQUIRES(mutex_);
  std::shared_ptr<Request> OnFinishLocked(size_t index, const Finish& finish)
      TANDEM_REQUIRES(mutex_);
  // Delivers queued events of `request` outside mutex_, one deliverer at a time.
  void Drain(const std::shared_ptr<Request>& request) TANDEM_EXCLUDES(mutex_);
  static void AddSubmit(Instance& instance, int64_t prompt_tokens);
  static void AddHandoff(Instance& instance, int64_t prompt_tokens);
  // The instance's load = its report + what this router sent that the report does not include.
  void ApplyReportLocked(Instance& instance, const LoadReport& report) TANDEM_REQUIRES(mutex_);
  // Ends a request with `error` (queues the event, removes it from requests_).
  void FailLocked(const std::shared_ptr<Request>& request, const Status& error,
                  RequestList* to_drain) TANDEM_REQUIRES(mutex_);
  // Queues `event` as the request's last and removes it from requests_.
  void FinishLocked(const std::shared_ptr<Request>& request, BackendEvent event)
      TANDEM_REQUIRES(mutex_);
  void SendCancelLocked(int instance, const std::string& request_id) TANDEM_REQUIRES(mutex_);
  // Whether `instance` (an index into instances_) holds `request` (router/request_phase.h).
  static bool HeldBy(const Request& request, int instance);

  const ClusterBackendOptions options_;
  const ControlSection control_;  // heartbeat and connect timeouts (not reloaded)
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::vector<std::thread> io_threads_;
  std::thread monitor_;
  std::thread discovery_;  // only with a DNS target

  mutable Mutex mutex_;
  std::condition_variable_any monitor_cv_;
  bool started_ TANDEM_GUARDED_BY(mutex_) = false;
  bool stopping_ TANDEM_GUARDED_BY(mutex_) = false;
  PlacementPolicy policy_ TANDEM_GUARDED_BY(mutex_) = PlacementPolicy::kGoodput;
  SloSection slo_ TANDEM_GUARDED_BY(mutex_);
  // Entries point into latency_.file.
  RouterLatencyModels latency_ TANDEM_GUARDED_BY(mutex_);
  uint64_t round_robin_ TANDEM_GUARDED_BY(mutex_) = 0;
  // Every instance ever known, by index (an index never changes meaning: discovery only appends;
  // an instance that left is retired, not removed).
  std::vector<std::unique_ptr<Instance>> instances_ TANDEM_GUARDED_BY(mutex_);
  // Indices into instances_ by role.
  std::vector<int> prefill_ TANDEM_GUARDED_BY(mutex_), decode_ TANDEM_GUARDED_BY(mutex_),
      colocated_ TANDEM_GUARDED_BY(mutex_);
  std::vector<DnsTarget> dns_targets_;  // fixed after construction
  std::map<std::string, std::shared_ptr<Request>> requests_ TANDEM_GUARDED_BY(mutex_);
  // The config as started; Reconfigure changes policy_, slo_ and latency_ only.
  const ClusterConfig config_;

  Family<Gauge>* instances_up_ = nullptr;
  Family<Counter>* placements_ = nullptr;
  Family<Counter>* instance_failures_ = nullptr;
  Family<Gauge>* decode_model_correction_ = nullptr;
  Family<Gauge>* slo_target_ = nullptr;         // tandem_router_slo_target_seconds
  Gauge* attainment_target_ = nullptr;          // tandem_router_slo_attainment_target
};

}  // namespace tandem
