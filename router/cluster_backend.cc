#include "router/cluster_backend.h"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <utility>

#include "common/base/log.h"

namespace tandem {

namespace {

std::string SectionName(InstanceRole role) {
  switch (role) {
    case InstanceRole::kPrefill: return "prefill";
    case InstanceRole::kDecode: return "decode";
    case InstanceRole::kColocated: return "colocated";
    case InstanceRole::kRouter: return "router";
  }
  return "?";
}

double SecondsSince(std::chrono::steady_clock::time_point t, std::chrono::steady_clock::time_point now) {
  return std::chrono::duration<double>(now - t).count();
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
  std::filesystem::path path(name);
  std::error_code ec;
  if (path.is_relative() && !config.source.empty() && config.source[0] != '<' &&
      std::filesystem::exists(config.source, ec))
    path = std::filesystem::path(config.source).parent_path() / path;
  StatusOr<LatencyModelFile> file = LoadLatencyModel(path.string());
  if (!file.ok()) return file.status().WithContext("router.latency_model");
  out.file = std::make_shared<const LatencyModelFile>(std::move(*file));
  auto pick = [&](const InstanceSection& s, const char* section,
                  const LatencyModel** entry) -> Status {
    if (s.instances <= 0) return Status::Ok();
    *entry = out.file->ForInstance(s.device, s.threads, s.tensor_parallel, s.pipeline_parallel,
                                   section);
    if (*entry == nullptr)
      return InvalidArgument(path.string() + ": router.latency_model has no entry for " +
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
    TANDEM_LOG(kInfo) << "latency model " << path.string() << ": " << section << " uses the entry ("
                      << Describe(*entry) << "): prefill c1=" << entry->c1 << " c2=" << entry->c2
                      << " c3=" << entry->c3 << ", decode c4=" << entry->c4 << " c5=" << entry->c5
                      << " c6=" << entry->c6;
    if (entry->model != served) {
      TANDEM_LOG(kWarn) << "latency model " << path.string() << ": the " << section
                        << " entry was measured with model '" << entry->model
                        << "', this cluster serves '" << served << "'";
    }
  }
  return out;
}

struct ClusterBackend::Instance {
  std::string name;
  std::string address;
  InstanceRole role = InstanceRole::kPrefill;
  std::shared_ptr<ControlConnection> connection;
  uint64_t generation = 0;  // bumps per connection, so late handlers of an old one are ignored
  bool connecting = false;
  bool greeted = false;
  bool ever_greeted = false;
  Hello hello;
  LoadReport load;  // the latest report plus what this router submitted that it lacks
  // Requests this router sent here that the latest report did not include yet (a report lags:
  // a server computes it after each engine step, and takes in new requests only between
  // steps). Without them every report would erase the count of what was just submitted, and
  // during a multi-second prefill batch the router would keep placing onto a queue that looks
  // empty. First instance: Submits with seq > the report's last_submit_seq. Decode instance:
  // requests whose prefill has not finished (decode learns of them from prefill's KvReady,
  // at about the time the router sees the first token).
  struct Pending {
    uint64_t seq = 0;  // Submit::seq; 0 for decode entries
    std::string request_id;
    int64_t prompt_tokens = 0;
  };
  uint64_t next_submit_seq = 1;
  std::deque<Pending> unseen_submits;
  std::vector<Pending> incoming_handoffs;
  Clock::time_point connected_at;
  Clock::time_point last_heard;
  Clock::time_point next_attempt;
  double backoff_s = 0;
  std::string close_reason;  // set when the router closes it on purpose
  // Decode/colocated: the residents arriving requests found here lately (router/placement.h).
  ResidentAverage typical;
};

struct ClusterBackend::Request {
  std::string id;
  std::function<void(BackendEvent)> on_event;
  int prefill = -1;
  int decode = -1;
  int colocated = -1;
  uint64_t placed_order = 0;  // the router's count of Submit calls when it was placed
  int64_t prompt_tokens = 0;
  int32_t max_tokens = 0;
  int32_t generated = 0;        // tokens received from any of its instances
  bool first_token = false;     // prefill's first token reached the router
  bool decode_started = false;  // decode sent something
  bool finished = false;        // the final event is queued
  bool cancelled = false;
  Clock::time_point cancelled_at;
  Clock::time_point prefill_lost_at;  // prefill went away after the first token
  bool prefill_lost = false;
  // Decode's events that overtook prefill's first token, and whether the last one is final.
  std::deque<BackendEvent> held_back;
  bool held_final = false;
  // Delivery: events queued under the backend's mutex, delivered by one thread at a time.
  std::deque<BackendEvent> queue;
  bool delivering = false;
};

ClusterBackend::ClusterBackend(const ClusterConfig& config, ClusterBackendOptions options)
    : options_(std::move(options)), work_(io_.get_executor()), slo_(config.slo), config_(config) {
  auto add = [&](const InstanceSection& section, InstanceRole role, std::vector<int>* ids) {
    for (int i = 0; i < section.instances; ++i) {
      auto instance = std::make_unique<Instance>();
      instance->role = role;
      instance->name = SectionName(role) + "-" + std::to_string(i);
      instance->address = options_.host + ":" + std::to_string(section.port + i);
      instance->backoff_s = options_.backoff_initial_s;
      ids->push_back(static_cast<int>(instances_.size()));
      instances_.push_back(std::move(instance));
    }
  };
  add(config.prefill, InstanceRole::kPrefill, &prefill_);
  add(config.decode, InstanceRole::kDecode, &decode_);
  add(config.colocated, InstanceRole::kColocated, &colocated_);
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
  }
}

ClusterBackend::~ClusterBackend() { Stop(); }

Status ClusterBackend::Start() {
  StatusOr<PlacementPolicy> policy = ParsePlacementPolicy(config_.router.policy);
  if (!policy.ok()) return policy.status();
  if (instances_.empty())
    return InvalidArgument(config_.source + ": no instances configured (prefill, decode or "
                                            "colocated instances must be > 0)");
  if ((prefill_.empty()) != (decode_.empty()) && colocated_.empty())
    return InvalidArgument(config_.source + ": prefill and decode instances come in pairs: " +
                           std::to_string(prefill_.size()) + " prefill, " +
                           std::to_string(decode_.size()) + " decode");
  for (const InstanceSection* s : {&config_.prefill, &config_.decode, &config_.colocated}) {
    if (s->instances > 0 && s->port <= 0)
      return InvalidArgument(config_.source + ": an instance section has port 0; the router " +
                             "needs the instances' control ports (tandem up picks them)");
  }
  StatusOr<RouterLatencyModels> latency = LoadRouterLatencyModels(config_);
  if (!latency.ok()) return latency.status();
  std::lock_guard<std::mutex> lock(mutex_);
  if (started_) return FailedPrecondition("ClusterBackend already started");
  policy_ = *policy;
  latency_ = std::move(*latency);
  started_ = true;
  for (int i = 0; i < std::max(options_.io_threads, 1); ++i)
    io_threads_.emplace_back([this] { io_.run(); });
  monitor_ = std::thread([this] { MonitorLoop(); });
  TANDEM_LOG(kInfo) << "cluster backend: " << prefill_.size() << " prefill, " << decode_.size()
                    << " decode, " << colocated_.size() << " colocated instance(s), policy "
                    << PlacementPolicyName(policy_);
  return Status::Ok();
}

void ClusterBackend::Stop() {
  std::vector<std::shared_ptr<Request>> to_drain;
  std::vector<std::shared_ptr<ControlConnection>> connections;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    std::vector<std::shared_ptr<Request>> all;
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
  std::lock_guard<std::mutex> lock(mutex_);
  policy_ = *policy;
  slo_ = config.slo;
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
  TANDEM_LOG(kInfo) << "config reloaded: policy " << PlacementPolicyName(policy_) << ", SLO ttft "
                    << slo_.ttft_s << " s, tpot " << slo_.tpot_s << " s, "
                    << slo_.classes.size() << " class(es)";
  return Status::Ok();
}

bool ClusterBackend::UsableLocked(const Instance& instance, Clock::time_point now) const {
  return instance.connection && instance.greeted &&
         SecondsSince(instance.last_heard, now) <= options_.heartbeat_timeout_s;
}

bool ClusterBackend::Ready() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!started_ || stopping_) return false;
  Clock::time_point now = Clock::now();
  auto any = [&](const std::vector<int>& ids) {
    return std::any_of(ids.begin(), ids.end(),
                       [&](int i) { return UsableLocked(*instances_[i], now); });
  };
  return (any(prefill_) && any(decode_)) || any(colocated_);
}

