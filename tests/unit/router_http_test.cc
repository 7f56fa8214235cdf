// The router's HTTP front end end to end on 127.0.0.1: the real HttpServer and RouterService
// over a test Backend defined here (a deterministic token sequence from the tiny model's
// tokenizer; the real backend is the cluster's), driven with curl.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "cluster/make_model_cli.h"
#include "common/model/make_model.h"
#include "router/backend.h"
#include "common/net/http_server.h"
#include "router/openai_api.h"
#include "router/router_service.h"
#include "tests/unit/test_util.h"
#include "tests/unit/tiny_model.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

const ServedModel& Model() { return test::TinyServedModel(); }

constexpr char kOutputText[] = " the quick brown fox jumps over the lazy dog";

// Emits the tokens of kOutputText then eos ("stop"), or stops at max_tokens ("length"), one
// token per event from its own thread, `delay` apart. Records cancellations.
class FakeBackend : public Backend {
 public:
  explicit FakeBackend(const ServedModel& model)
      : tokens_(model.tokenizer.Encode(kOutputText, false)), eos_(model.eos_token_ids.at(0)) {}
  ~FakeBackend() override {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [id, flag] : cancel_flags_) *flag = true;
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

  Status Submit(const GenerateRequest& request,
                std::function<void(BackendEvent)> on_event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!reject_with_.ok()) return reject_with_;
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    cancel_flags_[request.request_id] = cancelled;
    last_request_ = request;
    std::chrono::milliseconds delay = delay_;
    int fail_after = fail_after_;
    threads_.emplace_back([this, request, on_event, cancelled, delay, fail_after] {
      const SamplingParams& sp = request.sampling;
      for (int i = 0; i < sp.max_tokens; ++i) {
        if (delay.count() > 0) std::this_thread::sleep_for(delay);
        if (*cancelled) return;
        if (i == fail_after) {
          on_event(BackendEvent{{}, std::nullopt, Unavailable("decode instance lost")});
          return;
        }
        size_t n = tokens_.size();
        int32_t id = static_cast<size_t>(i) < n ? tokens_[i] : eos_;
        if (sp.ignore_eos && static_cast<size_t>(i) >= n) id = tokens_[i % n];
        BackendEvent event;
        GeneratedToken token{id, -0.25f, {}};
        for (int k = 0; k < sp.top_logprobs; ++k) token.top_logprobs.push_back({id + k, -0.25f - k});
        event.tokens.push_back(token);
        bool is_eos = id == eos_ && !sp.ignore_eos;
        if (is_eos) {
          event.finish_reason = "stop";
        } else if (i + 1 == sp.max_tokens) {
          event.finish_reason = "length";
        }
        bool last = event.finish_reason.has_value();
        on_event(std::move(event));
        if (last) return;
      }
    });
    return Status::Ok();
  }

  void Cancel(const std::string& request_id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cancel_flags_.find(request_id);
    if (it != cancel_flags_.end()) *it->second = true;
    cancelled_.insert(request_id);
    cv_.notify_all();
  }

  bool Ready() const override { return ready_; }

  // Waits (bounded) until some request was cancelled; returns its id or "".
  std::string WaitForCancel(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, timeout, [&] { return !cancelled_.empty(); });
    return cancelled_.empty() ? "" : *cancelled_.begin();
  }
  std::set<std::string> cancelled() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cancelled_;
  }
  GenerateRequest last_request() {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_request_;
  }

  void set_delay(std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> lock(mutex_);
    delay_ = d;
  }
  void set_reject(Status s) {
    std::lock_guard<std::mutex> lock(mutex_);
    reject_with_ = std::move(s);
  }
  void set_fail_after(int n) {
    std::lock_guard<std::mutex> lock(mutex_);
    fail_after_ = n;
  }
  void set_ready(bool r) { ready_ = r; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // The objectives every request is judged against (none: no attainment is recorded).
  void set_slo(std::optional<SloTarget> slo) {
    std::lock_guard<std::mutex> lock(mutex_);
    slo_ = slo;
  }
  std::optional<SloTarget> SloOf(const std::string&) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return slo_;
  }
  // SLO classes the x-tandem-slo-class header may name (none: only the default).
  void set_slo_classes(std::set<std::string> classes) {
    std::lock_guard<std::mutex> lock(mutex_);
    slo_classes_ = std::move(classes);
  }
  Status CheckSloClass(const std::string& slo_class) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (slo_classes_.count(slo_class) > 0) return Status::Ok();
    return Backend::CheckSloClass(slo_class);
  }

 private:
  std::vector<int32_t> tokens_;
  int32_t eos_;
  mutable std::mutex mutex_;
  std::optional<SloTarget> slo_;
  std::set<std::string> slo_classes_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> cancel_flags_;
  std::set<std::string> cancelled_;
  GenerateRequest last_request_;
  std::chrono::milliseconds delay_{0};
  Status reject_with_;
  int fail_after_ = -1;
  std::atomic<bool> ready_{true};
};

