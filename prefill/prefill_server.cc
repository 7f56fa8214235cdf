#include "prefill/prefill_server.h"

#include <pthread.h>
#include <signal.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <algorithm>
#include <mutex>
#include <random>
#include <thread>
#include <variant>

#include "common/config/serving_config.h"
#include "common/net/connection_table.h"
#include "common/net/control_channel.h"
#include "common/net/control_wire.h"
#include "common/base/flags.h"
#include "common/engine/forward.h"
#include "common/engine/kv_cache.h"
#include "common/base/log.h"
#include "common/base/metrics.h"
#include "common/net/metrics_http.h"
#include "common/model/model.h"
#include "common/model/model_store.h"
#include "common/engine/sampling.h"
#include "prefill/kv_publish_link.h"
#include "prefill/prefill_scheduler.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
using ConnPtr = std::shared_ptr<ControlConnection>;
constexpr double kConnectTimeoutS = 2.0;
constexpr double kAverageWeight = 0.2;

struct MessageEvent {
  uint64_t conn_id;
  ControlMessage message;
};
struct ClosedEvent {
  uint64_t conn_id;
};
struct ReleasedEvent {
  std::string request_id;
  Status status;
};
using Event = std::variant<MessageEvent, ClosedEvent, ReleasedEvent>;

uint64_t RandomId() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd() ^
         static_cast<uint64_t>(Clock::now().time_since_epoch().count());
}

}  // namespace

struct PrefillServer::Impl {
  PrefillOptions options;
  const InstanceSection* section = nullptr;
  std::string name;
  std::string model_name;
  uint64_t instance_id = RandomId();

  std::unique_ptr<Model> model;
  std::unique_ptr<CpuForward> forward;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<SamplerWorkspace> workspace;
  std::vector<int32_t> eos_ids;
  std::unique_ptr<KvPublishLink> publisher;
  std::string peer_info_blob;
  std::unique_ptr<MetricsRegistry> metrics;
  Gauge* running_gauge = nullptr;
  Gauge* waiting_gauge = nullptr;
  Gauge* usage_gauge = nullptr;
  Histogram* batch_seconds = nullptr;
  Counter* handoff_failures = nullptr;

  boost::asio::io_context io;
  std::unique_ptr<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::vector<std::thread> io_threads;
  std::unique_ptr<ControlListener> listener;
  std::unique_ptr<boost::asio::steady_timer> report_timer;
  std::unique_ptr<MetricsHttpServer> http;
  std::thread engine_thread;

  ConnectionTable connections;  // accepted and outbound

  std::mutex inbox_mutex;
  std::condition_variable inbox_cv;
  std::deque<Event> inbox;

  std::mutex load_mutex;
  LoadReport load;
  uint64_t last_submit_seq = 0;  // engine thread: the router's last Submit taken in

  std::atomic<bool> draining{false};
  std::atomic<bool> stop_engine{false};
  Clock::time_point drain_deadline;
  bool stopped = false;

