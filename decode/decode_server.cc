#include "decode/decode_server.h"

#include <pthread.h>
#include <signal.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <variant>

#include "common/config/serving_config.h"
#include "common/net/connection_table.h"
#include "common/net/control_channel.h"
#include "common/base/flags.h"
#include "common/base/log.h"
#include "common/base/metrics.h"
#include "common/net/metrics_http.h"
#include "common/model/model.h"
#include "common/model/model_store.h"
#include "decode/batch_engine.h"
#include "decode/decode_scheduler.h"
#include "decode/kv_pull_link.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
using ConnPtr = std::shared_ptr<ControlConnection>;

struct MessageEvent {
  uint64_t conn_id;
  std::weak_ptr<ControlConnection> conn;
  ControlMessage message;
};
struct ClosedEvent {
  uint64_t conn_id;
};
struct PullDoneEvent {
  std::string request_id;
  Status status;
};
using Event = std::variant<MessageEvent, ClosedEvent, PullDoneEvent>;

uint64_t RandomId() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(Clock::now().time_since_epoch().count());
}

}  // namespace

struct DecodeServer::Impl : public EngineSink {
  InstanceOptions options;
  std::string name;
  std::string model_name;
  uint64_t instance_id = RandomId();
  const InstanceSection* section = nullptr;

  std::unique_ptr<Model> model;
  std::unique_ptr<BatchEngine> engine;
  std::unique_ptr<KvPullLink> puller;
  std::unique_ptr<MetricsRegistry> metrics;

  boost::asio::io_context io;
  std::unique_ptr<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::vector<std::thread> io_threads;
  std::unique_ptr<ControlListener> listener;
  std::unique_ptr<boost::asio::steady_timer> report_timer;
  std::unique_ptr<MetricsHttpServer> http;
  std::thread engine_thread;

  // Connections (io threads and engine thread).
  ConnectionTable connections;

  // Inbox: io/progress threads -> engine thread.
  std::mutex inbox_mutex;
  std::condition_variable inbox_cv;
  std::deque<Event> inbox;

  // Latest load, for the report timer.
  std::mutex load_mutex;
  LoadReport load;
  uint64_t last_submit_seq = 0;  // engine thread: the router's last Submit taken in

  std::atomic<bool> draining{false};
  std::atomic<bool> stop_engine{false};
  Clock::time_point drain_deadline;
  bool stopped = false;

  // Engine-thread state.
  struct PendingPull {
    KvReady ready;  // ready.layers_ready and ready.first_token follow KvProgress
    uint64_t prefill_conn = 0;
    std::weak_ptr<ControlConnection> prefill;
    int32_t blocks_needed = 0;
    std::vector<int32_t> blocks;  // while pulling and not in the engine
    bool cancelled = false;       // no Finish is due any more; free the blocks when the pull ends
    Clock::time_point arrived;
    Clock::time_point first_token_at;  // when this instance learned the first token
    // Layer-wise: the request joined the engine (which owns the blocks) before its pull ended.
    std::shared_ptr<KvArrival> arrival;
    bool in_engine = false;
    bool pulled = false;        // the pull ended OK before the first token was known
    bool prefill_gone = false;  // its prefill connection closed
  };
  std::deque<PendingPull> pull_queue;
  std::map<std::string, PendingPull> pulling;

  Gauge* running_gauge = nullptr;
  Gauge* waiting_gauge = nullptr;
  Gauge* usage_gauge = nullptr;
  Histogram* handoff_wait = nullptr;
  bool layerwise = false;  // transfer.layerwise: a request may join the batch mid-pull

  bool colocated() const { return options.role == InstanceRole::kColocated; }

  // ---- io side ----
  void Post(Event event) {
    {
      std::lock_guard<std::mutex> lock(inbox_mutex);
      inbox.push_back(std::move(event));
    }
    inbox_cv.notify_one();
  }