struct Reply {
  int status = 0;
  std::string headers;
  std::string body;
  int curl_exit = 0;
  std::string curl_output;  // what curl printed (the status code, or its error)
};

class RouterFixture {
 public:
  explicit RouterFixture(std::chrono::milliseconds request_timeout = 8s,
                         std::function<void()> before_tokenize = nullptr)
      : backend_(Model()) {
    HttpServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.io_threads = 2;
    options.max_body_bytes = 64 << 10;
    options.read_timeout = 5s;
    options.request_timeout = request_timeout;
    RouterServiceOptions service_options;
    service_options.max_concurrent_requests = 64;
    service_options.before_tokenize = std::move(before_tokenize);
    service_ = std::make_unique<RouterService>(Model(), &backend_, service_options);
    server_ = std::make_unique<HttpServer>(options);
    service_->RegisterRoutes(server_.get());
    REQUIRE(server_->Start().ok());
    base_ = "http://127.0.0.1:" + std::to_string(server_->port());
  }
  ~RouterFixture() { server_->Stop(2s); }

  // Runs curl; `extra` goes before the URL. The reply's headers come from -D.
  Reply Curl(const std::string& method, const std::string& path, const std::string& body = "",
             const std::string& extra = "", int max_time_s = 8) {
    std::string headers_file = (dir_.path() / "headers").string();
    std::string cmd = "curl -s -S -N --max-time " + std::to_string(max_time_s) + " -D '" +
                      headers_file + "' -o '" + (dir_.path() / "body").string() +
                      "' -w '%{http_code}' -X " + method + " " + extra;
    if (!body.empty()) {
      std::string file = dir_.Write("request.json", body);
      cmd += " -H 'Content-Type: application/json' --data-binary @'" + file + "'";
    }
    cmd += " '" + base_ + path + "'";
    test::CommandResult result = test::RunCommand(cmd);
    Reply reply;
    reply.curl_exit = result.exit_code;
    reply.curl_output = result.output;
    UNSCOPED_INFO("curl: " << cmd << " -> exit " << result.exit_code << ": " << result.output);
    std::string out = result.output;
    size_t last = out.find_last_not_of("\r\n");
    out = last == std::string::npos ? "" : out.substr(0, last + 1);
    if (out.size() >= 3) reply.status = std::atoi(out.substr(out.size() - 3).c_str());
    reply.headers = ReadFile(headers_file);
    reply.body = ReadFile((dir_.path() / "body").string());
    return reply;
  }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  FakeBackend& backend() { return backend_; }
  HttpServer& server() { return *server_; }
  RouterService& service() { return *service_; }
  const std::string& base() const { return base_; }
  test::TempDir& dir() { return dir_; }

 private:
  test::TempDir dir_;
  FakeBackend backend_;
  std::unique_ptr<RouterService> service_;
  std::unique_ptr<HttpServer> server_;
  std::string base_;
};

// The JSON payloads of an SSE body, and whether it ended with [DONE].
std::vector<json> SseEvents(const std::string& body, bool* done) {
  std::vector<json> events;
  *done = false;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    std::string payload = line.substr(6);
    if (payload == "[DONE]") {
      *done = true;
      continue;
    }
    events.push_back(json::parse(payload));
  }
  return events;
}

