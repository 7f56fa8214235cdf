#include "prefill/prefill_server.h"

#include <algorithm>

#include "common/base/log.h"
#include "common/base/metrics.h"
#include "common/model/model.h"
#include "common/model/model_store.h"
#include "common/serving/instance_host.h"
#include "kvtransfer/factory.h"
#include "prefill/kv_handoff.h"
#include "prefill/prefill_engine.h"

namespace tandem {
namespace {

class PrefillDriver : public InstanceDriver, public PrefillObserver {
 public:
  Status Init(const RoleArgs& args);
  InstanceHost* host() { return host_.get(); }

  // ---- InstanceDriver (engine thread) ----
  void OnMessage(ConnId conn, ControlMessage message) override {
    if (auto* s = std::get_if<Submit>(&message)) return HandleSubmit(conn, *s);
    if (auto* c = std::get_if<Cancel>(&message)) return handoff_->Cancel(c->request_id);
    if (auto* k = std::get_if<KvReleased>(&message))
      return handoff_->Released(k->request_id, k->code == StatusCode::kOk
                                                   ? Status()
                                                   : Status(k->code, k->message));
    TANDEM_LOG(kDebug) << "ignoring unexpected control message";
  }
  void OnClosed(ConnId conn, std::optional<uint64_t>) override {
    handoff_->ConnectionClosed(conn);
  }
  bool Step() override {
    handoff_->ExpireHolds();
    return engine_->Step(*this);
  }
  bool Idle() const override { return handoff_->empty(); }
  void FailAll(const Status& why) override { handoff_->FailAll(why); }
  LoadReport Load() override;

  // ---- PrefillObserver (engine thread, inside Step) ----
  bool BeforeLastChunk(PrefillRequest& r) override { return handoff_->Announce(r); }
  void OnLayerComputed(int layer) override { handoff_->LayersComputed(layer + 1); }
  void OnPrefilled(Prefilled done) override { handoff_->FirstTokenSampled(std::move(done)); }

 private:
  void HandleSubmit(ConnId conn, const Submit& submit);
  void Refuse(ConnId conn, const std::string& id, const Status& why);

