#include "router/router_service.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <chrono>
#include <optional>
#include <utility>

#include "common/base/log.h"
#include "common/base/thread_annotations.h"
#include "router/errors.h"

namespace tandem {

using Clock = std::chrono::steady_clock;

constexpr char kSloClassHeader[] = "x-tandem-slo-class";

struct RouterShared {
  RouterShared(ServedModel m, Backend* b, RouterServiceOptions o)
      : model(std::move(m)), backend(b), options(o) {
    if (!options.metrics) {
      owned_metrics =
          std::make_unique<MetricsRegistry>(Labels{{"role", "router"}, {"model", model.name}});
      options.metrics = owned_metrics.get();
    }
    MetricsRegistry& r = *options.metrics;
    // Latency by SLO class (slo_class="default" without the header), so that each class's
    // quantiles compare with its own tandem_router_slo_target_seconds line.
    ttft = &r.AddHistogram("tandem_time_to_first_token_seconds",
                           "Time from request arrival to the first output token.", {"slo_class"},
                           LatencyBuckets());
    tpot = &r.AddHistogram("tandem_time_per_output_token_seconds",
                           "Mean time between output tokens of a request, after the first.",
                           {"slo_class"}, LatencyBuckets());
    e2e = &r.AddHistogram("tandem_e2e_request_latency_seconds",
                          "Time from request arrival to its last token.", {"slo_class"},
                          LatencyBuckets());
    // The default class's series exist from the start (0 until a request finishes).
    for (Family<Histogram>* h : {ttft, tpot, e2e}) h->WithLabels({"default"});
    success = &r.AddCounter("tandem_request_success_total", "Requests that completed.",
                            {"finish_reason"});
    failure = &r.AddCounter("tandem_request_failure_total",
                            "Requests that ended in an error, by HTTP status.", {"code"});
    running_gauge = &r.AddGauge("tandem_num_requests_running",
                                "Requests admitted by the router and not finished.")
                         .Get();
    prompt_tokens = &r.AddCounter("tandem_prompt_tokens_total", "Prompt tokens admitted.").Get();
    generation_tokens =
        &r.AddCounter("tandem_generation_tokens_total", "Output tokens received.").Get();
    unauthorized = &r.AddCounter("tandem_router_unauthorized_requests_total",
                                 "Requests refused with 401: no API key, or a wrong one.",
                                 {"reason"});
    slo_requests = &r.AddCounter(
        "tandem_router_slo_requests_total",
        "Requests judged against their SLO class's objectives: attained (completed within TTFT "
        "and TPOT), missed (completed, over one), rejected (refused at admission), failed "
        "(an error after admission). Goodput is the rate of attained.",
        {"slo_class", "result"});
  }

  void RecordFailure(int http_status) {
    failure->WithLabels({std::to_string(http_status)}).Inc();
  }

  // The slo_class label value of a request's x-tandem-slo-class ("" = "default").
  static std::string SloClassLabel(const std::string& slo_class) {
    return slo_class.empty() ? "default" : slo_class;
  }

  // Counts a request of `slo_class` with `result` when the backend judges SLOs.
  void RecordSlo(const std::string& slo_class, const char* result) {
    if (!backend->SloOf(slo_class)) return;
    slo_requests->WithLabels({SloClassLabel(slo_class), result}).Inc();
  }

  ServedModel model;
  Backend* backend;
  RouterServiceOptions options;
  std::unique_ptr<MetricsRegistry> owned_metrics;
  std::atomic<int> running{0};

