#include "decode/decode_server.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>

#include "common/base/log.h"
#include "common/base/metrics.h"
#include "common/model/model.h"
#include "common/model/model_store.h"
#include "common/serving/instance_host.h"
#include "decode/batch_engine.h"
#include "decode/kv_intake.h"
#include "kvtransfer/factory.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
// Cancels for requests not seen yet that are remembered at once; the oldest go first.
constexpr size_t kMaxTombstones = 4096;

class BatchDriver : public InstanceDriver, public EngineSink {
 public:
  Status Init(InstanceRole role, const RoleArgs& args);
  InstanceHost* host() { return host_.get(); }

  // ---- InstanceDriver (engine thread) ----
  void OnMessage(ConnId conn, ControlMessage message) override {
    if (auto* s = std::get_if<Submit>(&message)) return HandleSubmit(conn, std::move(*s));
    if (auto* r = std::get_if<KvReady>(&message)) return HandleKvReady(conn, std::move(*r));
    if (auto* c = std::get_if<Cancel>(&message)) return HandleCancel(c->request_id);
    if (auto* k = std::get_if<KvProgress>(&message)) {
      if (intake_) intake_->Progress(*k);
      return;
    }
    TANDEM_LOG(kDebug) << "ignoring unexpected control message";
  }
  void OnClosed(ConnId conn, std::optional<uint64_t> router_session) override {
    if (router_session) DropSession(conn);
    if (intake_) intake_->PrefillClosed(conn);
  }
  bool Step() override {
    ExpireTombstones();
    if (intake_) intake_->Admit();
    return engine_->Step(*this);
  }
  bool Idle() const override { return engine_->idle() && (!intake_ || intake_->empty()); }
  void FailAll(const Status& why) override {
    engine_->FailAll(why, *this);
    if (intake_) intake_->FailAll(why);
  }
  LoadReport Load() override;

  // ---- EngineSink (engine thread): to the request's router session ----
  void OnTokens(Tokens tokens) override {
    if (auto it = routes_.find(tokens.request_id); it != routes_.end())
      host_->Send(it->second, tokens);
  }
  void OnFinish(Finish finish) override {
    if (finish.code != StatusCode::kOk) {
      TANDEM_LOG_REQ(kInfo, finish.request_id) << "finished with " << finish.ToStatus().ToString();
    }
    auto it = routes_.find(finish.request_id);
    if (it == routes_.end()) return;
    host_->Send(it->second, finish);
    routes_.erase(it);
  }

 private:
  bool colocated() const { return role_ == InstanceRole::kColocated; }
  void SendFinish(ConnId conn, const std::string& id, const Status& status, int32_t tokens);
  void HandleSubmit(ConnId conn, Submit submit);
  void HandleKvReady(ConnId prefill, KvReady ready);
  void HandleCancel(const std::string& id);
  // The router gave the session on `conn` up: its requests go, quietly.
  void DropSession(ConnId conn);
  void ExpireTombstones();
  Status InitTransferAndEngine(const RoleArgs& args, const InstanceSection& section);

  InstanceRole role_ = InstanceRole::kDecode;
  InstanceSetup setup_;
  double tombstone_ttl_s_ = 20;
  Histogram* handoff_wait_ = nullptr;
  std::unique_ptr<Model> model_;
  std::unique_ptr<BatchEngine> engine_;
  std::unique_ptr<InstanceHost> host_;  // stopped before the engine and the intake go
  std::unique_ptr<KvIntake> intake_;    // decode only
  // Decode only. Declared last, so destroyed first (the host is stopped by then): its pulls
  // still in flight write into the engine's pools (cuda_ipc and nccl hold raw addresses) and
  // end with callbacks into the intake, both still alive while it goes.
  std::unique_ptr<KvPuller> puller_;
  std::map<std::string, ConnId> routes_;  // request -> its router session's connection
  std::map<std::string, Clock::time_point> tombstones_;  // cancelled before seen -> expiry
  std::deque<std::string> tombstone_order_;
  uint64_t last_submit_seq_ = 0;  // the router's last Submit taken in
};