  Hello MakeHello() const {
    Hello h;
    h.role = options.role;
    h.instance_id = instance_id;
    h.name = name;
    h.model = model_name;
    h.control_address = "127.0.0.1:" + std::to_string(listener ? listener->port() : 0);
    h.kv_block_size = options.config.kv_cache.block_size;
    h.kv_total_blocks = engine->cache().num_blocks();
    return h;
  }

  void OnAccept(ConnPtr conn) {
    const uint64_t id = connections.Add(conn);
    std::weak_ptr<ControlConnection> weak = conn;
    conn->Start(
        [this, id, weak](ControlMessage message) {
          if (auto* hello = std::get_if<Hello>(&message)) {
            if (ConnPtr c = weak.lock()) c->Send(MakeHello());
            if (hello->role == InstanceRole::kRouter) connections.MarkRouter(id);
            TANDEM_LOG(kInfo) << "hello from " << InstanceRoleName(hello->role) << " '"
                              << hello->name << "'";
            return;
          }
          Post(MessageEvent{id, weak, std::move(message)});
        },
        [this, id](const Status& reason) {
          connections.Remove(id);
          TANDEM_LOG(kDebug) << "connection " << id << " closed: " << reason.ToString();
          Post(ClosedEvent{id});
        });
  }

  ConnPtr Router() { return connections.Router(); }