  Family<Histogram>* ttft;  // these three by slo_class
  Family<Histogram>* tpot;
  Family<Histogram>* e2e;
  Family<Counter>* success;
  Family<Counter>* failure;
  Gauge* running_gauge;
  Counter* prompt_tokens;
  Counter* generation_tokens;
  Family<Counter>* slo_requests;  // tandem_router_slo_requests_total
  Family<Counter>* unauthorized;
};

namespace {

void RespondError(HttpExchange& exchange, const Status& status, const std::string& param) {
  HttpError error = ErrorResponse(status, param);
  HttpResponse response{error.http_status, "application/json", error.body, {}};
  if (error.retry_after_s) {
    response.headers.emplace_back("Retry-After", std::to_string(*error.retry_after_s));
  }
  exchange.Respond(std::move(response));
}

// Wraps `handler` so that it runs only for a request that carries an API key (when there are
// keys). The check reads one header on the io thread: a request without a key costs no parse,
// no tokenization and no worker.
HttpHandler RequireApiKey(const std::shared_ptr<RouterShared>& shared, HttpHandler handler) {
  const ApiKeys* keys = shared->options.api_keys.get();
  if (keys == nullptr || keys->empty()) return handler;
  return [shared, handler = std::move(handler)](std::shared_ptr<HttpExchange> exchange) {
    ApiKeyCheck check =
        shared->options.api_keys->Check(exchange->request().Header("authorization"));
    if (check == ApiKeyCheck::kOk) {
      handler(std::move(exchange));
      return;
    }
    const bool key_given = check == ApiKeyCheck::kInvalid;
    shared->unauthorized->WithLabels({key_given ? "invalid" : "missing"}).Inc();
    HttpError error = UnauthorizedError(key_given);
    exchange->Respond(HttpResponse{error.http_status, "application/json", error.body,
                                   {{"WWW-Authenticate", "Bearer"}}});
  };
}

// One admitted request, from Submit to its end: its n choices, each a backend request of its
// own (ChoiceRequest), detokenized and stop-checked here. The response ends when every choice
// has finished; an error in one choice fails the request and cancels the others. Shared by the
// backend callbacks (strong) and the HTTP abort callback (weak).
class RequestContext : public std::enable_shared_from_this<RequestContext> {
 public:
  RequestContext(std::shared_ptr<RouterShared> shared, std::shared_ptr<HttpExchange> exchange,
                 ApiRequest request)
      : shared_(std::move(shared)),
        exchange_(std::move(exchange)),
        request_(std::move(request)),
        choice_requests_(MakeChoiceRequests(request_)) {
    choices_.reserve(choice_requests_.size());
    for (const GenerateRequest& r : choice_requests_) {
      choices_.emplace_back(r.sampling, shared_->model, request_.skip_special_tokens);
    }
  }

  const ApiRequest& request() const { return request_; }
  const std::string& id() const { return request_.generate.request_id; }
  int num_choices() const { return request_.n; }
  // Choice i's backend request, in [0, num_choices()).
  const GenerateRequest& choice_request(int i) const { return choice_requests_[i]; }

  // Called once Submit accepted every choice: sends the stream headers promptly.
  void OnSubmitted() {
    MutexLock lock(&mutex_);
    if (!done_) EnsureStreamStartedLocked();
  }

  // Submit rejected a choice: choices [0, submitted) were accepted and are cancelled; no
  // other callback will come.
  void OnRejected(const Status& status, int submitted) {
    {
      MutexLock lock(&mutex_);
      if (done_) return;
      MarkDoneLocked();
    }
    for (int i = 0; i < submitted; ++i) shared_->backend->Cancel(choice_requests_[i].request_id);
    shared_->RecordFailure(HttpStatusFor(status.code()));
    shared_->RecordSlo(request_.generate.slo_class, "rejected");
    TANDEM_LOG_REQ(kInfo, id()) << "rejected: " << status.ToString();
    RespondError(*exchange_, status, "");
  }

  // The client went away, the request timed out, or the server is stopping.
  void OnAbort() {
    {
      MutexLock lock(&mutex_);
      if (done_) return;
      MarkDoneLocked();
    }
    shared_->RecordFailure(499);
    TANDEM_LOG_REQ(kInfo, id()) << "client gone; cancelling";
    // Never under mutex_: Cancel may call OnEvent inline.
    for (const GenerateRequest& r : choice_requests_) shared_->backend->Cancel(r.request_id);
  }

  // True once the request ended (answered, failed or aborted).
  bool done() {
    MutexLock lock(&mutex_);
    return done_;
  }