void BatchDriver::SendFinish(ConnId conn, const std::string& id, const Status& status,
                                      int32_t tokens) {
  TANDEM_LOG_REQ(kInfo, id) << "refused: " << status.ToString();
  Finish f;
  f.request_id = id;
  f.code = status.code();
  f.message = status.message();
  f.completion_tokens = tokens;
  host_->Send(conn, f);
}

void BatchDriver::HandleSubmit(ConnId conn, Submit submit) {
  last_submit_seq_ = std::max(last_submit_seq_, submit.seq);  // refused ones count as seen too
  const std::string& id = submit.request_id;
  if (!host_->accepting())
    return SendFinish(conn, id, Unavailable(setup_.name + " is shutting down"), 0);
  if (!colocated())
    return SendFinish(
        conn, id, FailedPrecondition(setup_.name + " is a decode instance: send Submit to prefill"), 0);
  if (routes_.count(id))
    return SendFinish(conn, id, InvalidArgument("request id already on this instance"), 0);
  if (Status s = engine_->Validate(submit.prompt, submit.sampling); !s.ok())
    return SendFinish(conn, id, s, 0);
  routes_[id] = conn;  // colocated: the session is the connection the Submit came on
  engine_->AddNew(id, std::move(submit.prompt), submit.sampling);
}

void BatchDriver::HandleKvReady(ConnId prefill, KvReady ready) {
  const std::string id = ready.request_id;
  if (colocated()) {  // no KV handoff here: prefill frees the KV at once
    KvReleased released;
    released.request_id = id;
    released.code = StatusCode::kFailedPrecondition;
    released.message = setup_.name + " is colocated: no KV handoff";
    host_->Send(prefill, released);
    return;
  }
  if (auto it = tombstones_.find(id); it != tombstones_.end()) {
    tombstones_.erase(it);
    return intake_->RefuseQuietly(prefill, ready, Cancelled("cancelled before its KV arrived"));
  }
  std::optional<ConnId> router = host_->RouterSession(ready.router_session);
  if (!router)
    return intake_->RefuseQuietly(prefill, ready, Unavailable("its router session is closed"));
  if (routes_.count(id)) {
    SendFinish(*router, id, InvalidArgument("request id already on this instance"), 1);
    return intake_->RefuseQuietly(prefill, ready, InvalidArgument("request id already here"));
  }
  routes_[id] = *router;
  intake_->Accept(prefill, std::move(ready));
}

void BatchDriver::HandleCancel(const std::string& id) {
  if (intake_ && intake_->Cancel(id, /*quietly=*/false)) return;
  if (engine_->Cancel(id)) {
    Finish f;
    f.request_id = id;
    f.code = StatusCode::kCancelled;
    f.message = "cancelled";
    return OnFinish(std::move(f));
  }
  if (colocated()) return;
  // Not here yet: the KvReady may still come (the router cancels on both instances at once).
  tombstones_[id] = Clock::now() + std::chrono::milliseconds(
                                       static_cast<int64_t>(tombstone_ttl_s_ * 1000));
  tombstone_order_.push_back(id);
  while (tombstone_order_.size() > kMaxTombstones) {
    tombstones_.erase(tombstone_order_.front());
    tombstone_order_.pop_front();
  }
}

void BatchDriver::ExpireTombstones() {
  const auto now = Clock::now();
  while (!tombstone_order_.empty()) {
    auto it = tombstones_.find(tombstone_order_.front());
    if (it != tombstones_.end() && it->second > now) break;
    if (it != tombstones_.end()) tombstones_.erase(it);
    tombstone_order_.pop_front();
  }
}

