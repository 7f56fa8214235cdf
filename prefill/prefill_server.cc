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

class PrefillServer::Driver : public InstanceDriver, public PrefillObserver {
 public:
  Status Init(const RoleArgs& args);
  InstanceHost* host() { return host_.get(); }  // null until Init bound the ports

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

  std::string name_;
  std::unique_ptr<MetricsRegistry> metrics_;
  Gauge* running_gauge_ = nullptr;
  Gauge* waiting_gauge_ = nullptr;
  Gauge* usage_gauge_ = nullptr;
  Counter* handoff_failures_ = nullptr;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvPublisher> publisher_;
  std::unique_ptr<PrefillEngine> engine_;
  std::unique_ptr<InstanceHost> host_;  // stopped before the engine and the handoff go
  std::unique_ptr<KvHandoff> handoff_;
  uint64_t last_submit_seq_ = 0;  // the router's last Submit taken in
};

void PrefillServer::Driver::Refuse(ConnId conn, const std::string& id, const Status& why) {
  TANDEM_LOG_REQ(kInfo, id) << "refused: " << why.ToString();
  Finish f;
  f.request_id = id;
  f.code = why.code();
  f.message = why.message();
  host_->Send(conn, f);
}

void PrefillServer::Driver::HandleSubmit(ConnId conn, const Submit& submit) {
  last_submit_seq_ = std::max(last_submit_seq_, submit.seq);  // refused ones count as seen too
  if (!host_->accepting())
    return Refuse(conn, submit.request_id, Unavailable(name_ + " is shutting down"));
  if (submit.decode_address.empty())
    return Refuse(conn, submit.request_id,
                  InvalidArgument("decode_address is empty: a prefill instance hands every "
                                  "request to a decode instance"));
  if (Status s = engine_->Validate(submit.prompt, submit.sampling); !s.ok())
    return Refuse(conn, submit.request_id, s);
  handoff_->Queue(submit, conn);
  engine_->Add(submit.request_id, submit.prompt, submit.sampling);
}

LoadReport PrefillServer::Driver::Load() {
  LoadReport r;
  r.queued_prefill_tokens = engine_->queued_tokens();
  r.waiting_requests = engine_->queued();
  r.running_requests = 0;
  r.free_kv_blocks = engine_->free_blocks();
  r.total_kv_blocks = engine_->total_blocks();
  r.prefill_seconds_per_token = engine_->seconds_per_token();
  r.last_submit_seq = last_submit_seq_;
  running_gauge_->Set(static_cast<double>(handoff_->held()));
  waiting_gauge_->Set(r.waiting_requests);
  usage_gauge_->Set(1.0 - static_cast<double>(r.free_kv_blocks) / r.total_kv_blocks);
  return r;
}

Status PrefillServer::Driver::Init(const RoleArgs& args) {
  const ClusterConfig& config = args.config;
  const InstanceSection& section = config.prefill;
  if (section.port == 0) return InvalidArgument("prefill.port must be set (nonzero)");
  name_ = "prefill-" + std::to_string(args.index);
  const std::string model_name = ServedModelName(config.model);
  metrics_ = std::make_unique<MetricsRegistry>(Labels{{"role", "prefill"}, {"model", model_name}});
  running_gauge_ = &metrics_->AddGauge("tandem_num_requests_running",
                                       "Requests prefilled whose KV is held for decode.").Get();
  waiting_gauge_ = &metrics_->AddGauge("tandem_num_requests_waiting",
                                       "Requests queued for prefill.").Get();
  usage_gauge_ = &metrics_->AddGauge("tandem_kv_cache_usage_ratio",
                                     "Fraction of KV blocks in use.").Get();
  handoff_failures_ = &metrics_->AddCounter("tandem_kv_handoff_failures_total",
                                            "Requests whose KV could not be handed to decode.")
                           .Get();

  TANDEM_ASSIGN_OR_RETURN(std::string dir, ResolveModelDir(config.model));
  TANDEM_ASSIGN_OR_RETURN(model_, Model::Load(dir));
  const ModelConfig& mc = model_->config();
  PrefillEngineOptions eo;
  eo.threads = section.threads;
  eo.token_budget = section.token_budget;
  eo.max_batch_size = section.max_batch_size;
  eo.block_size = config.kv_cache.block_size;
  eo.kv_blocks = KvPoolBlocks(config, section);
  eo.max_model_len = config.model.max_model_len;
  eo.metrics = metrics_.get();
  const KvLayout layout{mc.num_layers, mc.num_kv_heads, mc.head_dim, eo.block_size};
  TransferFactoryOptions to;
  // Our own hold timer fires first; the transport's lease is the backstop.
  to.lease_timeout_s = section.kv_hold_timeout_s + 5;
  to.metrics = metrics_.get();
  TANDEM_ASSIGN_OR_RETURN(PublisherWithPool published,
                          CreatePublisherWithPool(config.transfer,
                                                  KvPoolBytes(layout, eo.kv_blocks), to));
  publisher_ = std::move(published.publisher);
  eo.kv_memory = std::move(published.memory);
  TANDEM_ASSIGN_OR_RETURN(engine_, PrefillEngine::Create(*model_, std::move(eo)));

  HostOptions ho;
  ho.name = name_;
  ho.role = InstanceRole::kPrefill;
  ho.model = model_name;
  ho.control_port = section.port + args.index;
  ho.metrics_port = section.metrics_port == 0 ? 0 : section.metrics_port + args.index;
  ho.control = config.control;
  ho.drain_timeout_s = args.drain_timeout_s;
  ho.kv_peer_info = Encode(publisher_->peer_info());
  ho.kv_block_size = config.kv_cache.block_size;
  ho.kv_total_blocks = engine_->total_blocks();
  ho.metrics = metrics_.get();
  TANDEM_ASSIGN_OR_RETURN(host_, InstanceHost::Create(std::move(ho)));
  KvHandoffOptions hand;
  hand.hold_timeout_s = section.kv_hold_timeout_s;
  hand.layerwise = StreamsLayerwise(config.transfer);
  handoff_ = std::make_unique<KvHandoff>(*host_, *engine_, *publisher_, hand, handoff_failures_);
  host_->Run(this);
  TANDEM_LOG(kInfo) << name_ << " serving '" << model_name << "' on 127.0.0.1:"
                    << host_->control_port() << " (" << engine_->total_blocks()
                    << " KV blocks of " << config.kv_cache.block_size << " tokens, transfer "
                    << config.transfer.backend << ")";
  return Status();
}

StatusOr<std::unique_ptr<PrefillServer>> PrefillServer::Start(const RoleArgs& args) {
  std::unique_ptr<PrefillServer> server(new PrefillServer());
  server->driver_ = std::make_unique<Driver>();
  TANDEM_RETURN_IF_ERROR(server->driver_->Init(args));
  return server;
}

PrefillServer::~PrefillServer() { Stop(); }

void PrefillServer::Stop() {
  if (driver_ && driver_->host()) driver_->host()->Stop();
}

int PrefillServer::control_port() const { return driver_->host()->control_port(); }

int PrefillMain(const std::vector<std::string>& args) {
  RoleSpec spec;
  spec.command = "prefill";
  spec.description = "Runs a prefill instance: batches prompts, streams the first token, hands "
                     "the KV to a decode instance.";
  spec.start = [](const RoleArgs& role) -> StatusOr<std::unique_ptr<RoleProcess>> {
    TANDEM_ASSIGN_OR_RETURN(auto server, PrefillServer::Start(role));
    return std::unique_ptr<RoleProcess>(std::move(server));
  };
  return RunRoleMain(spec, args);
}

}  // namespace tandem