  // True once the request ended without completing (aborted, rejected or failed): its choices
  // still running are of no use. A request that completed needs no cancel.
  bool gave_up() {
    MutexLock lock(&mutex_);
    return done_ && !completed_;
  }

  void OnEvent(int index, BackendEvent event) {
    std::vector<std::string> cancel;
    {
      MutexLock lock(&mutex_);
      if (done_) return;
      if (!event.error.ok()) {
        FailLocked(event.error);
        // The other choices are of no use any more.
        for (int i = 0; i < request_.n; ++i) {
          if (!choices_[i].finish) cancel.push_back(choice_requests_[i].request_id);
        }
      } else if (HandleTokensLocked(index, event)) {
        cancel.push_back(choice_requests_[index].request_id);
      }
    }
    for (const std::string& backend_id : cancel) shared_->backend->Cancel(backend_id);
  }

 private:
  // One choice's generation state.
  struct Choice {
    Choice(const SamplingParams& sampling, const ServedModel& model, bool skip_special_tokens)
        : decoder(model.tokenizer, skip_special_tokens), stop(sampling, model.eos_token_ids) {}
    IncrementalDecoder decoder;
    StopChecker stop;
    std::string all_text;  // every decoded delta
    std::string output;    // non-streaming: the answer so far
    std::vector<LogprobToken> logprobs;
    size_t text_offset = 0;
    int num_tokens = 0;
    std::optional<std::string> finish;  // set once this choice has finished
  };

  static std::vector<GenerateRequest> MakeChoiceRequests(const ApiRequest& request) {
    std::vector<GenerateRequest> out;
    for (int i = 0; i < request.n; ++i) out.push_back(ChoiceRequest(request, i));
    return out;
  }

  void MarkDoneLocked() TANDEM_REQUIRES(mutex_) {
    done_ = true;
    shared_->running.fetch_sub(request_.n);
    shared_->running_gauge->Dec(request_.n);
  }

  void EnsureStreamStartedLocked() TANDEM_REQUIRES(mutex_) {
    if (!request_.stream || stream_started_) return;
    stream_started_ = true;
    exchange_->StartStream();
    for (int i = 0; i < request_.n; ++i) {
      // Chat: each choice opens with its role; completions with echo: with the prompt.
      StreamDelta first;
      first.index = i;
      if (request_.kind == ApiKind::kChatCompletion) {
        first.role_chunk = true;
      } else if (request_.echo) {
        first.text = *request_.echo;
      } else {
        continue;
      }
      if (request_.continuous_usage_stats) first.usage = usage();
      exchange_->Write(SseEvent(RenderChunk(request_, first)));
    }
  }

  void FailLocked(const Status& status) TANDEM_REQUIRES(mutex_) {
    MarkDoneLocked();
    HttpError error = ErrorResponse(status);
    shared_->RecordFailure(error.http_status);
    shared_->RecordSlo(request_.generate.slo_class, "failed");
    TANDEM_LOG_REQ(kWarn, id()) << "backend failed: " << status.ToString();
    if (request_.stream && stream_started_) {
      // Headers are out: the error travels as an event, as OpenAI does mid-stream.
      exchange_->Write(SseEvent(error.body));
      exchange_->Write(SseDone());
      exchange_->End();
    } else {
      RespondError(*exchange_, status, "");
    }
  }