// Waits until `pred` holds, at most `timeout`.
template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

std::string Decode(const std::vector<int32_t>& ids) {
  return Model().tokenizer.Decode(ids, true);
}

TEST_CASE("HTTP: non-streaming completion with usage", "[router]") {
  RouterFixture f;
  json body = {{"model", "tiny"}, {"prompt", "once upon a time"}, {"max_tokens", 4}};
  Reply r = f.Curl("POST", "/v1/completions", body.dump());
  REQUIRE(r.status == 200);
  json out = json::parse(r.body);
  CHECK(out["object"] == "text_completion");
  CHECK(out["id"].get<std::string>().rfind("cmpl-", 0) == 0);
  std::vector<int32_t> first4(f.backend().tokens().begin(), f.backend().tokens().begin() + 4);
  CHECK(out["choices"][0]["text"] == Decode(first4));
  CHECK(out["choices"][0]["finish_reason"] == "length");
  int prompt_tokens = static_cast<int>(Model().tokenizer.Encode("once upon a time", true).size());
  CHECK(out["usage"]["prompt_tokens"] == prompt_tokens);
  CHECK(out["usage"]["completion_tokens"] == 4);
  CHECK(out["usage"]["total_tokens"] == prompt_tokens + 4);
  CHECK(f.backend().last_request().prompt_token_ids ==
        Model().tokenizer.Encode("once upon a time", true));
  CHECK(WaitFor([&] { return f.service().running() == 0 && f.server().in_flight() == 0; }, 2s));
}

TEST_CASE("HTTP: non-streaming chat ends at eos with the whole text", "[router]") {
  RouterFixture f;
  json body = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "tell me"}}}},
               {"logprobs", true},
               {"top_logprobs", 2}};
  Reply r = f.Curl("POST", "/v1/chat/completions", body.dump());
  REQUIRE(r.status == 200);
  json out = json::parse(r.body);
  CHECK(out["object"] == "chat.completion");
  CHECK(out["choices"][0]["message"]["role"] == "assistant");
  CHECK(out["choices"][0]["message"]["content"] == Decode(f.backend().tokens()));
  CHECK(out["choices"][0]["finish_reason"] == "stop");
  const int n = static_cast<int>(f.backend().tokens().size()) + 1;  // + eos
  CHECK(out["usage"]["completion_tokens"] == n);
  json content = out["choices"][0]["logprobs"]["content"];
  CHECK(content.size() == static_cast<size_t>(n));
  CHECK(content[0]["top_logprobs"].size() == 2);
}

TEST_CASE("HTTP: streaming chat with include_usage", "[router]") {
  RouterFixture f;
  json body = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "tell me"}}}},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  Reply r = f.Curl("POST", "/v1/chat/completions", body.dump());
  REQUIRE(r.status == 200);
  CHECK(r.headers.find("text/event-stream") != std::string::npos);
  CHECK(r.headers.find("chunked") != std::string::npos);
  bool done = false;
  std::vector<json> events = SseEvents(r.body, &done);
  CHECK(done);
  REQUIRE(events.size() >= 4);
  CHECK(events[0]["object"] == "chat.completion.chunk");
  CHECK(events[0]["choices"][0]["delta"]["role"] == "assistant");
  std::string text;
  std::string finish;
  std::string id = events[0]["id"];
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    CHECK(events[i]["id"] == id);
    CHECK(events[i]["usage"].is_null());
    const json& choice = events[i]["choices"][0];
    if (choice["delta"].contains("content")) text += choice["delta"]["content"].get<std::string>();
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  CHECK(text == Decode(f.backend().tokens()));
  CHECK(finish == "stop");
  const json& usage = events.back();
  CHECK(usage["choices"] == json::array());
  int prompt_tokens = static_cast<int>(f.backend().last_request().prompt_token_ids.size());
  CHECK(usage["usage"]["prompt_tokens"] == prompt_tokens);
  CHECK(usage["usage"]["completion_tokens"] == static_cast<int>(f.backend().tokens().size()) + 1);
  CHECK(usage["usage"]["total_tokens"] ==
        prompt_tokens + static_cast<int>(f.backend().tokens().size()) + 1);
}