  void ScheduleReport() {
    report_timer->expires_after(std::chrono::milliseconds(100));
    report_timer->async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      LoadReport report;
      {
        std::lock_guard<std::mutex> lock(load_mutex);
        report = load;
      }
      for (const ConnPtr& r : connections.Routers()) r->Send(report);
      ScheduleReport();
    });
  }

  // ---- EngineSink (engine thread) ----
  void OnTokens(Tokens tokens) override {
    if (ConnPtr r = Router()) r->Send(tokens);
  }
  void OnFinish(Finish finish) override {
    if (finish.code != StatusCode::kOk) {
      TANDEM_LOG_REQ(kInfo, finish.request_id) << "finished with " << finish.ToStatus().ToString();
    }
    if (ConnPtr r = Router()) r->Send(finish);
  }

  void FinishError(const std::string& id, const Status& status, int32_t completion_tokens) {
    Finish f;
    f.request_id = id;
    f.code = status.code();
    f.message = status.message();
    f.completion_tokens = completion_tokens;
    OnFinish(std::move(f));
  }

  void SendReleased(const std::weak_ptr<ControlConnection>& prefill, const std::string& id,
                    const Status& status) {
    KvReleased released;
    released.request_id = id;
    released.code = status.code();
    released.message = status.message();
    if (ConnPtr p = prefill.lock()) p->Send(released);
  }

  // ---- engine thread ----
  bool Known(const std::string& id) {
    if (pulling.count(id)) return true;
    for (auto& p : pull_queue)
      if (p.ready.request_id == id) return true;
    return false;
  }

  void HandleSubmit(const Submit& submit) {
    last_submit_seq = std::max(last_submit_seq, submit.seq);  // rejected ones count as seen too
    if (draining) {
      FinishError(submit.request_id, Unavailable(name + " is shutting down"), 0);
      return;
    }
    if (!colocated()) {
      FinishError(submit.request_id,
                  FailedPrecondition(name + " is a decode instance: send Submit to prefill"), 0);
      return;
    }
    if (Status s = engine->Validate(submit.prompt, submit.sampling); !s.ok()) {
      FinishError(submit.request_id, s, 0);
      return;
    }
    engine->AddNew(submit.request_id, submit.prompt, submit.sampling);
  }

  void HandleKvReady(MessageEvent& event, KvReady& ready) {
    PendingPull p;
    p.prefill_conn = event.conn_id;
    p.prefill = event.conn;
    auto reject = [&](const Status& s) {
      FinishError(ready.request_id, s, 1);
      SendReleased(event.conn, ready.request_id, s);
    };
    if (colocated()) return reject(FailedPrecondition(name + " is colocated: no KV handoff"));
    if (draining) return reject(Unavailable(name + " is shutting down"));
    if (Known(ready.request_id))
      return reject(InvalidArgument("request id already on this instance"));
    if (Status s = engine->Validate(ready.prompt, ready.sampling); !s.ok()) return reject(s);
    if (!ready.sampling.seed) return reject(InvalidArgument("KvReady without a sampling seed"));
    if (ready.layers_ready > engine->layout().num_layers)
      return reject(InvalidArgument("KvReady announces more layers than the model has"));
    if (Status s = puller->Prepare(ready.kv_peer_info, ready.kv_descriptor,
                                   engine->layout().num_layers);
        !s.ok())
      return reject(s);
    const int32_t bs = options.config.kv_cache.block_size;
    p.arrived = Clock::now();
    p.first_token_at = p.arrived;
    p.blocks_needed = BlocksForPull(static_cast<int32_t>(ready.prompt.size()), bs);
    p.ready = std::move(ready);
    pull_queue.push_back(std::move(p));
  }

  void StartPull(PendingPull p) {
    const std::string id = p.ready.request_id;
    Status alloc = engine->cache().blocks().Allocate(p.blocks_needed, &p.blocks);
    TANDEM_CHECK(alloc.ok(), "AdmitPulls checked the free blocks");
    const KvLayout& layout = engine->layout();
    const int32_t prompt_blocks =
        BlocksForTokens(p.ready.prompt.size(), layout.block_size);
    const std::byte* base = engine->cache().data();
    PullRanges local(layout.num_layers);
    for (int l = 0; l < layout.num_layers; ++l) {
      for (int32_t k = 0; k < prompt_blocks; ++k) {
        const auto* at = reinterpret_cast<const std::byte*>(engine->cache().BlockData(l, p.blocks[k]));
        local[l].push_back({static_cast<uint64_t>(at - base), layout.block_bytes()});
      }
    }
    const std::string descriptor = p.ready.kv_descriptor;
    const int32_t layers_ready = p.ready.layers_ready;
    std::function<void(uint32_t)> on_layer;
    if (layerwise) {
      p.arrival = std::make_shared<KvArrival>(layout.num_layers);
      on_layer = [arrival = p.arrival](uint32_t layer) { arrival->LayerLanded(layer); };
    }
    auto& entry = pulling.emplace(id, std::move(p)).first->second;
    Status started = puller->Pull(
        descriptor, local,
        [this, arrival = entry.arrival](const std::string& request_id, const Status& status) {
          if (arrival) arrival->Done(status);
          Post(PullDoneEvent{request_id, status});
        },
        std::move(on_layer), layers_ready);
    if (!started.ok()) {
      if (entry.arrival) entry.arrival->Done(started);
      Post(PullDoneEvent{id, started});
      return;
    }
    if (layerwise && entry.ready.first_token) JoinEngine(id, entry);
  }

  // Layer-wise: the request's first token is known and its pull is in flight: it joins the
  // batch now (the engine owns the blocks; each step waits for the layers it uses).
  void JoinEngine(const std::string& id, PendingPull& p) {
    engine->AddPulled(id, p.ready.prompt, p.ready.first_token->token_id, p.ready.sampling,
                      std::move(p.blocks), p.arrival);
    p.blocks.clear();
    p.in_engine = true;
  }

  // The pull ended OK and the first token is known: the request continues in the engine.
  void KvComplete(const std::string& id, PendingPull& p) {
    if (handoff_wait != nullptr)
      handoff_wait->Observe(std::chrono::duration<double>(Clock::now() - p.first_token_at).count());
    if (!p.in_engine)
      engine->AddPulled(id, std::move(p.ready.prompt), p.ready.first_token->token_id,
                        p.ready.sampling, std::move(p.blocks));
  }

  // Layer-wise: prefill computed more layers, sampled the first token, or ended the request at
  // its first token (then prefill sent the Finish; this instance only releases the KV).
  void HandleKvProgress(const KvProgress& m) {
    for (auto it = pull_queue.begin(); it != pull_queue.end(); ++it) {
      if (it->ready.request_id != m.request_id) continue;
      if (m.finished) {
        SendReleased(it->prefill, m.request_id, Cancelled("finished at its first token"));
        pull_queue.erase(it);
        return;
      }
      RaiseLayers(*it, m);
      return;
    }
    auto it = pulling.find(m.request_id);
    if (it == pulling.end()) return;  // failed or cancelled here already
    PendingPull& p = it->second;
    const bool knew_first = p.ready.first_token.has_value();
    if (RaiseLayers(p, m)) {
      Status s = puller->SetLayersAvailable(m.request_id, p.ready.layers_ready);
      static_cast<void>(s);  // NotFound: the pull ended meanwhile (its PullDoneEvent is queued)
    }
    if (m.finished) {
      if (p.in_engine) {  // not possible: prefill sends the first token only once
        std::vector<int32_t> blocks;
        if (engine->Remove(m.request_id, &blocks)) p.blocks = std::move(blocks);
        p.in_engine = false;
      }
      p.cancelled = true;
      if (p.pulled) {
        engine->cache().blocks().Free(p.blocks);
        SendReleased(p.prefill, m.request_id, Status());
        pulling.erase(it);
      }
      return;
    }
    if (knew_first || !p.ready.first_token || p.cancelled) return;
    if (p.pulled) {
      KvComplete(m.request_id, p);
      pulling.erase(it);
    } else {
      JoinEngine(m.request_id, p);
    }
  }

  // Applies a KvProgress to a pending request; true when more layers became available.
  static bool RaiseLayers(PendingPull& p, const KvProgress& m) {
    if (m.first_token && !p.ready.first_token) {
      p.ready.first_token = m.first_token;
      p.first_token_at = Clock::now();
    }
    const int32_t before = p.ready.layers_ready;
    if (before == kAllLayersReady) return false;
    if (m.layers_ready == kAllLayersReady || m.layers_ready > before) {
      p.ready.layers_ready = m.layers_ready;
      return true;
    }
    return false;
  }

  void HandlePullDone(const PullDoneEvent& done) {
    auto it = pulling.find(done.request_id);
    if (it == pulling.end()) return;
    PendingPull& p = it->second;
    if (p.cancelled) {
      engine->cache().blocks().Free(p.blocks);
      if (p.arrival) SendReleased(p.prefill, done.request_id, done.status);
      pulling.erase(it);
      return;
    }
    if (!done.status.ok()) {
      TANDEM_LOG_REQ(kWarn, done.request_id) << "KV pull failed: " << done.status.ToString();
      // on_done ran: nothing writes the blocks any more, in the engine or not.
      if (p.in_engine) engine->Cancel(done.request_id);
      engine->cache().blocks().Free(p.blocks);
      FinishError(done.request_id, done.status.WithContext("KV pull"), 1);
      SendReleased(p.prefill, done.request_id, done.status);
      pulling.erase(it);
      return;
    }
    SendReleased(p.prefill, done.request_id, Status());
    if (!p.ready.first_token) {
      if (p.prefill_gone) {  // the first token will never come
        engine->cache().blocks().Free(p.blocks);
        FinishError(done.request_id, Unavailable("prefill instance disconnected"), 1);
        pulling.erase(it);
        return;
      }
      p.pulled = true;  // waits for the first token in KvProgress
      return;
    }
    KvComplete(done.request_id, p);
    pulling.erase(it);
  }

  void HandleCancel(const std::string& id) {
    const Status cancelled = Cancelled("cancelled");
    if (auto it = pulling.find(id); it != pulling.end() && !it->second.cancelled &&
                                    (it->second.in_engine || it->second.pulled)) {
      PendingPull& p = it->second;
      FinishError(id, cancelled, 1);
      if (p.pulled) {  // pulled, waiting for its first token
        engine->cache().blocks().Free(p.blocks);
        pulling.erase(it);
        return;
      }
      // In the batch while its KV arrives: the blocks are freed when the pull has ended.
      std::vector<int32_t> blocks;
      if (engine->Remove(id, &blocks)) p.blocks = std::move(blocks);
      p.in_engine = false;
      p.cancelled = true;
      return;
    }
    if (engine->Cancel(id)) {
      FinishError(id, cancelled, 0);
      return;
    }
    for (auto it = pull_queue.begin(); it != pull_queue.end(); ++it) {
      if (it->ready.request_id != id) continue;
      SendReleased(it->prefill, id, cancelled);
      FinishError(id, cancelled, 1);
      pull_queue.erase(it);
      return;
    }
    if (auto it = pulling.find(id); it != pulling.end() && !it->second.cancelled) {
      // The pull is in flight: its blocks are freed when it is done.
      it->second.cancelled = true;
      FinishError(id, cancelled, 1);
    }
  }

  void HandleClosed(uint64_t conn_id) {
    // Layer-wise requests without their first token cannot continue: a finished pull fails
    // now, one in flight when it ends (it fails, or completes with no first token to come).
    for (auto it = pulling.begin(); it != pulling.end();) {
      PendingPull& p = it->second;
      if (p.prefill_conn != conn_id || p.ready.first_token || p.cancelled) {
        ++it;
        continue;
      }
      p.prefill_gone = true;
      if (!p.pulled) {
        ++it;
        continue;
      }
      engine->cache().blocks().Free(p.blocks);
      FinishError(it->first, Unavailable("prefill instance disconnected"), 1);
      it = pulling.erase(it);
    }
    // KV still queued behind a prefill instance that went away cannot be pulled any more.
    for (auto it = pull_queue.begin(); it != pull_queue.end();) {
      if (it->prefill_conn == conn_id) {
        FinishError(it->ready.request_id, Unavailable("prefill instance disconnected"), 1);
        it = pull_queue.erase(it);
      } else {
        ++it;
      }
    }
  }

  void Handle(Event& event) {
    if (auto* m = std::get_if<MessageEvent>(&event)) {
      if (auto* s = std::get_if<Submit>(&m->message)) return HandleSubmit(*s);
      if (auto* r = std::get_if<KvReady>(&m->message)) return HandleKvReady(*m, *r);
      if (auto* c = std::get_if<Cancel>(&m->message)) return HandleCancel(c->request_id);
      if (auto* k = std::get_if<KvProgress>(&m->message)) return HandleKvProgress(*k);
      TANDEM_LOG(kDebug) << "ignoring unexpected control message";
      return;
    }
    if (auto* c = std::get_if<ClosedEvent>(&event)) return HandleClosed(c->conn_id);
    if (auto* d = std::get_if<PullDoneEvent>(&event)) return HandlePullDone(*d);
  }

  // Prefill frees unpulled KV after prefill.kv_hold_timeout_s (same cluster config). Pulling
  // after that could read blocks it has reused, so a request that waited that long (less a
  // margin) fails here instead of pulling.
  void ExpireQueuedPulls() {
    const auto limit = std::chrono::milliseconds(
        static_cast<int64_t>(std::max(0.0, options.config.prefill.kv_hold_timeout_s - 1.0) * 1000));
    const auto now = Clock::now();
    for (auto it = pull_queue.begin(); it != pull_queue.end();) {
      // Prefill's hold starts when it sends the first token (KvReady, or KvProgress after a
      // layer-wise pass); until then, conservatively, when KvReady came.
      if (now - it->first_token_at < limit) {
        ++it;
        continue;
      }
      const Status late = DeadlineExceeded("waited for decode KV blocks longer than "
                                           "prefill.kv_hold_timeout_s");
      FinishError(it->ready.request_id, late, 1);
      SendReleased(it->prefill, it->ready.request_id, late);
      it = pull_queue.erase(it);
    }
  }

  // Pulls in flight whose request is not in the running batch yet (layer-wise requests join the
  // batch while their KV arrives, and count there).
  int32_t PullsOutsideEngine() const {
    int32_t n = 0;
    for (const auto& [id, p] : pulling) n += p.in_engine ? 0 : 1;
    return n;
  }

  void AdmitFromPullQueue() {
    ExpireQueuedPulls();
    if (pull_queue.empty()) return;
    EngineStats stats = engine->Stats();
    if (stats.waiting > 0) return;  // preempted requests recompute before new ones come in
    std::vector<int32_t> needs;
    for (auto& p : pull_queue) needs.push_back(p.blocks_needed);
    PullLimits limits{stats.total_blocks, section->kv_usage_watermark, section->max_batch_size};
    size_t n = AdmitPulls(needs, limits, stats.free_blocks, stats.running + PullsOutsideEngine());
    for (size_t i = 0; i < n; ++i) {
      PendingPull p = std::move(pull_queue.front());
      pull_queue.pop_front();
      StartPull(std::move(p));
    }
  }

  void PublishLoad() {
    EngineStats s = engine->Stats();
    LoadReport r;
    r.instance_id = instance_id;
    r.queued_prefill_tokens = s.waiting_prompt_tokens;
    r.waiting_requests =
        s.waiting + static_cast<int32_t>(pull_queue.size()) + PullsOutsideEngine();
    r.running_requests = s.running;
    r.free_kv_blocks = s.free_blocks;
    r.total_kv_blocks = s.total_blocks;
    r.prefill_seconds_per_token = s.prefill_seconds_per_token;
    r.decode_step_seconds = s.decode_step_seconds;
    r.decode_forward_seconds = s.decode_forward_seconds;
    r.decode_step_batch = s.decode_step_batch;
    r.decode_step_context_tokens = s.decode_step_context_tokens;
    r.context_tokens = s.context_tokens;
    r.last_submit_seq = last_submit_seq;
    running_gauge->Set(r.running_requests);
    waiting_gauge->Set(r.waiting_requests);
    usage_gauge->Set(s.total_blocks == 0 ? 0.0
                                         : 1.0 - static_cast<double>(s.free_blocks) / s.total_blocks);
    std::lock_guard<std::mutex> lock(load_mutex);
    load = r;
  }

  bool Idle() const { return engine->idle() && pull_queue.empty() && pulling.empty(); }

  void EngineLoop() {
    std::deque<Event> events;
    bool worked = false;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(inbox_mutex);
        // Sleep unless the last step did work: waiting for blocks or a pull must not spin.
        if (inbox.empty() && !worked)
          inbox_cv.wait_for(lock, std::chrono::milliseconds(stop_engine ? 5 : 50));
        events.swap(inbox);
      }
      for (Event& e : events) Handle(e);
      events.clear();
      if (stop_engine && (Idle() || Clock::now() >= drain_deadline)) break;
      AdmitFromPullQueue();
      worked = engine->Step(*this);
      PublishLoad();
    }
    // Whatever the drain did not finish ends now, with an error the router can report.
    const Status gone = Unavailable(name + " shut down before the request finished");
    engine->FailAll(gone, *this);
    for (auto& p : pull_queue) {
      FinishError(p.ready.request_id, gone, 1);
      SendReleased(p.prefill, p.ready.request_id, gone);
    }
    pull_queue.clear();
    for (auto& [id, p] : pulling)
      if (!p.cancelled && !p.in_engine) FinishError(id, gone, 1);  // FailAll told the others
    PublishLoad();
  }
};

