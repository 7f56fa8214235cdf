#include "router/cluster_backend.h"

#include <algorithm>
#include <random>
#include <utility>

#include "common/base/log.h"
#include "common/config/serving_config.h"
#include "router/cluster_backend_state.h"

namespace tandem {

namespace {

double SecondsSince(std::chrono::steady_clock::time_point t,
                    std::chrono::steady_clock::time_point now) {
  return std::chrono::duration<double>(now - t).count();
}

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

// A router session id: random, never 0 (0 means "no session" on the wire).
uint64_t NewSessionId() {
  static Mutex mutex;
  static std::mt19937_64 engine{std::random_device{}()};
  MutexLock lock(&mutex);
  uint64_t id = 0;
  while (id == 0) id = engine();
  return id;
}

std::string Describe(const LatencyModel& m) {
  return "device " + m.device + ", threads " + std::to_string(m.threads) + ", tp " +
         std::to_string(m.tensor_parallel) + ", pp " + std::to_string(m.pipeline_parallel) +
         (m.role.empty() ? std::string() : ", role " + m.role) + ", model " + m.model;
}

}  // namespace

StatusOr<RouterLatencyModels> LoadRouterLatencyModels(const ClusterConfig& config) {
  RouterLatencyModels out;
  const std::string& name = config.router.latency_model;
  if (name.empty()) return out;
  const std::string path = ConfigRelativePath(config, name);
  StatusOr<LatencyModelFile> file = LoadLatencyModel(path);
  if (!file.ok()) return file.status().WithContext("router.latency_model");
  out.file = std::make_shared<const LatencyModelFile>(std::move(*file));
  auto pick = [&](const InstanceSection& s, const char* section,
                  const LatencyModel** entry) -> Status {
    if (s.instances <= 0 && s.addresses.empty()) return Status::Ok();
    *entry = out.file->ForInstance(s.device, s.threads, s.tensor_parallel, s.pipeline_parallel,
                                   section);
    if (*entry == nullptr)
      return InvalidArgument(path + ": router.latency_model has no entry for " +
                             section + " (device " + s.device + ", threads " +
                             std::to_string(s.threads) + ", tensor_parallel " +
                             std::to_string(s.tensor_parallel) + ", pipeline_parallel " +
                             std::to_string(s.pipeline_parallel) + "): run tandem profile " +
                             "--threads " + std::to_string(s.threads) + " --append");
    return Status::Ok();
  };
  TANDEM_RETURN_IF_ERROR(pick(config.prefill, "prefill", &out.prefill));
  TANDEM_RETURN_IF_ERROR(pick(config.decode, "decode", &out.decode));
  TANDEM_RETURN_IF_ERROR(pick(config.colocated, "colocated", &out.colocated));
  const std::string served = config.model.path.empty() ? config.model.preset : config.model.path;
  for (auto [entry, section] : {std::pair{out.prefill, "prefill"}, std::pair{out.decode, "decode"},
                                std::pair{out.colocated, "colocated"}}) {
    if (entry == nullptr) continue;
    TANDEM_LOG(kInfo) << "latency model " << path << ": " << section << " uses the entry ("
                      << Describe(*entry) << "): prefill c1=" << entry->c1 << " c2=" << entry->c2
                      << " c3=" << entry->c3 << ", decode c4=" << entry->c4 << " c5=" << entry->c5
                      << " c6=" << entry->c6;
    if (entry->model != served) {
      TANDEM_LOG(kWarn) << "latency model " << path << ": the " << section
                        << " entry was measured with model '" << entry->model
                        << "', this cluster serves '" << served << "'";
    }
  }
  return out;
}

ClusterBackend::ClusterBackend(const ClusterConfig& config, ClusterBackendOptions options)
    : options_(std::move(options)), control_(config.control), work_(io_.get_executor()),
      slo_(config.slo), config_(config) {
  // Each section's instances: by DNS name (resolved in Start and by the monitor), by a static
  // list, or the ones `tandem up` starts on this machine (router/cluster_discovery.cc).
  MutexLock lock(&mutex_);
  AddSectionLocked(config.prefill, InstanceRole::kPrefill);
  AddSectionLocked(config.decode, InstanceRole::kDecode);
  AddSectionLocked(config.colocated, InstanceRole::kColocated);
  if (options_.metrics != nullptr) {
    instances_up_ = &options_.metrics->AddGauge(
        "tandem_router_instances_usable", "Instances connected with a fresh heartbeat",
        {"instance_role"});
    placements_ = &options_.metrics->AddCounter(
        "tandem_router_placements_total", "Placement decisions by result", {"result"});
    decode_model_correction_ = &options_.metrics->AddGauge(
        "tandem_router_decode_model_correction",
        "Measured forward pass of a decode step over router.latency_model's at the same batch "
        "and context (1 = the model is right); the router scales its TPOT predictions by it",
        {"instance"});
    instance_failures_ = &options_.metrics->AddCounter(
        "tandem_router_instance_disconnects_total", "Control connections to instances lost",
        {"instance"});
    slo_target_ = &options_.metrics->AddGauge(
        "tandem_router_slo_target_seconds",
        "The SLO in force per class (slo_class=\"default\": slo.ttft_s/tpot_s) and objective "
        "(ttft, tpot); follows a SIGHUP reload",
        {"slo_class", "objective"});
    attainment_target_ = &options_.metrics->AddGauge(
        "tandem_router_slo_attainment_target",
        "slo.attainment_target: the share of requests that should attain their SLO").Get();
    ExportSloLocked();
  }
}

ClusterBackend::~ClusterBackend() { Stop(); }

Status ClusterBackend::Start() {
  StatusOr<PlacementPolicy> policy = ParsePlacementPolicy(config_.router.policy);
  if (!policy.ok()) return policy.status();
  {
    MutexLock lock(&mutex_);
    const bool p = ConfiguredLocked(InstanceRole::kPrefill);
    const bool d = ConfiguredLocked(InstanceRole::kDecode);
    if (!p && !d && !ConfiguredLocked(InstanceRole::kColocated))
      return InvalidArgument(config_.source + ": no instances configured (prefill, decode or "
                                              "colocated instances must be > 0)");
    if (p != d && !ConfiguredLocked(InstanceRole::kColocated))
      return InvalidArgument(config_.source + ": prefill and decode instances come in pairs: " +
                             std::to_string(prefill_.size()) + " prefill, " +
                             std::to_string(decode_.size()) + " decode");
  }
  // The names resolved once before serving, so that the first requests find instances.
  Discover();
  for (const InstanceSection* s : {&config_.prefill, &config_.decode, &config_.colocated}) {
    if (s->addresses.empty() && s->instances > 0 && s->port <= 0)
      return InvalidArgument(config_.source + ": an instance section has port 0; the router " +
                             "needs the instances' control ports (tandem up picks them)");
  }
  StatusOr<RouterLatencyModels> latency = LoadRouterLatencyModels(config_);
  if (!latency.ok()) return latency.status();
  MutexLock lock(&mutex_);
  if (started_) return FailedPrecondition("ClusterBackend already started");
  policy_ = *policy;
  latency_ = std::move(*latency);
  started_ = true;
  for (int i = 0; i < std::max(options_.io_threads, 1); ++i)
    io_threads_.emplace_back([this] { io_.run(); });
  monitor_ = std::thread([this] { MonitorLoop(); });
  if (!dns_targets_.empty()) discovery_ = std::thread([this] { DiscoveryLoop(); });
  TANDEM_LOG(kInfo) << "cluster backend: " << prefill_.size() << " prefill, " << decode_.size()
                    << " decode, " << colocated_.size() << " colocated instance(s), policy "
                    << PlacementPolicyName(policy_) << ", heartbeat timeout "
                    << control_.heartbeat_timeout_s << " s";
  return Status::Ok();
}

void ClusterBackend::Stop() {
  RequestList to_drain;
  std::vector<std::shared_ptr<ControlConnection>> connections;
  {
    MutexLock lock(&mutex_);
    if (stopping_) return;
    stopping_ = true;
    RequestList all;
    for (auto& [id, request] : requests_) all.push_back(request);
    for (auto& request : all) {
      SendCancelLocked(request->prefill, request->id);
      SendCancelLocked(request->decode, request->id);
      SendCancelLocked(request->colocated, request->id);
      FailLocked(request, Unavailable("the router is stopping"), &to_drain);
    }
    for (auto& instance : instances_) {
      if (instance->connection) connections.push_back(instance->connection);
    }
    monitor_cv_.notify_all();
  }
  for (auto& request : to_drain) Drain(request);
  if (monitor_.joinable()) monitor_.join();
  if (discovery_.joinable()) discovery_.join();
  for (auto& connection : connections) connection->Close();
  work_.reset();
  // Let the closes (posted to the strands) run, then stop.
  for (auto& thread : io_threads_) {
    if (thread.joinable()) {
      io_.stop();
      thread.join();
    }
  }
}

Status ClusterBackend::Reconfigure(const ClusterConfig& config) {
  StatusOr<PlacementPolicy> policy = ParsePlacementPolicy(config.router.policy);
  if (!policy.ok()) return policy.status();
  // The reloaded file is judged against the running layout (instance shapes apply on restart).
  ClusterConfig shapes = config_;
  shapes.router.latency_model = config.router.latency_model;
  shapes.source = config.source;
  StatusOr<RouterLatencyModels> latency = LoadRouterLatencyModels(shapes);
  if (!latency.ok()) return latency.status();
  MutexLock lock(&mutex_);
  policy_ = *policy;
  slo_ = config.slo;
  ExportSloLocked();
  latency_ = std::move(*latency);
  bool layout_changed = config.prefill.instances != config_.prefill.instances ||
                        config.decode.instances != config_.decode.instances ||
                        config.colocated.instances != config_.colocated.instances ||
                        config.prefill.port != config_.prefill.port ||
                        config.decode.port != config_.decode.port ||
                        config.colocated.port != config_.colocated.port;
  if (layout_changed) {
    TANDEM_LOG(kWarn) << "config reload: instance counts/ports changed; they apply on restart";
  }
  if (config.control.heartbeat_timeout_s != control_.heartbeat_timeout_s ||
      config.control.connect_timeout_s != control_.connect_timeout_s) {
    TANDEM_LOG(kWarn) << "config reload: control timeouts changed; they apply on restart";
  }
  TANDEM_LOG(kInfo) << "config reloaded: policy " << PlacementPolicyName(policy_) << ", SLO ttft "
                    << slo_.ttft_s << " s, tpot " << slo_.tpot_s << " s, "
                    << slo_.classes.size() << " class(es)";
  return Status::Ok();
}

bool ClusterBackend::UsableLocked(const Instance& instance, Clock::time_point now) const {
  return !instance.retired && instance.connection && instance.greeted &&
         SecondsSince(instance.last_heard, now) <= control_.heartbeat_timeout_s;
}

bool ClusterBackend::Ready() const {
  MutexLock lock(&mutex_);
  if (!started_ || stopping_) return false;
  const Clock::time_point now = Clock::now();
  bool prefill = false, decode = false, colocated = false;
  for (const auto& x : instances_) {
    if (!UsableLocked(*x, now)) continue;
    prefill |= x->role == InstanceRole::kPrefill;
    decode |= x->role == InstanceRole::kDecode;
    colocated |= x->role == InstanceRole::kColocated;
  }
  return (prefill && decode) || colocated;
}

std::vector<InstanceStatus> ClusterBackend::Instances() const {
  MutexLock lock(&mutex_);
  Clock::time_point now = Clock::now();
  std::vector<InstanceStatus> out;
  for (size_t i = 0; i < instances_.size(); ++i) {
    const Instance& x = *instances_[i];
    InstanceStatus s;
    s.name = x.name;
    s.address = x.address;
    s.role = x.role;
    s.connected = x.connection && x.greeted;
    s.usable = UsableLocked(x, now);
    s.session = x.session;
    for (auto& [id, r] : requests_) s.requests += HeldBy(*r, static_cast<int>(i)) ? 1 : 0;
    out.push_back(std::move(s));
  }
  return out;
}

int ClusterBackend::InFlight() const {
  MutexLock lock(&mutex_);
  return static_cast<int>(requests_.size());
}

void ClusterBackend::OnMessage(size_t index, uint64_t generation, ControlMessage message) {
  std::shared_ptr<Request> to_drain;
  {
    MutexLock lock(&mutex_);
    Instance& instance = *instances_[index];
    // A message of a connection the router has given up (or replaced) is not acted on.
    if (generation != instance.generation || !instance.connection) return;
    if (auto* tokens = std::get_if<Tokens>(&message)) {
      to_drain = OnTokensLocked(index, std::move(*tokens));
    } else if (auto* finish = std::get_if<Finish>(&message)) {
      to_drain = OnFinishLocked(index, *finish);
    } else if (auto* hello = std::get_if<Hello>(&message)) {
      OnHelloLocked(index, *hello);
    } else if (auto* report = std::get_if<LoadReport>(&message)) {
      OnReportLocked(instance, *report);
    } else {
      TANDEM_LOG(kDebug) << "ignoring an unexpected control message from " << instance.name;
    }
  }
  if (to_drain) Drain(to_drain);
}

void ClusterBackend::OnHelloLocked(size_t index, const Hello& hello) {
  Instance& instance = *instances_[index];
  if (hello.role != instance.role) {
    RequestList none;  // not greeted: it holds no request
    InstanceDownLocked(index,
                       std::string("it says it is a ") + InstanceRoleName(hello.role) +
                           " instance, the config says " + InstanceRoleName(instance.role),
                       &none);
    return;
  }
  instance.hello = hello;
  instance.greeted = true;
  instance.last_heard = Clock::now();
  instance.load = LoadReport{};
  instance.typical = ResidentAverage{};  // a new incarnation holds none of the old requests
  instance.unseen_submits.clear();       // a new incarnation: the old one's requests failed
  instance.incoming_handoffs.clear();
  instance.backoff_s = options_.backoff_initial_s;
  TANDEM_LOG(kInfo) << "instance " << instance.name << " up at " << instance.address << " ("
                    << hello.name << ", model " << hello.model << ", " << hello.kv_total_blocks
                    << " KV blocks)";
}

void ClusterBackend::OnReportLocked(Instance& instance, const LoadReport& report) {
  ApplyReportLocked(instance, report);
  instance.last_heard = Clock::now();
  const LatencyModel* lm = instance.role == InstanceRole::kDecode      ? latency_.decode
                           : instance.role == InstanceRole::kColocated ? latency_.colocated
                                                                       : nullptr;
  if (decode_model_correction_ != nullptr && lm != nullptr && report.decode_step_batch > 0) {
    InstanceLoad x;
    x.load = report;
    x.latency_model = lm;
    decode_model_correction_->WithLabels({instance.name}).Set(DecodeModelCorrection(x));
  }
}

void ClusterBackend::OnClosed(size_t index, uint64_t generation, const Status& reason) {
  RequestList to_drain;
  {
    MutexLock lock(&mutex_);
    if (generation != instances_[index]->generation) return;  // given up already
    InstanceDownLocked(index, reason.message(), &to_drain);
  }
  for (auto& request : to_drain) Drain(request);
}

void ClusterBackend::InstanceDownLocked(size_t index, const std::string& why,
                                        RequestList* to_drain) {
  Instance& instance = *instances_[index];
  if (instance.connection) instance.connection->Close();  // posted: runs after this unlocks
  instance.connection.reset();
  ++instance.generation;  // the old connection's handlers, late or not, are ignored
  instance.session = 0;
  const bool was_greeted = instance.greeted;
  instance.greeted = false;
  instance.next_attempt = Clock::now() + Seconds(instance.backoff_s);
  if (stopping_) return;
  if (instance_failures_) instance_failures_->WithLabels({instance.name}).Inc();
  if (was_greeted) {
    TANDEM_LOG(kWarn) << "instance " << instance.name << " at " << instance.address
                      << " is down: " << why;
  } else {
    TANDEM_LOG(kDebug) << "instance " << instance.name << " dropped before Hello: " << why;
  }
  const int me = static_cast<int>(index);
  RequestList held;
  for (auto& [id, r] : requests_) {
    if (HeldBy(*r, me)) {
      held.push_back(r);
    } else if (r->prefill == me && r->phase == RequestPhase::kHandingOff && !r->prefill_lost_at) {
      r->prefill_lost_at = Clock::now();  // decode has it (or its pull will fail and say so)
    }
  }
  for (auto& r : held) {
    SendCancelLocked(r->prefill == me ? r->decode : r->prefill, r->id);
    FailLocked(r,
               Unavailable(instance.name + " (" + instance.address +
                           ") went away while serving the request: " + why),
               to_drain);
  }
  if (!held.empty()) {
    TANDEM_LOG(kWarn) << "failed " << held.size() << " request(s) held by " << instance.name;
  }
}

void ClusterBackend::TryConnect(size_t index) {
  std::string address;
  {
    MutexLock lock(&mutex_);
    address = instances_[index]->address;
  }
  StatusOr<std::shared_ptr<ControlConnection>> connection =
      ConnectControl(io_, address, control_.connect_timeout_s, options_.control);
  MutexLock lock(&mutex_);
  Instance& instance = *instances_[index];
  instance.connecting = false;
  Clock::time_point now = Clock::now();
  if (!connection.ok() || stopping_) {
    if (connection.ok()) (*connection)->Close();
    instance.next_attempt = now + Seconds(instance.backoff_s);
    instance.backoff_s = std::min(instance.backoff_s * 2, options_.backoff_max_s);
    TANDEM_LOG(kDebug) << "connecting to " << instance.name << ": "
                       << connection.status().message();
    return;
  }
  uint64_t generation = ++instance.generation;
  instance.connection = *connection;
  instance.session = NewSessionId();
  instance.connected_at = now;
  instance.greeted = false;
  instance.backoff_s = std::min(instance.backoff_s * 2, options_.backoff_max_s);
  (*connection)
      ->Start([this, index, generation](
                  ControlMessage m) { OnMessage(index, generation, std::move(m)); },
              [this, index, generation](const Status& s) { OnClosed(index, generation, s); });
  Hello hello;
  hello.role = InstanceRole::kRouter;
  hello.instance_id = instance.session;
  hello.name = "router";
  (*connection)->Send(hello);
}

void ClusterBackend::MonitorTickLocked(Clock::time_point now, std::vector<size_t>* to_connect,
                                       RequestList* to_drain) {
  for (size_t i = 0; i < instances_.size(); ++i) {
    Instance& x = *instances_[i];
    if (x.retired) {
      bool holds = false;
      for (const auto& [id, r] : requests_) holds = holds || HeldBy(*r, static_cast<int>(i));
      if (x.connection && !holds) {  // drained: its last request is done
        TANDEM_LOG(kInfo) << "instance " << x.name << " at " << x.address << " drained; closed";
        x.connection->Close();
        x.connection = nullptr;
        x.greeted = false;
        ++x.generation;  // the close handler of this connection is now stale
      }
      if (!x.connection) continue;  // never reconnected while retired
    }
    if (!x.connection && !x.connecting && now >= x.next_attempt) {
      x.connecting = true;
      to_connect->push_back(i);
    } else if (x.connection) {
      double silent = SecondsSince(x.greeted ? x.last_heard : x.connected_at, now);
      double limit = x.greeted ? control_.heartbeat_timeout_s : control_.connect_timeout_s;
      if (silent > limit) {
        InstanceDownLocked(i,
                           (x.greeted ? "no LoadReport for " : "no Hello within ") +
                               std::to_string(silent) + " s (control." +
                               (x.greeted ? "heartbeat_timeout_s " : "connect_timeout_s ") +
                               std::to_string(limit) + " s)",
                           to_drain);
      }
    }
  }
  RequestList expired;
  for (auto& [id, r] : requests_) {
    if (r->phase == RequestPhase::kCancelling &&
        SecondsSince(r->cancelled_at, now) > options_.cancel_grace_s) {
      expired.push_back(r);
    } else if (r->phase == RequestPhase::kHandingOff && r->prefill_lost_at &&
               SecondsSince(*r->prefill_lost_at, now) > options_.orphan_grace_s) {
      expired.push_back(r);
    }
  }
  for (auto& r : expired) {
    const bool cancelled = r->phase == RequestPhase::kCancelling;
    if (!cancelled) SendCancelLocked(r->decode, r->id);
    FailLocked(r,
               cancelled ? Cancelled("cancelled; no instance confirmed it")
                         : Unavailable("the prefill instance went away and the decode "
                                       "instance never continued the request"),
               to_drain);
  }
  if (instances_up_) {
    int up[4] = {0, 0, 0, 0};
    for (auto& x : instances_) up[static_cast<int>(x->role)] += UsableLocked(*x, now);
    instances_up_->WithLabels({"prefill"}).Set(up[1]);
    instances_up_->WithLabels({"decode"}).Set(up[2]);
    instances_up_->WithLabels({"colocated"}).Set(up[3]);
  }
}

// The analysis does not follow std::unique_lock (which the condition wait needs): mutex_ is
// held except between unlock() and lock().
void ClusterBackend::MonitorLoop() TANDEM_NO_THREAD_SAFETY_ANALYSIS {
  std::unique_lock<Mutex> lock(mutex_);
  while (!stopping_) {
    std::vector<size_t> to_connect;
    RequestList to_drain;
    MonitorTickLocked(Clock::now(), &to_connect, &to_drain);
    lock.unlock();
    for (auto& r : to_drain) Drain(r);
    for (size_t i : to_connect) TryConnect(i);
    lock.lock();
    monitor_cv_.wait_for(lock, std::chrono::milliseconds(50), [this]() TANDEM_REQUIRES(mutex_) {
      return stopping_;
    });
  }
}

std::optional<SloTarget> ClusterBackend::SloOf(const std::string& slo_class) const {
  MutexLock lock(&mutex_);
  return SloForClass(slo_, slo_class);
}

void ClusterBackend::ExportSloLocked() {
  if (slo_target_ == nullptr) return;
  auto set = [&](const std::string& name, double ttft_s, double tpot_s) {
    slo_target_->WithLabels({name, "ttft"}).Set(ttft_s);
    slo_target_->WithLabels({name, "tpot"}).Set(tpot_s);
  };
  set("default", slo_.ttft_s, slo_.tpot_s);
  for (const SloClass& c : slo_.classes) set(c.name, c.ttft_s, c.tpot_s);
  attainment_target_->Set(slo_.attainment_target);
}

}  // namespace tandem