  InstanceSetup setup_;
  Counter* handoff_failures_ = nullptr;
  std::unique_ptr<Model> model_;
  PublisherWithPool kv_;  // the publisher and the pool memory
  std::unique_ptr<PrefillEngine> engine_;
  std::unique_ptr<InstanceHost> host_;  // stopped before the engine and the handoff go
  std::unique_ptr<KvHandoff> handoff_;
  uint64_t last_submit_seq_ = 0;  // the router's last Submit taken in
};

void PrefillDriver::Refuse(ConnId conn, const std::string& id, const Status& why) {
  TANDEM_LOG_REQ(kInfo, id) << "refused: " << why.ToString();
  Finish f;
  f.request_id = id;
  f.code = why.code();
  f.message = why.message();
  host_->Send(conn, f);
}

void PrefillDriver::HandleSubmit(ConnId conn, const Submit& submit) {
  last_submit_seq_ = std::max(last_submit_seq_, submit.seq);  // refused ones count as seen too
  if (!host_->accepting())
    return Refuse(conn, submit.request_id, Unavailable(setup_.name + " is shutting down"));
  if (submit.decode_address.empty())
    return Refuse(conn, submit.request_id,
                  InvalidArgument("decode_address is empty: a prefill instance hands every "
                                  "request to a decode instance"));
  if (Status s = engine_->Validate(submit.prompt, submit.sampling); !s.ok())
    return Refuse(conn, submit.request_id, s);
  handoff_->Queue(submit, conn);
  engine_->Add(submit.request_id, submit.prompt, submit.sampling);
}

LoadReport PrefillDriver::Load() {
  LoadReport r;
  r.queued_prefill_tokens = engine_->queued_tokens();
  r.waiting_requests = engine_->queued();
  r.running_requests = 0;
  r.free_kv_blocks = engine_->free_blocks();
  r.total_kv_blocks = engine_->total_blocks();
  r.prefill_seconds_per_token = engine_->seconds_per_token();
  r.last_submit_seq = last_submit_seq_;
  setup_.SetGauges(static_cast<double>(handoff_->held()), r.waiting_requests, r.free_kv_blocks,
                   r.total_kv_blocks);
  return r;
}

Status PrefillDriver::Init(const RoleArgs& args) {
  const ClusterConfig& config = args.config;
  const InstanceSection& section = config.prefill;
  TANDEM_ASSIGN_OR_RETURN(setup_, InstanceSetup::Create(
                                      InstanceRole::kPrefill, args, section,
                                      ServedModelName(config.model),
                                      "Requests prefilled whose KV is held for decode.",
                                      "Requests queued for prefill."));
  handoff_failures_ = &setup_.metrics
                           ->AddCounter("tandem_kv_handoff_failures_total",
                                        "Requests whose KV could not be handed to decode.")
                           .Get();
  TANDEM_ASSIGN_OR_RETURN(std::string dir, ResolveModelDir(config.model));
  TANDEM_ASSIGN_OR_RETURN(model_,
                          Model::Load(dir, {LoadDTypeFor(config.model.dtype, section.device)}));
  PrefillEngineOptions eo;
  eo.device = section.device;
  eo.threads = section.threads;
  eo.tensor_parallel = section.tensor_parallel;
  eo.token_budget = section.token_budget;
  eo.max_batch_size = section.max_batch_size;
  eo.block_size = config.kv_cache.block_size;
  eo.prefix_caching = config.kv_cache.prefix_caching;
  eo.kv_dtype = ResolvedKvDType(config);
  eo.max_model_len = config.model.max_model_len;
  eo.metrics = setup_.metrics.get();
  // With tensor_parallel each GPU holds a rank's weights and a rank's pool (its KV heads).
  DeviceMemoryPlan device_memory;  // on a GPU: reported once the engine holds it all
  TANDEM_ASSIGN_OR_RETURN(KvPoolShape shape,
                          InstanceKvPools(config, section, "prefill", *model_,
                                          PrefillEngine::BackendOptions(eo), &device_memory));
  eo.kv_blocks = shape.num_blocks;
  // Our own hold timer fires first; the transport's lease is the backstop.
  TANDEM_ASSIGN_OR_RETURN(kv_, CreatePublisherWithPool(
                                   config.transfer, shape.pool_bytes(),
                                   {.lease_timeout_s = section.kv_hold_timeout_s + 5,
                                    .metrics = setup_.metrics.get(),
                                    .host = section.host,
                                    .secret = args.control.secret,
                                    .pool_shape = shape,
                                    .device = section.device}));
  eo.kv_pools = kv_.pools;  // shared: the cache and the publisher keep them alive
  TANDEM_ASSIGN_OR_RETURN(engine_, PrefillEngine::Create(*model_, std::move(eo)));
  LogDeviceMemoryUse(section, setup_.name, device_memory);

  TANDEM_ASSIGN_OR_RETURN(HostOptions ho, setup_.Host(InstanceRole::kPrefill, args, section));
  ho.kv_peer_info = Encode(kv_.publisher->peer_info());
  // A puller's message for our publisher (nccl's pull orders), taken on the I/O thread: the
  // engine thread may be inside a forward pass for a while (the publisher is thread-safe and
  // outlives the host). A refused order fails the pulls on the links it named, which decode
  // reports as failed pulls.
  ho.on_kv_transport = [publisher = kv_.publisher.get()](const KvTransport& message) {
    Status taken = publisher->OnPullerMessage(AsBytes(message.bytes));
    if (!taken.ok()) {
      TANDEM_LOG_REQ(kWarn, message.request_id)
          << "KV transport message refused: " << taken.ToString();
    }
  };
  ho.kv_total_blocks = engine_->total_blocks();
  TANDEM_ASSIGN_OR_RETURN(host_, InstanceHost::Create(std::move(ho)));
  KvHandoffOptions hand;
  hand.hold_timeout_s = section.kv_hold_timeout_s;
  hand.layerwise = config.transfer.layerwise;
  handoff_ = std::make_unique<KvHandoff>(*host_, *engine_, *kv_.publisher, hand, handoff_failures_);
  host_->Run(this);
  TANDEM_LOG(kInfo) << setup_.name << ": " << engine_->total_blocks() << " KV blocks of "
                    << config.kv_cache.block_size << " tokens ("
                    << KvDTypeName(engine_->cache().layout().dtype) << "), transfer "
                    << config.transfer.backend;
  return Status();
}

}  // namespace

StatusOr<std::unique_ptr<HostedRole>> StartPrefillServer(const RoleArgs& args) {
  auto driver = std::make_unique<PrefillDriver>();
  TANDEM_RETURN_IF_ERROR(driver->Init(args));
  InstanceHost* host = driver->host();
  return std::make_unique<HostedRole>(std::move(driver), host);
}

int PrefillMain(const std::vector<std::string>& args) {
  RoleSpec spec;
  spec.command = "prefill";
  spec.description = "Runs a prefill instance: batches prompts, streams the first token, hands "
                     "the KV to a decode instance.";
  spec.start = [](const RoleArgs& role) -> StatusOr<std::unique_ptr<RoleProcess>> {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<HostedRole> server, StartPrefillServer(role));
    return std::unique_ptr<RoleProcess>(std::move(server));
  };
  return RunRoleMain(spec, args);
}

}  // namespace tandem