TEST_CASE("HTTP: streaming completion and stop strings cancel the backend", "[router]") {
  RouterFixture f;
  json body = {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 5}, {"stream", true}};
  Reply r = f.Curl("POST", "/v1/completions", body.dump());
  REQUIRE(r.status == 200);
  bool done = false;
  std::vector<json> events = SseEvents(r.body, &done);
  CHECK(done);
  std::string text, finish;
  for (const json& e : events) {
    CHECK(e["object"] == "text_completion");
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  std::vector<int32_t> first5(f.backend().tokens().begin(), f.backend().tokens().begin() + 5);
  CHECK(text == Decode(first5));
  CHECK(finish == "length");

  // A stop string in the middle: cut before it, finish "stop", backend cancelled.
  f.backend().set_delay(20ms);
  json stop = {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 50}, {"stop", " fox"}};
  Reply s = f.Curl("POST", "/v1/completions", stop.dump());
  REQUIRE(s.status == 200);
  json out = json::parse(s.body);
  CHECK(out["choices"][0]["text"] == " the quick brown");
  CHECK(out["choices"][0]["finish_reason"] == "stop");
  std::string cancelled = f.backend().WaitForCancel(2s);
  CHECK(cancelled == out["id"].get<std::string>());
}

TEST_CASE("HTTP: error bodies (400, 404, 405, 413, 429, 503, mid-stream)", "[router]") {
  RouterFixture f;
  Reply bad = f.Curl("POST", "/v1/completions",
                     json{{"model", "tiny"}, {"prompt", "x"}, {"temperature", 9}}.dump());
  CHECK(bad.status == 400);
  json e = json::parse(bad.body);
  CHECK(e["error"]["param"] == "temperature");
  CHECK(e["error"]["type"] == "invalid_request_error");
  CHECK(e["error"].contains("code"));

  Reply not_json = f.Curl("POST", "/v1/chat/completions", "{oops");
  CHECK(not_json.status == 400);

  Reply model = f.Curl("POST", "/v1/chat/completions",
                       json{{"model", "nope"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}}
                           .dump());
  CHECK(model.status == 404);
  CHECK(json::parse(model.body)["error"]["param"] == "model");

  Reply route = f.Curl("GET", "/v2/nothing");
  CHECK(route.status == 404);
  Reply method = f.Curl("GET", "/v1/completions");
  CHECK(method.status == 405);

  std::string huge = json{{"model", "tiny"}, {"prompt", std::string(100 << 10, 'a')}}.dump();
  Reply large = f.Curl("POST", "/v1/completions", huge);
  CHECK(large.status == 413);
  CHECK(json::parse(large.body)["error"]["type"] == "invalid_request_error");

  f.backend().set_reject(ResourceExhausted("no placement meets the SLO"));
  Reply busy = f.Curl("POST", "/v1/completions", json{{"model", "tiny"}, {"prompt", "x"}}.dump());
  CHECK(busy.status == 429);
  CHECK(busy.headers.find("Retry-After: 1") != std::string::npos);
  f.backend().set_reject(Status::Ok());

  f.backend().set_ready(false);
  CHECK(f.Curl("GET", "/ready").status == 503);
  f.backend().set_ready(true);
  CHECK(f.Curl("GET", "/ready").status == 200);
  CHECK(f.Curl("GET", "/health").status == 200);

  // A backend failure after the stream started arrives as an error event, then [DONE].
  f.backend().set_fail_after(2);
  Reply failed = f.Curl("POST", "/v1/chat/completions",
                        json{{"model", "tiny"},
                             {"messages", {{{"role", "user"}, {"content", "x"}}}},
                             {"stream", true}}
                            .dump());
  CHECK(failed.status == 200);
  bool done = false;
  std::vector<json> events = SseEvents(failed.body, &done);
  CHECK(done);
  REQUIRE_FALSE(events.empty());
  CHECK(events.back().contains("error"));
  // ... and before any token as a plain error response when not streaming.
  f.backend().set_fail_after(0);
  Reply failed_plain = f.Curl("POST", "/v1/completions", json{{"model", "tiny"}, {"prompt", "x"}}.dump());
  CHECK(failed_plain.status == 503);
  f.backend().set_fail_after(-1);

  Reply metrics = f.Curl("GET", "/metrics");
  CHECK(metrics.status == 200);
  CHECK(metrics.headers.find("text/plain; version=0.0.4") != std::string::npos);
  CHECK(metrics.body.find("tandem_request_failure_total{role=\"router\",model=\"tiny\",code=\"400\"}") !=
        std::string::npos);
  CHECK(metrics.body.find("code=\"429\"") != std::string::npos);
  CHECK(metrics.body.find("tandem_time_to_first_token_seconds_bucket") != std::string::npos);

  Reply models = f.Curl("GET", "/v1/models");
  CHECK(json::parse(models.body)["data"][0]["id"] == "tiny");
}