void BatchDriver::DropSession(ConnId conn) {
  std::vector<std::string> ids;
  for (const auto& [id, route] : routes_)
    if (route == conn) ids.push_back(id);
  for (const std::string& id : ids) {
    routes_.erase(id);
    if (intake_ && intake_->Cancel(id, /*quietly=*/true)) continue;
    engine_->Cancel(id);
  }
  if (!ids.empty()) {
    TANDEM_LOG(kInfo) << setup_.name << ": router session closed, dropped " << ids.size()
                      << " request(s)";
  }
}

LoadReport BatchDriver::Load() {
  EngineStats s = engine_->Stats();
  LoadReport r;
  r.queued_prefill_tokens = s.waiting_prompt_tokens;
  r.waiting_requests = s.waiting + (intake_ ? intake_->waiting() + intake_->outside_engine() : 0);
  r.running_requests = s.running;
  r.free_kv_blocks = s.free_blocks;
  r.total_kv_blocks = s.total_blocks;
  r.prefill_seconds_per_token = s.prefill_seconds_per_token;
  r.decode_step_seconds = s.decode_step_seconds;
  r.decode_forward_seconds = s.decode_forward_seconds;
  r.decode_step_batch = s.decode_step_batch;
  r.decode_step_context_tokens = s.decode_step_context_tokens;
  r.context_tokens = s.context_tokens;
  r.last_submit_seq = last_submit_seq_;
  setup_.SetGauges(r.running_requests, r.waiting_requests, s.free_blocks, s.total_blocks);
  return r;
}

Status BatchDriver::InitTransferAndEngine(const RoleArgs& args,
                                                   const InstanceSection& section) {
  const ClusterConfig& config = args.config;
  TANDEM_ASSIGN_OR_RETURN(std::string dir, ResolveModelDir(config.model));
  TANDEM_ASSIGN_OR_RETURN(model_,
                          Model::Load(dir, {LoadDTypeFor(config.model.dtype, section.device)}));
  BatchEngineOptions eo;
  eo.device = section.device;
  eo.threads = section.threads;
  eo.tensor_parallel = section.tensor_parallel;
  eo.block_size = config.kv_cache.block_size;
  eo.prefix_caching = config.kv_cache.prefix_caching;
  eo.kv_dtype = ResolvedKvDType(config);
  eo.max_batch_size = section.max_batch_size;
  eo.token_budget = section.token_budget;
  if (colocated()) eo.policy = StepPolicyFromConfig(section.scheduling);
  eo.max_model_len = config.model.max_model_len;
  // With tensor_parallel each GPU holds a rank's weights and a rank's pool (its KV heads).
  DeviceMemoryPlan device_memory;  // on a GPU: reported once the engine holds it all
  TANDEM_ASSIGN_OR_RETURN(
      KvPoolShape shape,
      InstanceKvPools(config, section, colocated() ? "colocated" : "decode", *model_,
                      BatchEngine::BackendOptions(eo), &device_memory));
  eo.kv_blocks = shape.num_blocks;
  eo.metrics = setup_.metrics.get();
  // A request joins the batch only once every layer was announced: the pull ends within the
  // transfer timeout, and the step's wait for a layer a little later.
  eo.kv_wait_timeout = std::chrono::milliseconds(
      static_cast<int64_t>((config.transfer.timeout_s + 1.0) * 1000));
  if (!colocated()) {
    // The pools' layout is the one the backend's MakeKvLayout gives, checked by KvCache::Create.
    TransferFactoryOptions to;
    // Prefill computes the layers it announces; it frees a request's KV after
    // prefill.kv_hold_timeout_s anyway, so that bounds the wait for the next layer.
    to.layer_wait_timeout_s = std::max(config.transfer.timeout_s, config.prefill.kv_hold_timeout_s);
    to.metrics = setup_.metrics.get();
    to.host = section.host;
    to.secret = args.control.secret;
    to.pool_shape = shape;
    to.device = section.device;
    TANDEM_ASSIGN_OR_RETURN(PullerWithPool pulled,
                            CreatePullerWithPool(config.transfer, shape.pool_bytes(), to));
    puller_ = std::move(pulled.puller);
    eo.kv_pools = std::move(pulled.pools);
  }
  TANDEM_ASSIGN_OR_RETURN(engine_, BatchEngine::Create(*model_, eo));
  LogDeviceMemoryUse(section, setup_.name, device_memory);
  return Status();
}