StatusOr<std::unique_ptr<DecodeServer>> DecodeServer::Start(const InstanceOptions& options) {
  const bool colocated = options.role == InstanceRole::kColocated;
  const InstanceSection& section = colocated ? options.config.colocated : options.config.decode;
  const char* role_name = colocated ? "colocated" : "decode";
  if (section.port == 0)
    return InvalidArgument(std::string(role_name) + ".port must be set (nonzero)");
  std::unique_ptr<DecodeServer> server(new DecodeServer());
  server->impl_ = std::make_unique<Impl>();
  Impl& impl = *server->impl_;
  impl.options = options;
  impl.section = colocated ? &impl.options.config.colocated : &impl.options.config.decode;
  impl.name = std::string(role_name) + "-" + std::to_string(options.index);
  impl.model_name = ServedModelName(options.config.model);
  impl.metrics = std::make_unique<MetricsRegistry>(
      Labels{{"role", role_name}, {"model", impl.model_name}});

  TANDEM_ASSIGN_OR_RETURN(std::string dir, ResolveModelDir(options.config.model));
  TANDEM_ASSIGN_OR_RETURN(impl.model, Model::Load(dir));
  BatchEngineOptions eo;
  eo.threads = section.threads;
  eo.block_size = options.config.kv_cache.block_size;
  eo.max_batch_size = section.max_batch_size;
  eo.token_budget = section.token_budget;
  if (colocated) eo.policy = StepPolicyFromConfig(section.scheduling);
  eo.max_model_len = options.config.model.max_model_len;
  const ModelConfig& model_config = impl.model->config();
  TANDEM_ASSIGN_OR_RETURN(eo.kv_blocks,
                          KvPoolBlocks(options.config, section,
                                       KvLayout{model_config.num_layers, model_config.num_kv_heads,
                                                model_config.head_dim, eo.block_size}));
  eo.metrics = impl.metrics.get();
  // A request joins the batch only once every layer was announced: the pull ends within the
  // transfer timeout, and the step's wait for a layer a little later.
  eo.kv_wait_timeout = std::chrono::milliseconds(
      static_cast<int64_t>((options.config.transfer.timeout_s + 1.0) * 1000));
  impl.layerwise = !colocated && StreamsLayerwise(options.config.transfer);
  if (!colocated) {
    // The transport provides the pool's memory (UCX-allocated for ucx: shared-memory RMA needs
    // it); the layout is the one CpuForward::MakeKvLayout gives, checked by KvCache::Create.
    const TransferSection& t = options.config.transfer;
    KvPullOptions po;
    po.backend = t.backend;
    po.ucx_tls = t.ucx_tls;
    po.timeout_s = t.timeout_s;
    // Prefill computes the layers it announces; it frees a request's KV after
    // prefill.kv_hold_timeout_s anyway, so that bounds the wait for the next layer.
    po.layer_wait_timeout_s = std::max(t.timeout_s, options.config.prefill.kv_hold_timeout_s);
    po.max_inflight = static_cast<size_t>(t.max_inflight);
    po.metrics = impl.metrics.get();
    const ModelConfig& mc = impl.model->config();
    const KvLayout layout{mc.num_layers, mc.num_kv_heads, mc.head_dim, eo.block_size};
    TANDEM_ASSIGN_OR_RETURN(impl.puller,
                            KvPullLink::CreateWithPool(KvPoolBytes(layout, eo.kv_blocks), po,
                                                       &eo.kv_memory));
  }
  TANDEM_ASSIGN_OR_RETURN(impl.engine, BatchEngine::Create(*impl.model, eo));
  impl.running_gauge = &impl.metrics->AddGauge("tandem_num_requests_running",
                                              "Requests in the running batch.").Get();
  impl.waiting_gauge = &impl.metrics->AddGauge("tandem_num_requests_waiting",
                                              "Requests waiting (queued, preempted or pulling).").Get();
  impl.usage_gauge = &impl.metrics->AddGauge("tandem_kv_cache_usage_ratio",
                                            "Fraction of KV blocks in use.").Get();
  if (!colocated) {
    impl.handoff_wait = &impl.metrics
                             ->AddHistogram("tandem_kv_handoff_wait_seconds",
                                            "From learning a request's first token to having all "
                                            "of its KV (queueing for blocks included).",
                                            {}, LatencyBuckets())
                             .Get();
  }

  impl.work = std::make_unique<
      boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>(
      impl.io.get_executor());
  TANDEM_ASSIGN_OR_RETURN(impl.listener,
                          ControlListener::Listen(impl.io, "127.0.0.1", section.port + options.index,
                                                  [&impl](ConnPtr c) { impl.OnAccept(std::move(c)); }));
  if (section.metrics_port != 0) {
    TANDEM_ASSIGN_OR_RETURN(
        impl.http, MetricsHttpServer::Start(
                       "127.0.0.1", section.metrics_port + options.index,
                       [&impl] { return impl.metrics->Render(); },
                       [&impl] {
                         return impl.draining ? Unavailable(impl.name + " is draining") : Status();
                       }));
  }
  impl.PublishLoad();
  impl.report_timer = std::make_unique<boost::asio::steady_timer>(impl.io);
  impl.ScheduleReport();
  for (int i = 0; i < 2; ++i) impl.io_threads.emplace_back([&impl] { impl.io.run(); });
  impl.engine_thread = std::thread([&impl] { impl.EngineLoop(); });
  TANDEM_LOG(kInfo) << impl.name << " serving '" << impl.model_name << "' on 127.0.0.1:"
                    << impl.listener->port() << " (" << impl.engine->cache().num_blocks()
                    << " KV blocks of " << eo.block_size << " tokens)";
  return server;
}