  // ---- engine-thread state ----
  struct Request {
    Submit submit;
    int32_t num_computed = 0;
    std::vector<int32_t> blocks;
    // Layer-wise: KvReady went out before the last chunk's forward pass; `held` owns the blocks
    // from then on (r.blocks still names them for the pass). Set only on success.
    ConnPtr announced_to;
    Status announce_error;  // the announcement failed: fail the request after the pass
  };
  struct Held {
    std::vector<int32_t> blocks;
    Clock::time_point deadline;
    uint64_t decode_conn = 0;
  };
  std::deque<std::unique_ptr<Request>> queue;
  std::map<std::string, Held> held;
  std::map<std::string, std::pair<uint64_t, ConnPtr>> decode_conns;  // by address
  double avg_s_per_token = 0;
  std::vector<PrefillItem> items;
  std::vector<SequenceInput> inputs;
  bool layerwise = false;  // transfer.layerwise (not over NCCL: it cannot stream)

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
    h.role = InstanceRole::kPrefill;
    h.instance_id = instance_id;
    h.name = name;
    h.model = model_name;
    h.control_address = "127.0.0.1:" + std::to_string(listener ? listener->port() : 0);
    h.kv_peer_info = peer_info_blob;
    h.kv_block_size = options.config.kv_cache.block_size;
    h.kv_total_blocks = cache->num_blocks();
    return h;
  }

  // Starts reading a connection (accepted or outbound); returns its id.
  uint64_t Adopt(const ConnPtr& conn, bool reply_hello) {
    const uint64_t id = connections.Add(conn);
    std::weak_ptr<ControlConnection> weak = conn;
    conn->Start(
        [this, id, weak, reply_hello](ControlMessage message) {
          if (auto* hello = std::get_if<Hello>(&message)) {
            if (reply_hello)
              if (ConnPtr c = weak.lock()) c->Send(MakeHello());
            if (hello->role == InstanceRole::kRouter) connections.MarkRouter(id);
            TANDEM_LOG(kInfo) << "hello from " << InstanceRoleName(hello->role) << " '"
                              << hello->name << "'";
            return;
          }
          Post(MessageEvent{id, std::move(message)});
        },
        [this, id](const Status& reason) {
          connections.Remove(id);
          TANDEM_LOG(kDebug) << "connection " << id << " closed: " << reason.ToString();
          Post(ClosedEvent{id});
        });
    return id;
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

  // ---- engine thread ----
  void SendFinish(const std::string& id, const Status& status, const std::string& reason,
                  int32_t completion_tokens) {
    if (!status.ok()) {
      TANDEM_LOG_REQ(kInfo, id) << "finished with " << status.ToString();
    }
    Finish f;
    f.request_id = id;
    f.finish_reason = reason;
    f.code = status.code();
    f.message = status.message();
    f.completion_tokens = completion_tokens;
    if (ConnPtr r = Router()) r->Send(f);
  }

  Status Validate(const Submit& s) const {
    if (s.decode_address.empty())
      return InvalidArgument("decode_address is empty: a prefill instance hands every request "
                             "to a decode instance");
    if (s.prompt.empty()) return InvalidArgument("prompt is empty");
    const int32_t vocab = model->config().vocab_size;
    for (int32_t t : s.prompt)
      if (t < 0 || t >= vocab)
        return InvalidArgument("prompt token " + std::to_string(t) + " is outside the vocabulary");
    TANDEM_RETURN_IF_ERROR(s.sampling.ValidateForVocab(vocab));
    const int64_t total = static_cast<int64_t>(s.prompt.size()) + s.sampling.max_tokens;
    if (total > options.config.model.max_model_len)
      return TooLarge("prompt + max_tokens exceeds max_model_len " +
                      std::to_string(options.config.model.max_model_len));
    if (BlocksForTokens(s.prompt.size(), options.config.kv_cache.block_size) >
        cache->num_blocks())
      return TooLarge("prompt needs more KV blocks than the instance has");
    return Status();
  }

  void HandleSubmit(Submit& submit) {
    last_submit_seq = std::max(last_submit_seq, submit.seq);  // rejected ones count as seen too
    if (draining) return SendFinish(submit.request_id, Unavailable(name + " is shutting down"), "", 0);
    if (Status s = Validate(submit); !s.ok()) return SendFinish(submit.request_id, s, "", 0);
    auto r = std::make_unique<Request>();
    r->submit = std::move(submit);
    queue.push_back(std::move(r));
  }

  // Frees a held request's blocks (idempotent). `tell_publisher`: drop its lease too.
  void FreeHeld(const std::string& id, const Status& why, bool tell_publisher) {
    auto it = held.find(id);
    if (it == held.end()) return;
    cache->blocks().Free(it->second.blocks);
    held.erase(it);
    if (!why.ok()) {
      TANDEM_LOG_REQ(kInfo, id) << "KV freed: " << why.ToString();
    }
    if (tell_publisher) publisher->Release(id, why);
  }

  void HandleCancel(const std::string& id) {
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if ((*it)->submit.request_id != id) continue;
      cache->blocks().Free((*it)->blocks);
      queue.erase(it);
      SendFinish(id, Cancelled("cancelled"), "", 0);
      return;
    }
    // Handed off: decode owns the Finish; we only stop holding the KV.
    FreeHeld(id, Cancelled("cancelled"), true);
  }

  void HandleClosed(uint64_t conn_id) {
    for (auto it = decode_conns.begin(); it != decode_conns.end(); ++it) {
      if (it->second.first != conn_id) continue;
      decode_conns.erase(it);
      std::vector<std::string> ids;
      for (auto& [id, h] : held)
        if (h.decode_conn == conn_id) ids.push_back(id);
      for (auto& id : ids) FreeHeld(id, Unavailable("decode instance disconnected"), true);
      return;
    }
  }

  void Handle(Event& event) {
    if (auto* m = std::get_if<MessageEvent>(&event)) {
      if (auto* s = std::get_if<Submit>(&m->message)) return HandleSubmit(*s);
      if (auto* c = std::get_if<Cancel>(&m->message)) return HandleCancel(c->request_id);
      if (auto* k = std::get_if<KvReleased>(&m->message)) {
        Status why = k->code == StatusCode::kOk ? Status() : Status(k->code, k->message);
        return FreeHeld(k->request_id, why, true);
      }
      return;
    }
    if (auto* c = std::get_if<ClosedEvent>(&event)) return HandleClosed(c->conn_id);
    if (auto* r = std::get_if<ReleasedEvent>(&event)) return FreeHeld(r->request_id, r->status, false);
  }

  StatusOr<std::pair<uint64_t, ConnPtr>> DecodeConnection(const std::string& address) {
    if (auto it = decode_conns.find(address); it != decode_conns.end()) {
      if (!it->second.second->closed()) return it->second;
      decode_conns.erase(it);
    }
    TANDEM_ASSIGN_OR_RETURN(ConnPtr conn, ConnectControl(io, address, kConnectTimeoutS));
    const uint64_t id = Adopt(conn, /*reply_hello=*/false);
    conn->Send(MakeHello());
    decode_conns[address] = {id, conn};
    return std::pair<uint64_t, ConnPtr>{id, conn};
  }

  // Publishes the request's blocks (every layer) for one pull; returns the descriptor blob.
  StatusOr<std::string> PublishBlocks(const std::string& id, const std::vector<int32_t>& blocks) {
    const KvLayout& layout = cache->layout();
    const std::byte* base = cache->data();
    PublishRanges ranges(layout.num_layers);
    for (int l = 0; l < layout.num_layers; ++l)
      for (int32_t b : blocks) {
        const auto* at = reinterpret_cast<const std::byte*>(cache->BlockData(l, b));
        ranges[l].push_back({static_cast<uint64_t>(at - base), layout.block_bytes()});
      }
    return publisher->Publish(id, ranges, [this](const std::string& request_id, const Status& status) {
      Post(ReleasedEvent{request_id, status});
    });
  }

  // The request's first token is sampled and it continues: publish its KV and tell decode.
  void HandOff(Request& r, const GeneratedToken& first, const SamplingParams& sampling) {
    const std::string id = r.submit.request_id;
    auto fail = [&](const Status& s) {
      handoff_failures->Inc();
      cache->blocks().Free(r.blocks);
      r.blocks.clear();
      SendFinish(id, s, "", 1);
    };
    StatusOr<std::pair<uint64_t, ConnPtr>> conn = DecodeConnection(r.submit.decode_address);
    if (!conn.ok())
      return fail(Unavailable("decode instance " + r.submit.decode_address +
                              " unreachable: " + conn.status().message()));
    StatusOr<std::string> desc = PublishBlocks(id, r.blocks);
    if (!desc.ok()) return fail(desc.status().WithContext("publishing the KV"));
    KvReady ready = Hold(id, std::move(r.blocks), conn->first, std::move(*desc));
    ready.prompt = std::move(r.submit.prompt);
    ready.first_token = first;
    ready.sampling = sampling;
    if (!conn->second->Send(ready))
      FreeHeld(id, Unavailable("decode connection closed"), true);  // decode's Finish is lost too
  }

  // When a hold that starts now expires (prefill.kv_hold_timeout_s).
  Clock::time_point HoldDeadline() const {
    return Clock::now() + std::chrono::milliseconds(
                              static_cast<int64_t>(section->kv_hold_timeout_s * 1000));
  }

  // Holds a published request's blocks for decode (until KvReleased, the transport's release or
  // prefill.kv_hold_timeout_s) and starts its KvReady: id, descriptor and peer info set.
  KvReady Hold(const std::string& id, std::vector<int32_t> blocks, uint64_t decode_conn,
               std::string descriptor) {
    Held h;
    h.blocks = std::move(blocks);
    h.decode_conn = decode_conn;
    h.deadline = HoldDeadline();
    held[id] = std::move(h);
    KvReady ready;
    ready.request_id = id;
    ready.kv_descriptor = std::move(descriptor);
    ready.kv_peer_info = peer_info_blob;
    return ready;
  }

  // Layer-wise: publishes the request's blocks (its last prompt chunk is about to be computed)
  // and sends KvReady with no layer ready and no first token. On success `held` owns the blocks
  // and KvProgress messages follow; on error nothing is held (r.blocks still owns the blocks).
  Status Announce(Request& r) {
    const std::string& id = r.submit.request_id;
    StatusOr<std::pair<uint64_t, ConnPtr>> conn = DecodeConnection(r.submit.decode_address);
    if (!conn.ok())
      return Unavailable("decode instance " + r.submit.decode_address +
                         " unreachable: " + conn.status().message());
    // Decode continues prefill's sampler stream, so an unseeded request gets its seed now.
    if (!r.submit.sampling.seed) r.submit.sampling.seed = RandomId();
    StatusOr<std::string> desc = PublishBlocks(id, r.blocks);
    if (!desc.ok()) return desc.status().WithContext("publishing the KV");
    KvReady ready = Hold(id, r.blocks, conn->first, std::move(*desc));
    ready.prompt = r.submit.prompt;
    ready.layers_ready = 0;
    ready.sampling = r.submit.sampling;
    if (!conn->second->Send(ready)) {
      held.erase(id);  // the blocks stay with the request, freed after the pass
      publisher->Release(id, Unavailable("decode connection closed"));
      return Unavailable("decode connection closed");
    }
    r.announced_to = conn->second;
    return Status();
  }

  // After the pass of an announced request: its first token (or that it ended there) to decode.
  // The blocks stay held until decode's KvReleased or the transport's release either way.
  void FinishAnnounced(Request& r, const GeneratedToken& first, bool finished) {
    r.blocks.clear();  // owned by `held` (or freed already if decode gave up)
    // The hold runs from now, as for a handoff after the pass: a long pass must not eat it.
    if (auto it = held.find(r.submit.request_id); it != held.end())
      it->second.deadline = HoldDeadline();
    KvProgress progress;
    progress.request_id = r.submit.request_id;
    progress.layers_ready = kAllLayersReady;
    progress.first_token = first;
    progress.finished = finished;
    if (!r.announced_to->Send(progress))
      FreeHeld(r.submit.request_id, Unavailable("decode connection closed"), true);
  }

  bool Step() {
    if (queue.empty()) return false;
    const auto t0 = Clock::now();
    items.clear();
    for (auto& r : queue)
      items.push_back({static_cast<int32_t>(r->submit.prompt.size()), r->num_computed,
                       static_cast<int32_t>(r->blocks.size())});
    PrefillLimits limits{section->token_budget, section->max_batch_size,
                         options.config.kv_cache.block_size};
    std::vector<PrefillChunk> batch = SchedulePrefill(items, limits, cache->blocks().num_free());
    if (batch.empty()) return false;
    inputs.clear();
    int64_t tokens = 0;
    for (const PrefillChunk& c : batch) {
      Request& r = *queue[c.index];
      Status alloc = cache->blocks().Allocate(c.new_blocks, &r.blocks);
      TANDEM_CHECK(alloc.ok(), "the scheduler only plans blocks that are free");
      inputs.push_back({std::span<const int32_t>(r.submit.prompt).subspan(r.num_computed, c.num_tokens),
                        r.num_computed, r.blocks});
      tokens += c.num_tokens;
    }
    // Layer-wise: requests whose last chunk is in this pass are announced now, and each layer
    // is announced to their decode instances as soon as the pass has written it.
    std::vector<Request*> announced;
    if (layerwise) {
      for (const PrefillChunk& c : batch) {
        Request& r = *queue[c.index];
        if (r.num_computed + c.num_tokens < static_cast<int32_t>(r.submit.prompt.size())) continue;
        r.announce_error = Announce(r);
        if (r.announce_error.ok()) announced.push_back(&r);
      }
    }
    ForwardHooks hooks;
    if (!announced.empty()) {
      hooks.after_layer = [&announced](int layer) {
        for (Request* r : announced) {
          KvProgress progress;
          progress.request_id = r->submit.request_id;
          progress.layers_ready = layer + 1;
          r->announced_to->Send(progress);  // a closed connection is handled after the pass
        }
      };
    }
    StatusOr<std::span<const float>> logits =
        forward->Forward(inputs, *cache, LogitsMode::kLastToken, announced.empty() ? nullptr : &hooks);
    TANDEM_CHECK(logits.ok(), "forward of a scheduled batch failed: " + logits.status().ToString());
    const size_t vocab = static_cast<size_t>(model->config().vocab_size);
    std::vector<size_t> done;
    for (size_t i = 0; i < batch.size(); ++i) {
      Request& r = *queue[batch[i].index];
      r.num_computed += batch[i].num_tokens;
      if (r.num_computed < static_cast<int32_t>(r.submit.prompt.size())) continue;
      done.push_back(batch[i].index);
      if (!r.announce_error.ok()) {  // as a failed HandOff, before the first token went out
        handoff_failures->Inc();
        cache->blocks().Free(r.blocks);
        r.blocks.clear();
        SendFinish(r.submit.request_id, r.announce_error, "", 0);
        continue;
      }
      Sampler sampler(r.submit.sampling, workspace.get(), r.submit.prompt.size());
      SampleResult sample = sampler.Sample(logits->subspan(i * vocab, vocab), r.submit.prompt);
      GeneratedToken first;
      first.token_id = sample.token_id;
      first.logprob = sample.logprob;
      for (const TokenLogprob& t : sample.top()) first.top_logprobs.push_back({t.token_id, t.logprob});
      Tokens out;
      out.request_id = r.submit.request_id;
      out.tokens.push_back(first);
      if (ConnPtr router = Router()) router->Send(out);
      StopChecker stop(r.submit.sampling, eos_ids);
      StopUpdate update = stop.Append(sample.token_id, "");
      if (r.announced_to) {
        if (update.finished())
          SendFinish(r.submit.request_id, Status(), std::string(FinishReasonName(update.finish_reason)), 1);
        FinishAnnounced(r, first, update.finished());
        continue;
      }
      if (update.finished()) {
        cache->blocks().Free(r.blocks);
        r.blocks.clear();
        SendFinish(r.submit.request_id, Status(), std::string(FinishReasonName(update.finish_reason)), 1);
        continue;
      }
      // Decode continues the same sampler stream: the seed must travel with the request.
      SamplingParams sampling = r.submit.sampling;
      sampling.seed = sampler.seed();
      HandOff(r, first, sampling);
    }
    std::sort(done.begin(), done.end());
    for (auto it = done.rbegin(); it != done.rend(); ++it)
      queue.erase(queue.begin() + static_cast<long>(*it));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    batch_seconds->Observe(seconds);
    const double per_token = seconds / static_cast<double>(tokens);
    avg_s_per_token = avg_s_per_token == 0
                          ? per_token
                          : (1 - kAverageWeight) * avg_s_per_token + kAverageWeight * per_token;
    return true;
  }

  void ExpireHeld() {
    const auto now = Clock::now();
    std::vector<std::string> expired;
    for (auto& [id, h] : held)
      if (now >= h.deadline) expired.push_back(id);
    for (auto& id : expired)
      FreeHeld(id, DeadlineExceeded("KV not pulled within prefill.kv_hold_timeout_s"), true);
  }

  void PublishLoad() {
    LoadReport r;
    r.instance_id = instance_id;
    for (auto& q : queue) r.queued_prefill_tokens += q->submit.prompt.size() - q->num_computed;
    r.waiting_requests = static_cast<int32_t>(queue.size());
    r.running_requests = 0;
    r.free_kv_blocks = cache->blocks().num_free();
    r.total_kv_blocks = cache->num_blocks();
    r.prefill_seconds_per_token = avg_s_per_token;
    r.last_submit_seq = last_submit_seq;
    running_gauge->Set(static_cast<double>(held.size()));
    waiting_gauge->Set(r.waiting_requests);
    usage_gauge->Set(1.0 - static_cast<double>(r.free_kv_blocks) / r.total_kv_blocks);
    std::lock_guard<std::mutex> lock(load_mutex);
    load = r;
  }

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
      ExpireHeld();
      if (stop_engine && ((queue.empty() && held.empty()) || Clock::now() >= drain_deadline)) break;
      worked = Step();
      PublishLoad();
    }
    const Status gone = Unavailable(name + " shut down before the request finished");
    for (auto& r : queue) {
      cache->blocks().Free(r->blocks);
      SendFinish(r->submit.request_id, gone, "", 0);
    }
    queue.clear();
    std::vector<std::string> ids;
    for (auto& [id, h] : held) ids.push_back(id);
    for (auto& id : ids) FreeHeld(id, gone, true);
    PublishLoad();
  }
};