std::vector<InstanceStatus> ClusterBackend::Instances() const {
  std::lock_guard<std::mutex> lock(mutex_);
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
    for (auto& [id, r] : requests_) {
      int index = static_cast<int>(i);
      if ((r->prefill == index && !r->first_token) || r->decode == index ||
          r->colocated == index)
        ++s.requests;
    }
    out.push_back(std::move(s));
  }
  return out;
}

int ClusterBackend::InFlight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(requests_.size());
}

// What a request adds to an instance's load until a report includes it (router/placement.h).
void ClusterBackend::AddSubmit(Instance& instance, int64_t prompt_tokens) {
  AddUnreportedSubmit(instance.load, prompt_tokens, instance.role == InstanceRole::kColocated);
}

void ClusterBackend::AddHandoff(Instance& instance, int64_t prompt_tokens) {
  AddUnreportedHandoff(instance.load, prompt_tokens, instance.hello.kv_block_size);
}

void ClusterBackend::ApplyReportLocked(Instance& instance, const LoadReport& report) {
  instance.load = report;
  auto gone = [this](const Instance::Pending& p) {
    auto it = requests_.find(p.request_id);
    return it == requests_.end() || it->second->finished;
  };
  std::erase_if(instance.unseen_submits, [&](const Instance::Pending& p) {
    return p.seq <= report.last_submit_seq || gone(p);
  });
  for (const Instance::Pending& p : instance.unseen_submits) AddSubmit(instance, p.prompt_tokens);
  std::erase_if(instance.incoming_handoffs, [&](const Instance::Pending& p) {
    return gone(p) || requests_.at(p.request_id)->first_token;
  });
  for (const Instance::Pending& p : instance.incoming_handoffs) AddHandoff(instance, p.prompt_tokens);
}