TEST_CASE("HTTP: client disconnect mid-stream cancels the backend request", "[router]") {
  RouterFixture f;
  f.backend().set_delay(50ms);
  json body = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "x"}}}},
               {"stream", true},
               {"ignore_eos", true},
               {"max_tokens", 200}};
  auto start = std::chrono::steady_clock::now();
  Reply r = f.Curl("POST", "/v1/chat/completions", body.dump(), "", /*max_time_s=*/1);
  CHECK(r.curl_exit != 0);  // curl gave up (timeout) mid-stream
  bool done = false;
  std::vector<json> events = SseEvents(r.body, &done);
  CHECK_FALSE(done);
  CHECK(events.size() >= 2);  // it did stream before the disconnect
  std::string cancelled = f.backend().WaitForCancel(3s);
  REQUIRE_FALSE(cancelled.empty());
  CHECK(cancelled == events.at(0)["id"].get<std::string>());
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK(WaitFor([&] { return f.service().running() == 0 && f.server().in_flight() == 0; }, 2s));
  std::string metrics = f.service().metrics().Render();
  CHECK(metrics.find("code=\"499\"") != std::string::npos);
}

TEST_CASE("HTTP: a request past its timeout gets 504 and is cancelled", "[router]") {
  RouterFixture f(600ms);
  f.backend().set_delay(100ms);
  json body = {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 40}, {"ignore_eos", true}};
  Reply plain = f.Curl("POST", "/v1/completions", body.dump());
  CHECK(plain.status == 504);
  CHECK(json::parse(plain.body)["error"]["type"] == "timeout_error");
  CHECK_FALSE(f.backend().WaitForCancel(2s).empty());

  body["stream"] = true;
  Reply streamed = f.Curl("POST", "/v1/completions", body.dump());
  CHECK(streamed.status == 200);
  bool done = false;
  std::vector<json> events = SseEvents(streamed.body, &done);
  CHECK(done);
  REQUIRE_FALSE(events.empty());
  CHECK(events.back()["error"]["type"] == "timeout_error");
  CHECK(WaitFor([&] { return f.backend().cancelled().size() == 2; }, 2s));
  CHECK(WaitFor([&] { return f.service().running() == 0 && f.server().in_flight() == 0; }, 2s));
}