StatusOr<std::unique_ptr<PrefillServer>> PrefillServer::Start(const PrefillOptions& options) {
  const InstanceSection& section = options.config.prefill;
  if (section.port == 0) return InvalidArgument("prefill.port must be set (nonzero)");
  std::unique_ptr<PrefillServer> server(new PrefillServer());
  server->impl_ = std::make_unique<Impl>();
  Impl& impl = *server->impl_;
  impl.options = options;
  impl.section = &impl.options.config.prefill;
  impl.name = "prefill-" + std::to_string(options.index);
  impl.model_name = ServedModelName(options.config.model);
  impl.metrics = std::make_unique<MetricsRegistry>(
      Labels{{"role", "prefill"}, {"model", impl.model_name}});
  MetricsRegistry& m = *impl.metrics;
  impl.running_gauge = &m.AddGauge("tandem_num_requests_running",
                                   "Requests prefilled whose KV is held for decode.").Get();
  impl.waiting_gauge = &m.AddGauge("tandem_num_requests_waiting", "Requests queued for prefill.").Get();
  impl.usage_gauge = &m.AddGauge("tandem_kv_cache_usage_ratio", "Fraction of KV blocks in use.").Get();
  impl.batch_seconds = &m.AddHistogram("tandem_prefill_batch_seconds",
                                       "Wall time of one prefill batch (forward + sampling).", {},
                                       LatencyBuckets()).Get();
  impl.handoff_failures = &m.AddCounter("tandem_kv_handoff_failures_total",
                                        "Requests whose KV could not be handed to decode.").Get();

  TANDEM_ASSIGN_OR_RETURN(std::string dir, ResolveModelDir(options.config.model));
  TANDEM_ASSIGN_OR_RETURN(impl.model, Model::Load(dir));
  for (int id : impl.model->config().eos_token_ids) impl.eos_ids.push_back(id);
  impl.workspace = std::make_unique<SamplerWorkspace>(impl.model->config().vocab_size);
  ForwardOptions fo;
  fo.num_threads = section.threads;
  fo.max_batch_tokens = section.token_budget;
  fo.max_batch_sequences = section.max_batch_size;
  TANDEM_ASSIGN_OR_RETURN(impl.forward, CpuForward::Create(*impl.model, fo));
  const int block_size = options.config.kv_cache.block_size;
  const KvLayout kv_layout = impl.forward->MakeKvLayout(block_size);
  TANDEM_ASSIGN_OR_RETURN(const int kv_blocks, KvPoolBlocks(options.config, section, kv_layout));
  const TransferSection& t = options.config.transfer;
  KvPublishOptions po;
  po.backend = t.backend;
  po.ucx_tls = t.ucx_tls;
  po.timeout_s = t.timeout_s;
  // Our own hold timer fires first; the transport's lease is the backstop.
  po.lease_timeout_s = section.kv_hold_timeout_s + 5;
  po.metrics = impl.metrics.get();
  // The transport provides the pool's memory (UCX-allocated for ucx: shared-memory RMA needs it).
  KvPoolMemory kv_memory;
  TANDEM_ASSIGN_OR_RETURN(impl.publisher,
                          KvPublishLink::CreateWithPool(KvPoolBytes(kv_layout, kv_blocks), po,
                                                        &kv_memory));
  TANDEM_ASSIGN_OR_RETURN(impl.cache, KvCache::Create(kv_layout, kv_blocks, std::move(kv_memory)));
  impl.peer_info_blob = impl.publisher->peer_info_blob();
  impl.layerwise = StreamsLayerwise(t);

  impl.work = std::make_unique<
      boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>(
      impl.io.get_executor());
  TANDEM_ASSIGN_OR_RETURN(
      impl.listener,
      ControlListener::Listen(impl.io, "127.0.0.1", section.port + options.index,
                              [&impl](ConnPtr c) { impl.Adopt(c, /*reply_hello=*/true); }));
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
                    << impl.listener->port() << " (" << kv_blocks << " KV blocks of "
                    << block_size << " tokens, transfer " << t.backend << ")";
  return server;
}