Status ClusterBackend::Submit(const GenerateRequest& request,
                              std::function<void(BackendEvent)> on_event) {
  std::shared_ptr<Request> entry;
  std::shared_ptr<ControlConnection> target;
  std::string target_name;
  tandem::Submit message;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!started_ || stopping_) return Unavailable("the router is not running");
    if (requests_.count(request.request_id))
      return InvalidArgument("duplicate request id " + request.request_id);
    Clock::time_point now = Clock::now();
    // The requests each decode/colocated instance holds, in the order they were placed, for
    // TPOT predictions over a life (goodput is the only policy that reads them).
    const bool goodput = policy_ == PlacementPolicy::kGoodput;
    std::vector<std::vector<DecodeResident>> residents;
    if (goodput) {
      std::vector<std::vector<std::pair<uint64_t, DecodeResident>>> held(instances_.size());
      for (const auto& [id, r] : requests_) {
        int at = r->decode >= 0 ? r->decode : r->colocated;
        if (at < 0 || r->finished) continue;
        held[at].push_back(
            {r->placed_order, ResidentOf(r->prompt_tokens, r->max_tokens, r->generated)});
      }
      residents.resize(instances_.size());
      for (size_t i = 0; i < held.size(); ++i) {
        std::sort(held[i].begin(), held[i].end(),
                  [](const auto& a, const auto& b) { return a.first < b.first; });
        for (const auto& [order, resident] : held[i]) residents[i].push_back(resident);
      }
    }
    auto snapshot = [&](const std::vector<int>& ids, const LatencyModel* lm, int budget) {
      std::vector<InstanceLoad> out;
      for (int i : ids) {
        Instance& x = *instances_[i];
        InstanceLoad load;
        load.name = x.name;
        load.usable = UsableLocked(x, now);
        load.load = x.load;
        load.kv_block_size = x.hello.kv_block_size;
        load.latency_model = lm;  // latency_ outlives Place(): both under mutex_
        load.token_budget = budget;
        if (goodput && x.role != InstanceRole::kPrefill) {
          // Every request the router is asked to place samples every instance.
          x.typical.Observe(residents[i], request.sampling.max_tokens);
          load.residents_known = true;
          load.residents = std::move(residents[i]);
          load.typical = x.typical;
        }
        out.push_back(std::move(load));
      }
      return out;
    };
    std::vector<InstanceLoad> p = snapshot(prefill_, latency_.prefill, config_.prefill.token_budget),
                              d = snapshot(decode_, latency_.decode, config_.decode.token_budget),
                              c = snapshot(colocated_, latency_.colocated,
                                           config_.colocated.token_budget);
    PlacementInput input;
    input.prefill = &p;
    input.decode = &d;
    input.colocated = &c;
    input.prompt_tokens = static_cast<int64_t>(request.prompt_token_ids.size());
    input.max_tokens = request.sampling.max_tokens;
    input.slo = SloForClass(slo_, request.slo_class);
    input.round_robin = round_robin_++;
    StatusOr<Placement> placement = Place(policy_, input);
    if (!placement.ok()) {
      if (placements_)
        placements_
            ->WithLabels({placement.status().code() == StatusCode::kResourceExhausted
                              ? "rejected"
                              : "unavailable"})
            .Inc();
      TANDEM_LOG_REQ(kDebug, request.request_id) << "not placed: " << placement.status().message();
      return placement.status();
    }
    if (placements_) placements_->WithLabels({"placed"}).Inc();

    entry = std::make_shared<Request>();
    entry->id = request.request_id;
    entry->on_event = std::move(on_event);
    entry->placed_order = input.round_robin;
    entry->prompt_tokens = input.prompt_tokens;
    entry->max_tokens = request.sampling.max_tokens;
    message.request_id = request.request_id;
    message.prompt = request.prompt_token_ids;
    message.sampling = request.sampling;
    message.sampling.stop.clear();  // stop strings are the router's business
    Instance* first = nullptr;
    if (placement->colocated >= 0) {
      entry->colocated = colocated_[placement->colocated];
      first = instances_[entry->colocated].get();
    } else {
      entry->prefill = prefill_[placement->prefill];
      entry->decode = decode_[placement->decode];
      first = instances_[entry->prefill].get();
      Instance& d_instance = *instances_[entry->decode];
      message.decode_address = d_instance.hello.control_address.empty()
                                   ? d_instance.address
                                   : d_instance.hello.control_address;
      // Until a report includes it, count what this router just gave the decode instance.
      AddHandoff(d_instance, input.prompt_tokens);
      d_instance.incoming_handoffs.push_back({0, entry->id, input.prompt_tokens});
    }
    message.seq = first->next_submit_seq++;
    AddSubmit(*first, input.prompt_tokens);
    first->unseen_submits.push_back({message.seq, entry->id, input.prompt_tokens});
    target = first->connection;
    target_name = first->name;
    requests_[entry->id] = entry;
    TANDEM_LOG_REQ(kDebug, entry->id)
        << "placed on " << target_name
        << (entry->decode >= 0 ? " -> " + instances_[entry->decode]->name : std::string())
        << " (predicted ttft " << placement->predicted_ttft_s << " s, tpot "
        << placement->predicted_tpot_s << " s)";
  }
  if (target && target->Send(message)) return Status::Ok();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = requests_.find(entry->id);
  if (it == requests_.end() || it->second != entry) return Status::Ok();  // failed by a callback
  requests_.erase(it);
  return Unavailable(target_name + " went away before the request could be sent");
}