TEST_CASE("HTTP: keep-alive reuses a connection, stop drains a stream", "[router]") {
  RouterFixture f;
  // Two requests in one curl invocation share the connection.
  test::CommandResult two = test::RunCommand("curl -s -v --max-time 5 '" + f.base() +
                                             "/health' '" + f.base() + "/v1/models'");
  CHECK(two.output.find("Re-using existing connection") != std::string::npos);

  // A stream in flight when Stop() starts completes; new connections are refused after.
  f.backend().set_delay(30ms);
  json body = {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 10}, {"stream", true}};
  Reply reply;
  std::thread client([&] { reply = f.Curl("POST", "/v1/completions", body.dump()); });
  REQUIRE(WaitFor([&] { return f.service().running() == 1; }, 3s));
  f.server().Stop(5s);
  client.join();
  CHECK(reply.status == 200);
  bool done = false;
  SseEvents(reply.body, &done);
  CHECK(done);
  test::CommandResult after = test::RunCommand("curl -s --max-time 2 '" + f.base() + "/health'");
  CHECK(after.exit_code != 0);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST_CASE("HTTP: requests are counted against their SLO (attained, missed, rejected, failed)",
          "[router]") {
  RouterFixture f;
  auto count = [&](const std::string& result) {
    const std::string text = f.service().metrics().Render();
    const std::string key = "tandem_router_slo_requests_total{role=\"router\",model=\"tiny\","
                            "slo_class=\"default\",result=\"" + result + "\"} ";
    const size_t at = text.find(key);
    return at == std::string::npos ? 0.0 : std::stod(text.substr(at + key.size()));
  };
  json body = {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 4}, {"ignore_eos", true}};
  // No objectives: nothing is judged.
  REQUIRE(f.Curl("POST", "/v1/completions", body.dump()).status == 200);
  CHECK(count("attained") == 0);

  f.backend().set_slo(SloTarget{5.0, 0.01});
  REQUIRE(f.Curl("POST", "/v1/completions", body.dump()).status == 200);
  CHECK(count("attained") == 1);
  f.backend().set_delay(30ms);  // 30 ms between tokens: over a 10 ms TPOT
  REQUIRE(f.Curl("POST", "/v1/completions", body.dump()).status == 200);
  CHECK(count("missed") == 1);
  f.backend().set_delay(0ms);
  f.backend().set_reject(ResourceExhausted("no placement meets the SLO"));
  CHECK(f.Curl("POST", "/v1/completions", body.dump()).status == 429);
  CHECK(count("rejected") == 1);
  f.backend().set_reject(Status::Ok());
  f.backend().set_fail_after(1);
  CHECK(f.Curl("POST", "/v1/completions", body.dump()).status == 503);
  CHECK(count("failed") == 1);
}

TEST_CASE("HTTP: latency histograms are by SLO class, default without the header",
          "[router]") {
  RouterFixture f;
  f.backend().set_slo_classes({"batch"});
  auto count = [&](const std::string& histogram, const std::string& slo_class) {
    const std::string text = f.service().metrics().Render();
    const std::string key = histogram + "_count{role=\"router\",model=\"tiny\",slo_class=\"" +
                            slo_class + "\"} ";
    const size_t at = text.find(key);
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + key.size()));
  };
  const std::vector<std::string> histograms = {"tandem_time_to_first_token_seconds",
                                               "tandem_time_per_output_token_seconds",
                                               "tandem_e2e_request_latency_seconds"};
  for (const std::string& h : histograms) CHECK(count(h, "default") == 0);  // from the start
  std::string body =
      json{{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 4}, {"ignore_eos", true}}.dump();
  // The histograms are observed when the request finishes, which may be just after its last
  // bytes reach the client: wait for them (bounded).
  REQUIRE(f.Curl("POST", "/v1/completions", body, "-H 'x-tandem-slo-class: batch'").status ==
          200);
  for (const std::string& h : histograms) {
    CHECK(WaitFor([&] { return count(h, "batch") == 1; }, 2s));
    CHECK(count(h, "default") == 0);
  }
  REQUIRE(f.Curl("POST", "/v1/completions", body).status == 200);
  for (const std::string& h : histograms)
    CHECK(WaitFor([&] { return count(h, "default") == 1; }, 2s));
}

TEST_CASE("HTTP: an unknown x-tandem-slo-class gets 400 naming the header", "[router]") {
  RouterFixture f;
  std::string body = json{{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 2}}.dump();
  Reply r = f.Curl("POST", "/v1/completions", body, "-H 'x-tandem-slo-class: premium'");
  CHECK(r.status == 400);
  json e = json::parse(r.body);
  CHECK(e["error"]["type"] == "invalid_request_error");
  CHECK(e["error"]["param"] == "x-tandem-slo-class");
  CHECK(e["error"]["message"].get<std::string>().find("premium") != std::string::npos);
  CHECK(f.backend().last_request().request_id.empty());  // never submitted
  CHECK(f.Curl("POST", "/v1/completions", body).status == 200);  // no header: the default SLO
}