  // Returns true when choice `index`'s backend request must be cancelled (the router finished
  // it first).
  bool HandleTokensLocked(int index, const BackendEvent& event) TANDEM_REQUIRES(mutex_) {
    Choice& c = choices_[index];
    if (c.finish) return false;  // a finished choice's late tokens
    Clock::time_point now = Clock::now();
    std::string text;
    std::optional<std::string> finish;
    bool matched_stop = false;
    size_t used = 0;
    for (const GeneratedToken& token : event.tokens) {
      if (num_tokens_ == 0) first_token_time_ = now;
      last_token_time_ = now;
      ++num_tokens_;
      ++c.num_tokens;
      ++used;
      std::string piece = c.decoder.Add(token.token_id);
      c.all_text += piece;
      StopUpdate update = c.stop.Append(token.token_id, piece);
      text += update.text;
      if (update.finished()) {
        finish = std::string(FinishReasonName(update.finish_reason));
        matched_stop = c.stop.matched_stop().has_value();
        break;
      }
    }
    shared_->generation_tokens->Inc(static_cast<double>(used));
    const bool finished_by_router = finish.has_value() && !event.finish_reason.has_value();
    const bool checker_finished = finish.has_value();
    if (!finish && event.finish_reason) finish = *event.finish_reason;
    if (finish && !matched_stop) {
      if (!checker_finished) {
        // The backend finished first (its own eos/length): text the checker held back as a
        // possible stop string was not one.
        text += c.all_text.substr(std::min(c.stop.text().size(), c.all_text.size()));
      }
      text += c.decoder.Finish();  // bytes of an incomplete character, as U+FFFD
    }

    std::vector<LogprobToken> logprobs;
    if (request_.generate.sampling.logprobs && used > 0) {
      logprobs = MakeLogprobTokens(shared_->model.tokenizer,
                                   std::span<const GeneratedToken>(event.tokens.data(), used),
                                   c.text_offset);
      if (!logprobs.empty()) {
        c.text_offset = logprobs.back().text_offset + logprobs.back().token.size();
      }
    }
    if (finish) {
      c.finish = finish;
      ++num_finished_;
    }
    const bool all_finished = num_finished_ == request_.n;

    if (request_.stream) {
      EnsureStreamStartedLocked();
      if (!text.empty() || !logprobs.empty()) {
        StreamDelta delta;
        delta.index = index;
        delta.text = std::move(text);
        delta.logprobs = std::move(logprobs);
        if (request_.continuous_usage_stats) delta.usage = usage();
        exchange_->Write(SseEvent(RenderChunk(request_, delta)));
      }
      if (finish) {
        StreamDelta last;
        last.index = index;
        last.finish_reason = finish;
        if (request_.continuous_usage_stats) last.usage = usage();
        exchange_->Write(SseEvent(RenderChunk(request_, last)));
      }
      if (all_finished) {
        if (request_.include_usage) {
          exchange_->Write(SseEvent(RenderUsageChunk(request_, usage())));
        }
        exchange_->Write(SseDone());
        exchange_->End();
      }
    } else {
      c.output += text;
      for (auto& entry : logprobs) c.logprobs.push_back(std::move(entry));
      if (all_finished) {
        std::vector<ChoiceOutput> outputs;
        for (Choice& each : choices_) {
          outputs.push_back(ChoiceOutput{request_.echo.value_or("") + each.output,
                                         *each.finish, std::move(each.logprobs)});
        }
        exchange_->Respond(
            HttpResponse{200, "application/json", RenderResponse(request_, outputs, usage()), {}});
      }
    }
    if (all_finished) FinishLocked();
    return finished_by_router;
  }

  // The prompt counts once, however many choices share it.
  Usage usage() const TANDEM_REQUIRES(mutex_) {
    return Usage{static_cast<int>(request_.generate.prompt_token_ids.size()), num_tokens_};
  }

  void FinishLocked() TANDEM_REQUIRES(mutex_) {
    MarkDoneLocked();
    completed_ = true;
    Clock::time_point now = Clock::now();
    auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
    const Clock::time_point arrival = request_.generate.arrival_time;
    const std::vector<std::string> slo_class{
        RouterShared::SloClassLabel(request_.generate.slo_class)};
    shared_->e2e->WithLabels(slo_class).Observe(seconds(now - arrival));
    // Choices run side by side: the time per output token is per choice, over the longest.
    int longest = 0;
    for (const Choice& c : choices_) longest = std::max(longest, c.num_tokens);
    const double ttft = num_tokens_ > 0 ? seconds(first_token_time_ - arrival) : 0;
    const double tpot =
        longest > 1 ? seconds(last_token_time_ - first_token_time_) / (longest - 1) : 0;
    if (num_tokens_ > 0) shared_->ttft->WithLabels(slo_class).Observe(ttft);
    if (longest > 1) shared_->tpot->WithLabels(slo_class).Observe(tpot);
    // One request, however many choices: labelled with the first choice's finish reason.
    shared_->success->WithLabels({*choices_[0].finish}).Inc();
    if (shared_->options.traffic != nullptr)
      shared_->options.traffic->RecordFinish(
          arrival, static_cast<int32_t>(request_.generate.prompt_token_ids.size()), num_tokens_);
    if (std::optional<SloTarget> slo = shared_->backend->SloOf(request_.generate.slo_class)) {
      const bool attained = (slo->ttft_s <= 0 || ttft <= slo->ttft_s) &&
                            (slo->tpot_s <= 0 || longest <= 1 || tpot <= slo->tpot_s);
      shared_->RecordSlo(request_.generate.slo_class, attained ? "attained" : "missed");
    }
    TANDEM_LOG_REQ(kDebug, id()) << "finished (" << *choices_[0].finish << ") after "
                                 << num_tokens_ << " tokens in " << request_.n << " choice(s)";
  }