Status BatchDriver::Init(InstanceRole role, const RoleArgs& args) {
  role_ = role;
  const ClusterConfig& config = args.config;
  const InstanceSection& section = colocated() ? config.colocated : config.decode;
  TANDEM_ASSIGN_OR_RETURN(setup_, InstanceSetup::Create(role, args, section,
                                                        ServedModelName(config.model),
                                                        "Requests in the running batch.",
                                                        "Requests waiting (queued, preempted "
                                                        "or pulling)."));
  tombstone_ttl_s_ = config.prefill.kv_hold_timeout_s;
  TANDEM_RETURN_IF_ERROR(InitTransferAndEngine(args, section));
  if (!colocated()) {
    handoff_wait_ = &setup_.metrics
                         ->AddHistogram("tandem_kv_handoff_wait_seconds",
                                        "From learning a request's first token to having all "
                                        "of its KV (queueing for blocks included).",
                                        {}, LatencyBuckets())
                         .Get();
  }
  TANDEM_ASSIGN_OR_RETURN(HostOptions ho, setup_.Host(role, args, section));
  ho.kv_total_blocks = engine_->cache().num_blocks();
  TANDEM_ASSIGN_OR_RETURN(host_, InstanceHost::Create(std::move(ho)));
  if (!colocated()) {
    KvIntakeOptions io;
    io.block_size = config.kv_cache.block_size;
    io.max_batch_size = section.max_batch_size;
    io.kv_usage_watermark = section.kv_usage_watermark;
    io.hold_timeout_s = config.prefill.kv_hold_timeout_s;
    io.pull_start_margin_s = PullStartMarginSeconds(
        config.transfer.backend, config.transfer.timeout_s, config.prefill.kv_hold_timeout_s);
    io.layerwise = config.transfer.layerwise;
    io.handoff_wait = handoff_wait_;
    intake_ = std::make_unique<KvIntake>(*host_, *engine_, *puller_, *this, io);
  }
  host_->Run(this);
  TANDEM_LOG(kInfo) << setup_.name << ": " << engine_->cache().num_blocks() << " KV blocks of "
                    << config.kv_cache.block_size << " tokens ("
                    << KvDTypeName(engine_->cache().layout().dtype) << ")";
  return Status();
}

}  // namespace

StatusOr<std::unique_ptr<HostedRole>> StartBatchServer(InstanceRole role, const RoleArgs& args) {
  auto driver = std::make_unique<BatchDriver>();
  TANDEM_RETURN_IF_ERROR(driver->Init(role, args));
  InstanceHost* host = driver->host();
  return std::make_unique<HostedRole>(std::move(driver), host);
}

int RunBatchInstanceMain(InstanceRole role, const std::vector<std::string>& args) {
  const bool colocated = role == InstanceRole::kColocated;
  RoleSpec spec;
  spec.command = colocated ? "colocated" : "decode";
  spec.description = colocated
                         ? "Runs a colocated instance (prefill and decode in one engine)."
                         : "Runs a decode instance (pulls KV from prefill, batches decode steps).";
  spec.start = [role](const RoleArgs& a) -> StatusOr<std::unique_ptr<RoleProcess>> {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<HostedRole> server, StartBatchServer(role, a));
    return std::unique_ptr<RoleProcess>(std::move(server));
  };
  return RunRoleMain(spec, args);
}

int DecodeMain(const std::vector<std::string>& args) {
  return RunBatchInstanceMain(InstanceRole::kDecode, args);
}

}  // namespace tandem