TEST_CASE("HTTP: templating and tokenization never run on the io threads", "[router]") {
  // Tokenizing requests hold their threads until released; /health must still answer at once.
  std::mutex mutex;
  std::condition_variable cv;
  int tokenizing = 0;
  bool release = false;
  auto hold = [&] {
    std::unique_lock<std::mutex> lock(mutex);
    ++tokenizing;
    cv.notify_all();
    cv.wait_for(lock, 10s, [&] { return release; });
  };
  RouterFixture f(8s, hold);  // 2 io threads, 2 workers
  std::string body = json{{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 2}}.dump();
  std::string file = f.dir().Write("slow.json", body);
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      test::CommandResult r = test::RunCommand(
          "curl -s -o /dev/null -w '%{http_code}' --max-time 15 -H 'Content-Type: "
          "application/json' --data-binary @'" + file + "' '" + f.base() + "/v1/completions'");
      if (r.output.find("200") != std::string::npos) ok.fetch_add(1);
      (void)i;
    });
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    REQUIRE(cv.wait_for(lock, 5s, [&] { return tokenizing >= 2; }));
  }
  auto start = std::chrono::steady_clock::now();
  Reply health = f.Curl("GET", "/health", "", "", /*max_time_s=*/3);
  auto took = std::chrono::steady_clock::now() - start;
  {
    std::lock_guard<std::mutex> lock(mutex);
    release = true;
  }
  cv.notify_all();
  for (auto& c : clients) c.join();
  CHECK(health.status == 200);
  CHECK(took < 1s);
  CHECK(ok.load() == 4);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST_CASE("HTTP: n choices, each its own backend request, usage counts the prompt once",
          "[router]") {
  RouterFixture f;
  json body = {{"model", "tiny"}, {"prompt", "once upon a time"}, {"max_tokens", 4}, {"n", 3}};
  Reply r = f.Curl("POST", "/v1/completions", body.dump());
  REQUIRE(r.status == 200);
  json out = json::parse(r.body);
  REQUIRE(out["choices"].size() == 3);
  std::vector<int32_t> first4(f.backend().tokens().begin(), f.backend().tokens().begin() + 4);
  for (int i = 0; i < 3; ++i) {
    CHECK(out["choices"][i]["index"] == i);
    CHECK(out["choices"][i]["text"] == Decode(first4));
    CHECK(out["choices"][i]["finish_reason"] == "length");
  }
  int prompt_tokens = static_cast<int>(Model().tokenizer.Encode("once upon a time", true).size());
  CHECK(out["usage"]["prompt_tokens"] == prompt_tokens);
  CHECK(out["usage"]["completion_tokens"] == 12);
  CHECK(WaitFor([&] { return f.service().running() == 0; }, 2s));

  // Streaming chat: each choice has its role chunk, its text and its finish, by index.
  json chat = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "tell me"}}}},
               {"n", 2},
               {"stream", true},
               {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}};
  Reply s = f.Curl("POST", "/v1/chat/completions", chat.dump());
  REQUIRE(s.status == 200);
  bool done = false;
  std::vector<json> events = SseEvents(s.body, &done);
  CHECK(done);
  std::map<int, std::string> text, finish;
  std::map<int, int> roles;
  int last_completion = -1;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json& choice = events[i]["choices"][0];
    int index = choice["index"];
    if (choice["delta"].contains("role")) ++roles[index];
    if (choice["delta"].contains("content")) {
      text[index] += choice["delta"]["content"].get<std::string>();
    }
    if (!choice["finish_reason"].is_null()) finish[index] = choice["finish_reason"];
    // continuous_usage_stats: every chunk carries the running usage, never decreasing.
    REQUIRE(events[i]["usage"].is_object());
    int completion = events[i]["usage"]["completion_tokens"];
    CHECK(completion >= last_completion);
    last_completion = completion;
  }
  const int each = static_cast<int>(f.backend().tokens().size()) + 1;  // + eos
  for (int i = 0; i < 2; ++i) {
    CHECK(roles[i] == 1);
    CHECK(text[i] == Decode(f.backend().tokens()));
    CHECK(finish[i] == "stop");
  }
  CHECK(events.back()["choices"] == json::array());
  CHECK(events.back()["usage"]["completion_tokens"] == 2 * each);
}