 private:
  std::shared_ptr<RouterShared> shared_;
  std::shared_ptr<HttpExchange> exchange_;
  ApiRequest request_;
  const std::vector<GenerateRequest> choice_requests_;  // choice i's backend request

  Mutex mutex_;
  std::vector<Choice> choices_ TANDEM_GUARDED_BY(mutex_);
  bool done_ TANDEM_GUARDED_BY(mutex_) = false;
  bool completed_ TANDEM_GUARDED_BY(mutex_) = false;  // every choice finished, answer sent
  bool stream_started_ TANDEM_GUARDED_BY(mutex_) = false;
  int num_finished_ TANDEM_GUARDED_BY(mutex_) = 0;  // choices with finish set
  int num_tokens_ TANDEM_GUARDED_BY(mutex_) = 0;    // over all choices
  Clock::time_point first_token_time_ TANDEM_GUARDED_BY(mutex_);
  Clock::time_point last_token_time_ TANDEM_GUARDED_BY(mutex_);
};

// Runs on a worker: validates, templates and tokenizes the request, admits it and submits it.
void HandleGenerate(const std::shared_ptr<RouterShared>& shared, ApiKind kind,
                    const std::shared_ptr<HttpExchange>& exchange) {
  if (exchange->aborted()) return;  // the client left while the request waited for a worker
  if (shared->options.before_tokenize) shared->options.before_tokenize();
  std::string param;
  StatusOr<ApiRequest> parsed =
      ParseApiRequest(kind, exchange->request().body, shared->model, &param);
  if (!parsed.ok()) {
    HttpError error = ErrorResponse(parsed.status(), param);
    shared->RecordFailure(error.http_status);
    RespondError(*exchange, parsed.status(), param);
    return;
  }
  if (!parsed->user.empty()) {
    // The client's text: control bytes are shown as '?' so that it cannot forge log lines.
    std::string user = parsed->user;
    for (char& c : user) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    }
    TANDEM_LOG_REQ(kInfo, parsed->generate.request_id) << "user '" << user << "'";
  }
  parsed->generate.slo_class = exchange->request().Header(kSloClassHeader);
  if (Status s = shared->backend->CheckSloClass(parsed->generate.slo_class); !s.ok()) {
    HttpError error = ErrorResponse(s, kSloClassHeader);
    shared->RecordFailure(error.http_status);
    RespondError(*exchange, s, kSloClassHeader);
    return;
  }

  if (shared->options.traffic != nullptr)
    shared->options.traffic->RecordArrival(
        parsed->generate.arrival_time,
        static_cast<int32_t>(parsed->generate.prompt_token_ids.size()),
        parsed->generate.sampling.max_tokens);
  // Admission: a bound on what the router holds, whatever the backend can take; each choice
  // is a backend request and counts as one.
  const int n = parsed->n;
  if (shared->running.fetch_add(n) + n > shared->options.max_concurrent_requests) {
    shared->running.fetch_sub(n);
    Status status = ResourceExhausted("the server is overloaded; retry later");
    shared->RecordFailure(HttpStatusFor(status.code()));
    shared->RecordSlo(parsed->generate.slo_class, "rejected");
    RespondError(*exchange, status, "");
    return;
  }
  shared->running_gauge->Inc(n);
  shared->prompt_tokens->Inc(static_cast<double>(parsed->generate.prompt_token_ids.size()));