void ClusterBackend::SendCancelLocked(int instance, const std::string& request_id) {
  if (instance < 0) return;
  const auto& connection = instances_[instance]->connection;
  if (connection) connection->Send(tandem::Cancel{request_id});
}

void ClusterBackend::Cancel(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  if (r.cancelled || r.finished) return;
  r.cancelled = true;
  r.cancelled_at = Clock::now();
  // Both sides: the request may be in flight between them.
  SendCancelLocked(r.prefill, request_id);
  SendCancelLocked(r.decode, request_id);
  SendCancelLocked(r.colocated, request_id);
}

void ClusterBackend::FailLocked(const std::shared_ptr<Request>& request, const Status& error,
                                std::vector<std::shared_ptr<Request>>* to_drain) {
  if (request->finished) return;
  request->finished = true;
  request->held_back.clear();
  BackendEvent event;
  event.error = error;
  request->queue.push_back(std::move(event));
  auto it = requests_.find(request->id);
  if (it != requests_.end() && it->second == request) requests_.erase(it);
  to_drain->push_back(request);
}

void ClusterBackend::Drain(const std::shared_ptr<Request>& request) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!request->delivering && !request->queue.empty()) {
    request->delivering = true;
    BackendEvent event = std::move(request->queue.front());
    request->queue.pop_front();
    bool final = event.finish_reason.has_value() || !event.error.ok();
    std::function<void(BackendEvent)> callback = request->on_event;
    if (final) request->on_event = nullptr;  // release the caller's state after the end
    lock.unlock();
    if (callback) callback(std::move(event));
    lock.lock();
    request->delivering = false;
  }
}