int PrefillServer::control_port() const { return impl_->listener->port(); }

PrefillServer::~PrefillServer() { Stop(); }

void PrefillServer::Stop() {
  if (!impl_ || impl_->stopped) return;
  Impl& impl = *impl_;
  impl.stopped = true;
  impl.draining = true;
  impl.drain_deadline = Clock::now() + std::chrono::milliseconds(
                                           static_cast<int64_t>(impl.options.drain_timeout_s * 1000));
  impl.stop_engine = true;
  impl.inbox_cv.notify_one();
  if (impl.engine_thread.joinable()) impl.engine_thread.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the last frames leave
  if (impl.http) impl.http->Stop();
  boost::asio::post(impl.io, [&impl] {
    impl.report_timer->cancel();
    impl.listener->Stop();
    impl.connections.CloseAll();
  });
  impl.work.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  impl.io.stop();
  for (auto& th : impl.io_threads) th.join();
  impl.io_threads.clear();
  impl.publisher.reset();
}

int PrefillMain(const std::vector<std::string>& args) {
  FlagParser flags("tandem prefill --config FILE --index I [--SECTION.KEY=VALUE ...]",
                   "Runs a prefill instance: batches prompts, streams the first token, hands the "
                   "KV to a decode instance.");
  flags.AddString("config", "", "cluster YAML (absent: defaults)");
  flags.AddInt("index", 0, "instance index: ports are prefill.port + index");
  flags.AddDouble("drain-timeout-s", 30, "on SIGTERM, wait at most this long for in-flight requests");
  flags.AllowConfigOverrides();
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "tandem prefill: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  StatusOr<ClusterConfig> config =
      LoadServingConfig(flags.GetString("config"), flags.config_overrides());
  if (!config.ok()) {
    std::fprintf(stderr, "tandem prefill: %s\n", config.status().message().c_str());
    return kExitFailure;
  }
  if (auto level = ParseLogLevel(config->logging.level); level.ok()) SetLogLevel(*level);
  if (auto format = ParseLogFormat(config->logging.format); format.ok()) SetLogFormat(*format);
  PrefillOptions options;
  options.config = std::move(*config);
  options.index = static_cast<int>(flags.GetInt("index"));
  options.drain_timeout_s = flags.GetDouble("drain-timeout-s");
  SetLogRole("prefill-" + std::to_string(options.index));

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // inherited by every thread started below
  StatusOr<std::unique_ptr<PrefillServer>> server = PrefillServer::Start(options);
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

}  // namespace tandem