TEST_CASE("HTTP: echo, include_stop_str_in_output and skip_special_tokens", "[router]") {
  RouterFixture f;
  json echo = {{"model", "tiny"}, {"prompt", "once upon"}, {"max_tokens", 2}, {"echo", true}};
  Reply r = f.Curl("POST", "/v1/completions", echo.dump());
  REQUIRE(r.status == 200);
  std::vector<int32_t> first2(f.backend().tokens().begin(), f.backend().tokens().begin() + 2);
  CHECK(json::parse(r.body)["choices"][0]["text"] == "once upon" + Decode(first2));

  echo["stream"] = true;
  Reply streamed = f.Curl("POST", "/v1/completions", echo.dump());
  REQUIRE(streamed.status == 200);
  bool done = false;
  std::vector<json> events = SseEvents(streamed.body, &done);
  REQUIRE_FALSE(events.empty());
  CHECK(events[0]["choices"][0]["text"] == "once upon");

  json stop = {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 50}, {"stop", " fox"},
               {"include_stop_str_in_output", true}};
  Reply s = f.Curl("POST", "/v1/completions", stop.dump());
  REQUIRE(s.status == 200);
  CHECK(json::parse(s.body)["choices"][0]["text"] == " the quick brown fox");

  // Ending at eos: its text shows only when kept and not skipped as special.
  const std::string eos_text =
      Model().tokenizer.Decode(std::vector<int32_t>{Model().eos_token_ids.at(0)}, false);
  REQUIRE_FALSE(eos_text.empty());
  json to_eos = {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 50},
                 {"include_stop_str_in_output", true}, {"skip_special_tokens", false}};
  Reply kept = f.Curl("POST", "/v1/completions", to_eos.dump());
  REQUIRE(kept.status == 200);
  CHECK(json::parse(kept.body)["choices"][0]["text"] == Decode(f.backend().tokens()) + eos_text);
  to_eos["skip_special_tokens"] = true;
  Reply skipped = f.Curl("POST", "/v1/completions", to_eos.dump());
  REQUIRE(skipped.status == 200);
  const bool eos_is_special = Model().tokenizer.IsSpecial(Model().eos_token_ids.at(0));
  CHECK(json::parse(skipped.body)["choices"][0]["text"] ==
        Decode(f.backend().tokens()) + (eos_is_special ? "" : eos_text));
}

TEST_CASE("HTTP: min_tokens holds stop strings back until reached", "[router]") {
  RouterFixture f;
  // " quick" ends within the first 2 output tokens: with min_tokens 4 it does not stop them.
  json body = {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 50}, {"stop", " quick"},
               {"min_tokens", 4}};
  Reply r = f.Curl("POST", "/v1/completions", body.dump());
  REQUIRE(r.status == 200);
  json out = json::parse(r.body);
  CHECK(out["choices"][0]["text"] == Decode(f.backend().tokens()));
  CHECK(f.backend().last_request().sampling.min_tokens == 4);
}

TEST_CASE("HTTP: an unknown field is a 400 naming it, and nothing is submitted", "[router]") {
  RouterFixture f;
  json body = {{"model", "tiny"}, {"prompt", "x"}, {"guided_json", {{"type", "object"}}}};
  Reply r = f.Curl("POST", "/v1/completions", body.dump());
  CHECK(r.status == 400);
  json out = json::parse(r.body);
  CHECK(out["error"]["param"] == "guided_json");
  body.erase("guided_json");
  body["bogus"] = 1;
  Reply u = f.Curl("POST", "/v1/completions", body.dump());
  CHECK(u.status == 400);
  CHECK(json::parse(u.body)["error"]["message"] ==
        "Unrecognized request argument supplied: bogus");
  CHECK(f.backend().last_request().request_id.empty());
}

}  // namespace
}  // namespace tandem