void ClusterBackend::OnTokens(size_t index, Tokens tokens) {
  std::shared_ptr<Request> request;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = requests_.find(tokens.request_id);
    if (it == requests_.end()) return;  // finished, failed or cancelled already
    request = it->second;
    BackendEvent event;
    for (GeneratedToken& t : tokens.tokens)
      event.tokens.push_back(GeneratedToken{t.token_id, t.logprob, std::move(t.top_logprobs)});
    int from = static_cast<int>(index);
    if (from == request->prefill || from == request->decode || from == request->colocated)
      request->generated += static_cast<int32_t>(event.tokens.size());
    if (from == request->prefill) {
      request->queue.push_back(std::move(event));
      if (!request->first_token) {
        request->first_token = true;
        instances_[from]->load.waiting_requests =
            std::max(instances_[from]->load.waiting_requests - 1, 0);
        for (auto& held : request->held_back) request->queue.push_back(std::move(held));
        request->held_back.clear();
        if (request->held_final) {
          request->finished = true;
          requests_.erase(request->id);
        }
      }
    } else if (from == request->decode) {
      request->decode_started = true;
      if (request->first_token) {
        request->queue.push_back(std::move(event));
      } else {
        request->held_back.push_back(std::move(event));
      }
    } else if (from == request->colocated) {
      request->queue.push_back(std::move(event));
    } else {
      return;  // not from an instance of this request
    }
  }
  Drain(request);
}

void ClusterBackend::OnFinish(size_t index, Finish finish) {
  std::shared_ptr<Request> request;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = requests_.find(finish.request_id);
    if (it == requests_.end()) return;
    request = it->second;
    int from = static_cast<int>(index);
    if (from != request->prefill && from != request->decode && from != request->colocated)
      return;
    BackendEvent event;
    if (finish.code == StatusCode::kOk) {
      event.finish_reason = finish.finish_reason.empty() ? "stop" : finish.finish_reason;
    } else {
      event.error = Status(finish.code, instances_[from]->name + ": " + finish.message);
    }
    if (from == request->decode && !request->first_token && finish.code == StatusCode::kOk) {
      request->held_back.push_back(std::move(event));
      request->held_final = true;
      return;
    }
    if (from == request->decode) request->decode_started = true;
    request->finished = true;
    request->held_back.clear();
    request->queue.push_back(std::move(event));
    requests_.erase(it);
  }
  Drain(request);
}