int DecodeServer::control_port() const { return impl_->listener->port(); }

DecodeServer::~DecodeServer() { Stop(); }

void DecodeServer::Stop() {
  if (!impl_ || impl_->stopped) return;
  Impl& impl = *impl_;
  impl.stopped = true;
  impl.draining = true;
  impl.drain_deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(impl.options.drain_timeout_s * 1000));
  impl.stop_engine = true;
  impl.inbox_cv.notify_one();
  if (impl.engine_thread.joinable()) impl.engine_thread.join();
  // Let the last Finish/Tokens frames leave before the sockets close.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  impl.puller.reset();
  if (impl.http) impl.http->Stop();
  boost::asio::post(impl.io, [&impl] {
    impl.report_timer->cancel();
    impl.listener->Stop();
    impl.connections.CloseAll();
  });
  impl.work.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  impl.io.stop();
  for (auto& t : impl.io_threads) t.join();
  impl.io_threads.clear();
}

int RunBatchInstanceMain(InstanceRole role, const std::vector<std::string>& args) {
  const bool colocated = role == InstanceRole::kColocated;
  const std::string command = colocated ? "colocated" : "decode";
  FlagParser flags("tandem " + command + " [--config FILE] [--index I] [--SECTION.KEY=VALUE ...]",
                   colocated ? "Runs a colocated instance (prefill and decode in one engine)."
                             : "Runs a decode instance (pulls KV from prefill, batches decode steps).");
  flags.AddString("config", "", "cluster YAML (absent: defaults)");
  flags.AddInt("index", 0, "instance index: ports are SECTION.port + index");
  flags.AddDouble("drain-timeout-s", 30, "on SIGTERM, wait at most this long for in-flight requests");
  flags.AllowConfigOverrides();
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "tandem %s: %s\n", command.c_str(), s.message().c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  StatusOr<ClusterConfig> config =
      LoadServingConfig(flags.GetString("config"), flags.config_overrides());
  if (!config.ok()) {
    std::fprintf(stderr, "tandem %s: %s\n", command.c_str(), config.status().message().c_str());
    return kExitFailure;
  }
  if (auto level = ParseLogLevel(config->logging.level); level.ok()) SetLogLevel(*level);
  if (auto format = ParseLogFormat(config->logging.format); format.ok()) SetLogFormat(*format);
  InstanceOptions options;
  options.config = std::move(*config);
  options.role = role;
  options.index = static_cast<int>(flags.GetInt("index"));
  options.drain_timeout_s = flags.GetDouble("drain-timeout-s");
  SetLogRole(command + "-" + std::to_string(options.index));

  // Block the stop signals in every thread (they inherit the mask); this one waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  StatusOr<std::unique_ptr<DecodeServer>> server = DecodeServer::Start(options);
  if (!server.ok()) {
    TANDEM_LOG(kError) << "cannot start: " << server.status().ToString();
    return kExitFailure;
  }
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  TANDEM_LOG(kInfo) << "signal " << signal_number << ": draining";
  (*server)->Stop();
  TANDEM_LOG(kInfo) << "stopped";
  return kExitOk;
}

int DecodeMain(const std::vector<std::string>& args) {
  return RunBatchInstanceMain(InstanceRole::kDecode, args);
}

}  // namespace tandem