  auto context = std::make_shared<RequestContext>(shared, exchange, std::move(parsed).value());
  std::weak_ptr<RequestContext> weak = context;
  exchange->SetOnAbort([weak] {
    if (auto c = weak.lock()) c->OnAbort();
  });
  if (context->done()) return;  // the client left already

  for (int i = 0; i < context->num_choices(); ++i) {
    const GenerateRequest& request = context->choice_request(i);
    Status submitted = shared->backend->Submit(
        request, [context, i](BackendEvent event) { context->OnEvent(i, std::move(event)); });
    if (!submitted.ok()) {
      context->OnRejected(submitted, i);
      return;
    }
  }
  // A client that left (or a choice that failed) between the check above and Submit found
  // nothing to cancel: cancel now (Backend::Cancel follows the Submit it cancels).
  if (context->gave_up()) {
    for (int i = 0; i < context->num_choices(); ++i) {
      shared->backend->Cancel(context->choice_request(i).request_id);
    }
    return;
  }
  context->OnSubmitted();
}

}  // namespace

RouterService::RouterService(ServedModel model, Backend* backend, RouterServiceOptions options)
    : shared_(std::make_shared<RouterShared>(std::move(model), backend, options)),
      workers_(static_cast<size_t>(std::max(options.worker_threads, 1))) {
  TANDEM_CHECK(backend != nullptr, "RouterService needs a backend");
}

RouterService::~RouterService() { workers_.join(); }

int RouterService::running() const { return shared_->running.load(); }
MetricsRegistry& RouterService::metrics() { return *shared_->options.metrics; }
const ServedModel& RouterService::model() const { return shared_->model; }

void RouterService::RegisterRoutes(HttpServer* server) {
  std::shared_ptr<RouterShared> shared = shared_;
  server->SetErrorRenderer([](const Status& status) {
    HttpError error = ErrorResponse(status);
    return HttpResponse{error.http_status, "application/json", error.body, {}};
  });
  // The io thread only hands the exchange to a worker.
  auto generate = [shared, executor = workers_.get_executor()](ApiKind kind) {
    return [shared, executor, kind](std::shared_ptr<HttpExchange> exchange) {
      boost::asio::post(executor, [shared, kind, exchange = std::move(exchange)] {
        HandleGenerate(shared, kind, exchange);
      });
    };
  };
  server->AddRoute("POST", "/v1/completions",
                   RequireApiKey(shared, generate(ApiKind::kCompletion)));
  server->AddRoute("POST", "/v1/chat/completions",
                   RequireApiKey(shared, generate(ApiKind::kChatCompletion)));
  server->AddRoute("GET", "/v1/models",
                   RequireApiKey(shared, [shared](std::shared_ptr<HttpExchange> exchange) {
                     exchange->Respond(HttpResponse{200, "application/json",
                                                    RenderModels(shared->model), {}});
                   }));
  server->AddRoute("GET", "/health", [](std::shared_ptr<HttpExchange> exchange) {
    exchange->Respond(HttpResponse{200, "application/json", "{\"status\":\"ok\"}", {}});
  });
  server->AddRoute("GET", "/ready", [shared](std::shared_ptr<HttpExchange> exchange) {
    if (shared->backend->Ready()) {
      exchange->Respond(HttpResponse{200, "application/json", "{\"status\":\"ready\"}", {}});
    } else {
      RespondError(*exchange, Unavailable("no backend instance is ready"), "");
    }
  });
  HttpHandler metrics = [shared](std::shared_ptr<HttpExchange> exchange) {
    exchange->Respond(HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8",
                                   shared->options.metrics->Render(), {}});
  };
  // Open by default: scrapers usually carry no key, and the metrics hold no prompt or key.
  if (shared->options.metrics_require_api_key) metrics = RequireApiKey(shared, metrics);
  server->AddRoute("GET", "/metrics", std::move(metrics));
}

}  // namespace tandem