void ClusterBackend::OnMessage(size_t index, uint64_t generation, ControlMessage message) {
  if (auto* tokens = std::get_if<Tokens>(&message)) return OnTokens(index, std::move(*tokens));
  if (auto* finish = std::get_if<Finish>(&message)) return OnFinish(index, std::move(*finish));
  std::shared_ptr<ControlConnection> to_close;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Instance& instance = *instances_[index];
    if (generation != instance.generation || !instance.connection) return;
    Clock::time_point now = Clock::now();
    if (auto* hello = std::get_if<Hello>(&message)) {
      if (hello->role != instance.role) {
        instance.close_reason = std::string("it says it is a ") + InstanceRoleName(hello->role) +
                                " instance, the config says " + InstanceRoleName(instance.role);
        to_close = instance.connection;
      } else {
        instance.hello = *hello;
        instance.greeted = true;
        instance.ever_greeted = true;
        instance.last_heard = now;
        instance.load = LoadReport{};
        instance.typical = ResidentAverage{};  // a new incarnation holds none of the old requests
        instance.unseen_submits.clear();  // a new incarnation: the old one's requests failed
        instance.incoming_handoffs.clear();
        instance.backoff_s = options_.backoff_initial_s;
        TANDEM_LOG(kInfo) << "instance " << instance.name << " up at " << instance.address
                          << " (" << hello->name << ", model " << hello->model << ", "
                          << hello->kv_total_blocks << " KV blocks)";
      }
    } else if (auto* report = std::get_if<LoadReport>(&message)) {
      ApplyReportLocked(instance, *report);
      instance.last_heard = now;
      const LatencyModel* lm = instance.role == InstanceRole::kDecode      ? latency_.decode
                               : instance.role == InstanceRole::kColocated ? latency_.colocated
                                                                           : nullptr;
      if (decode_model_correction_ != nullptr && lm != nullptr && report->decode_step_batch > 0) {
        InstanceLoad x;
        x.load = *report;
        x.latency_model = lm;
        decode_model_correction_->WithLabels({instance.name}).Set(DecodeModelCorrection(x));
      }
    } else {
      TANDEM_LOG(kDebug) << "ignoring an unexpected control message from " << instance.name;
    }
  }
  if (to_close) to_close->Close();
}

void ClusterBackend::OnClosed(size_t index, uint64_t generation, const Status& reason) {
  std::vector<std::shared_ptr<Request>> to_drain;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Instance& instance = *instances_[index];
    if (generation != instance.generation) return;
    instance.connection.reset();
    bool was_greeted = instance.greeted;
    instance.greeted = false;
    std::string why = instance.close_reason.empty() ? reason.message() : instance.close_reason;
    instance.close_reason.clear();
    instance.next_attempt = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(instance.backoff_s));
    if (stopping_) return;
    if (instance_failures_) instance_failures_->WithLabels({instance.name}).Inc();
    if (was_greeted) {
      TANDEM_LOG(kWarn) << "instance " << instance.name << " at " << instance.address
                        << " is down: " << why;
    }
    int me = static_cast<int>(index);
    std::vector<std::shared_ptr<Request>> held;
    for (auto& [id, r] : requests_) {
      if ((r->prefill == me && !r->first_token) || r->decode == me || r->colocated == me) {
        held.push_back(r);
      } else if (r->prefill == me && !r->prefill_lost) {
        r->prefill_lost = true;  // decode has it (or its pull will fail and say so)
        r->prefill_lost_at = Clock::now();
      }
    }
    for (auto& r : held) {
      SendCancelLocked(r->prefill == me ? r->decode : r->prefill, r->id);
      FailLocked(r,
                 Unavailable(instance.name + " (" + instance.address +
                             ") went away while serving the request: " + why),
                 &to_drain);
    }
    if (!held.empty()) {
      TANDEM_LOG(kWarn) << "failed " << held.size() << " request(s) held by " << instance.name;
    }
  }
  for (auto& request : to_drain) Drain(request);
}

void ClusterBackend::TryConnect(size_t index) {
  std::string address;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    address = instances_[index]->address;
  }
  StatusOr<std::shared_ptr<ControlConnection>> connection =
      ConnectControl(io_, address, options_.connect_timeout_s);
  std::lock_guard<std::mutex> lock(mutex_);
  Instance& instance = *instances_[index];
  instance.connecting = false;
  Clock::time_point now = Clock::now();
  if (!connection.ok() || stopping_) {
    if (connection.ok()) (*connection)->Close();
    instance.next_attempt = now + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(instance.backoff_s));
    instance.backoff_s = std::min(instance.backoff_s * 2, options_.backoff_max_s);
    TANDEM_LOG(kDebug) << "connecting to " << instance.name << ": "
                       << connection.status().message();
    return;
  }
  uint64_t generation = ++instance.generation;
  instance.connection = *connection;
  instance.connected_at = now;
  instance.greeted = false;
  instance.backoff_s = std::min(instance.backoff_s * 2, options_.backoff_max_s);
  (*connection)
      ->Start([this, index, generation](
                  ControlMessage m) { OnMessage(index, generation, std::move(m)); },
              [this, index, generation](const Status& s) { OnClosed(index, generation, s); });
  Hello hello;
  hello.role = InstanceRole::kRouter;
  hello.name = "router";
  (*connection)->Send(hello);
}

void ClusterBackend::MonitorLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    Clock::time_point now = Clock::now();
    std::vector<std::shared_ptr<ControlConnection>> to_close;
    std::vector<std::shared_ptr<Request>> to_drain;
    std::vector<size_t> to_connect;
    for (size_t i = 0; i < instances_.size(); ++i) {
      Instance& x = *instances_[i];
      if (!x.connection && !x.connecting && now >= x.next_attempt) {
        x.connecting = true;
        to_connect.push_back(i);
      } else if (x.connection && x.close_reason.empty()) {
        double silent = SecondsSince(x.greeted ? x.last_heard : x.connected_at, now);
        double limit = x.greeted ? options_.heartbeat_timeout_s
                                 : std::max(2.0, options_.heartbeat_timeout_s);
        if (silent > limit) {
          x.close_reason = x.greeted ? "no heartbeat for " + std::to_string(silent) + " s"
                                     : "no Hello within " + std::to_string(silent) + " s";
          to_close.push_back(x.connection);
        }
      }
    }
    std::vector<std::shared_ptr<Request>> expired;
    for (auto& [id, r] : requests_) {
      if (r->cancelled && SecondsSince(r->cancelled_at, now) > options_.cancel_grace_s)
        expired.push_back(r);
      else if (r->prefill_lost && !r->decode_started &&
               SecondsSince(r->prefill_lost_at, now) > 10.0)
        expired.push_back(r);
    }
    for (auto& r : expired) {
      if (!r->cancelled) SendCancelLocked(r->decode, r->id);
      FailLocked(r,
                 r->cancelled ? Cancelled("cancelled; no instance confirmed it")
                              : Unavailable("the prefill instance went away and the decode "
                                            "instance never continued the request"),
                 &to_drain);
    }
    if (instances_up_) {
      int up[4] = {0, 0, 0, 0};
      for (auto& x : instances_) up[static_cast<int>(x->role)] += UsableLocked(*x, now);
      instances_up_->WithLabels({"prefill"}).Set(up[1]);
      instances_up_->WithLabels({"decode"}).Set(up[2]);
      instances_up_->WithLabels({"colocated"}).Set(up[3]);
    }
    lock.unlock();
    for (auto& c : to_close) c->Close();
    for (auto& r : to_drain) Drain(r);
    for (size_t i : to_connect) TryConnect(i);
    lock.lock();
    monitor_cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stopping_; });
  }
}

}  // namespace tandem
