#include "perf/bench_client.h"

#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string_view>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace tandem {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

Clock::duration ToDuration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Error bodies can be long (a whole HTML page from a proxy); the first line or so is enough.
std::string Shorten(std::string text, size_t limit = 300) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.size() > limit) text = text.substr(0, limit) + "...";
  return text;
}

std::string RequestBody(const LoadOptions& options, const WorkloadRequest& r) {
  json body;
  body["model"] = options.model;
  if (!r.prompt_text.empty()) {
    body["prompt"] = r.prompt_text;
  } else if (!r.prompt_token_ids.empty()) {
    body["prompt"] = r.prompt_token_ids;
  } else {
    body["prompt"] = SyntheticPrompt(options.seed, r.id, r.prompt_tokens, options.min_token_id,
                                     options.max_token_id);
  }
  body["max_tokens"] = r.max_tokens;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  body["ignore_eos"] = true;
  body["temperature"] = 0;
  return body.dump();
}

std::string HttpRequestText(const ServerUrl& url, const std::string& method,
                            const std::string& target, const std::string& body) {
  std::string out = method + " " + target + " HTTP/1.1\r\nHost: " + url.host + ":" + url.port +
                    "\r\nUser-Agent: tandem-bench\r\nConnection: close\r\n";
  if (method == "POST") {
    out += "Content-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n";
  }
  out += "\r\n" + body;
  return out;
}

// The state of one run, touched only on the io_context's thread.
struct Run {
  asio::io_context& io;
  const LoadOptions& options;
  tcp::resolver::results_type endpoints;
  Clock::time_point start;
  std::function<void(size_t)> on_finish;  // request index
};

// One request: connect, send, read the SSE stream, fill in the outcome.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(Run& run, size_t index, std::string request_text, RequestOutcome* outcome)
      : run_(run),
        index_(index),
        request_text_(std::move(request_text)),
        outcome_(outcome),
        socket_(run.io),
        timer_(run.io) {
    parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
  }

  void Start() {
    sent_at_ = Clock::now();
    outcome_->arrival_s = Seconds(sent_at_ - run_.start);
    timer_.expires_after(ToDuration(run_.options.request_timeout_s));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->finished_) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      self->socket_.close(ignored);  // the pending operation completes with an error
    });
    asio::async_connect(socket_, run_.endpoints,
                        [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
                          self->OnConnect(ec);
                        });
  }

 private:
  void OnConnect(beast::error_code ec) {
    if (ec) return Fail("connect", ec);
    asio::async_write(socket_, asio::buffer(request_text_),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->Fail("write", ec);
                        self->ReadMore();
                      });
  }

  void ReadMore() {
    http::async_read_some(
        socket_, buffer_, parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec && ec != http::error::end_of_stream) return Fail("read", ec);
    const bool ok_status = parser_.is_header_done() && parser_.get().result_int() == 200;
    if (ok_status) ConsumeEvents();
    if (finished_) return;
    if (parser_.is_done() || ec == http::error::end_of_stream) {
      if (!parser_.is_header_done()) return Finish("the server closed the connection", false);
      unsigned status = parser_.get().result_int();
      if (status != 200) {
        return Finish("HTTP " + std::to_string(status) + ": " + Shorten(parser_.get().body()),
                      status == 429);
      }
      if (!stream_error_.empty()) return Finish(stream_error_, false);
      if (!saw_done_) return Finish("the stream ended before [DONE]", false);
      return Finish("", false);
    }
    ReadMore();
  }

  // Handles every complete "data: ..." event received so far.
  void ConsumeEvents() {
    const std::string& body = parser_.get().body();
    for (;;) {
      size_t end = body.find("\n\n", consumed_);
      if (end == std::string::npos) return;
      std::string_view event(body.data() + consumed_, end - consumed_);
      consumed_ = end + 2;
      std::string data;
      while (!event.empty()) {
        size_t eol = event.find('\n');
        std::string_view line = event.substr(0, eol);
        event = eol == std::string_view::npos ? std::string_view() : event.substr(eol + 1);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.rfind("data:", 0) != 0) continue;  // comments, event names, ids
        line.remove_prefix(5);
        if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
        if (!data.empty()) data += '\n';
        data.append(line);
      }
      if (!data.empty()) HandleEvent(data);
    }
  }

  void HandleEvent(const std::string& data) {
    Clock::time_point now = Clock::now();
    if (data == "[DONE]") {
      saw_done_ = true;
      end_at_ = now;
      return;
    }
    json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      if (stream_error_.empty()) stream_error_ = "unparsable stream event: " + Shorten(data);
      return;
    }
    if (auto it = j.find("error"); it != j.end()) {
      std::string message =
          it->is_object() && it->contains("message") && (*it)["message"].is_string()
              ? (*it)["message"].get<std::string>()
              : it->dump();
      if (stream_error_.empty()) stream_error_ = "stream error: " + Shorten(message);
      return;
    }
    if (auto it = j.find("choices"); it != j.end() && it->is_array() && !it->empty()) {
      const json& choice = (*it)[0];
      std::string text;
      if (auto t = choice.find("text"); t != choice.end() && t->is_string()) {
        text = t->get<std::string>();
      } else if (auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
        auto c = d->find("content");
        if (c != d->end() && c->is_string()) text = c->get<std::string>();
      }
      bool finish = choice.contains("finish_reason") && !choice["finish_reason"].is_null();
      if (!text.empty()) ++text_events_;
      if (!got_first_ && (!text.empty() || finish)) {
        got_first_ = true;
        first_at_ = now;
      }
    }
    if (auto it = j.find("usage"); it != j.end() && it->is_object()) {
      if (auto c = it->find("completion_tokens"); c != it->end() && c->is_number_integer())
        usage_tokens_ = c->get<int32_t>();
      if (auto p = it->find("prompt_tokens"); p != it->end() && p->is_number_integer())
        usage_prompt_ = p->get<int32_t>();
    }
  }

  void Fail(const char* what, beast::error_code ec) {
    if (timed_out_) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "timed out after %g s", run_.options.request_timeout_s);
      return Finish(buf, false);
    }
    Finish(std::string(what) + ": " + ec.message(), false);
  }

  void Finish(std::string error, bool rejected) {
    if (finished_) return;
    finished_ = true;
    Clock::time_point now = Clock::now();
    if (!saw_done_) end_at_ = now;
    timer_.cancel();
    beast::error_code ignored;
    socket_.close(ignored);

    RequestOutcome& o = *outcome_;
    o.ok = error.empty();
    o.rejected = rejected;
    o.error = std::move(error);
    if (usage_prompt_ > 0) o.prompt_tokens = usage_prompt_;
    o.e2e_s = Seconds(end_at_ - sent_at_);
    if (o.ok) {
      o.output_tokens = usage_tokens_ >= 0 ? usage_tokens_ : text_events_;
      o.ttft_s = got_first_ ? Seconds(first_at_ - sent_at_) : o.e2e_s;
      o.tpot_s = TpotSeconds(o.e2e_s, o.ttft_s, o.output_tokens);
    }
    run_.on_finish(index_);
  }

  Run& run_;
  size_t index_;
  std::string request_text_;
  RequestOutcome* outcome_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;
  http::response_parser<http::string_body> parser_;
  size_t consumed_ = 0;  // body bytes already split into events
  Clock::time_point sent_at_, first_at_, end_at_;
  bool got_first_ = false, saw_done_ = false, finished_ = false, timed_out_ = false;
  int32_t text_events_ = 0, usage_tokens_ = -1, usage_prompt_ = -1;
  std::string stream_error_;
};

StatusOr<tcp::resolver::results_type> Resolve(asio::io_context& io, const ServerUrl& url) {
  tcp::resolver resolver(io);
  beast::error_code ec;
  auto endpoints = resolver.resolve(url.host, url.port, ec);
  if (ec) return Unavailable("cannot resolve " + url.host + ":" + url.port + ": " + ec.message());
  return endpoints;
}

}  // namespace

StatusOr<ServerUrl> ParseServerUrl(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    return InvalidArgument("'" + url + "' must start with http:// (https is not supported)");
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos)
    return InvalidArgument("'" + url + "' must be http://HOST:PORT with no path");
  size_t colon = rest.rfind(':');
  ServerUrl out;
  if (colon == std::string::npos) {
    out.host = rest;
    out.port = "80";
  } else {
    out.host = rest.substr(0, colon);
    out.port = rest.substr(colon + 1);
  }
  bool digits = !out.port.empty() && out.port.size() <= 5 &&
                std::all_of(out.port.begin(), out.port.end(), ::isdigit);
  if (out.host.empty() || !digits || std::stoi(out.port) < 1 || std::stoi(out.port) > 65535)
    return InvalidArgument("'" + url + "' must be http://HOST:PORT");
  return out;
}

std::vector<int32_t> SyntheticPrompt(uint64_t seed, int64_t id, int32_t length, int32_t min_id,
                                     int32_t max_id) {
  // mt19937_64's sequence is fixed by the standard; the modulo keeps the mapping portable too.
  std::mt19937_64 engine(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(id) + 1);
  const uint64_t range = static_cast<uint64_t>(std::max(1, max_id - min_id));
  std::vector<int32_t> ids(static_cast<size_t>(std::max(length, 0)));
  for (int32_t& token : ids) token = min_id + static_cast<int32_t>(engine() % range);
  return ids;
}

StatusOr<std::string> HttpGet(const ServerUrl& url, const std::string& path, double timeout_s) {
  asio::io_context io;
  TANDEM_ASSIGN_OR_RETURN(auto endpoints, Resolve(io, url));
  beast::tcp_stream stream(io);
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  std::string request = HttpRequestText(url, "GET", path, "");
  beast::error_code result;
  stream.expires_after(ToDuration(timeout_s));
  stream.async_connect(endpoints, [&](beast::error_code ec, const tcp::endpoint&) {
    if (ec) {
      result = ec;
      return;
    }
    asio::async_write(stream, asio::buffer(request), [&](beast::error_code ec, size_t) {
      if (ec) {
        result = ec;
        return;
      }
      http::async_read(stream, buffer, response,
                       [&](beast::error_code ec, size_t) { result = ec; });
    });
  });
  io.run();
  const std::string where = "GET http://" + url.host + ":" + url.port + path;
  if (result) return Unavailable(where + ": " + result.message());
  if (response.result_int() != 200)
    return Unavailable(where + ": HTTP " + std::to_string(response.result_int()) + ": " +
                       Shorten(response.body()));
  return std::move(response.body());
}

StatusOr<ServedModelInfo> FetchModelInfo(const ServerUrl& url, double timeout_s) {
  TANDEM_ASSIGN_OR_RETURN(std::string body, HttpGet(url, "/v1/models", timeout_s));
  const std::string where = "GET http://" + url.host + ":" + url.port + "/v1/models";
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    return Unavailable(where + ": no model in the answer: " + Shorten(body));
  ServedModelInfo info;
  info.name = j["data"][0]["id"].get<std::string>();
  if (auto it = j["data"][0].find("max_model_len");
      it != j["data"][0].end() && it->is_number_integer())
    info.max_model_len = it->get<int>();
  return info;
}

StatusOr<LoadResult> RunLoad(const LoadOptions& options,
                             const std::vector<WorkloadRequest>& requests) {
  for (const WorkloadRequest& r : requests) {
    if (r.prompt_text.empty() && r.prompt_token_ids.empty() && r.prompt_tokens < 1)
      return InvalidArgument("request " + std::to_string(r.id) + " has no prompt");
  }
  // One socket per request in flight: an overloaded server can hold more than the usual soft
  // limit of 1024 descriptors open.
  if (rlimit limit{}; ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
  asio::io_context io;
  TANDEM_ASSIGN_OR_RETURN(auto endpoints, Resolve(io, options.url));

  const size_t n = requests.size();
  std::vector<RequestOutcome> outcomes(n);
  std::vector<bool> sent(n, false);
  size_t next = 0;  // next request to send
  int64_t num_sent = 0, num_done = 0;
  bool sending_over = n == 0;

  Run run{io, options, endpoints, Clock::now(), nullptr};
  const bool closed_loop = options.concurrency > 0;
  asio::steady_timer dispatch(io), progress(io);

  auto past_duration = [&] {
    return options.duration_s > 0 && Seconds(Clock::now() - run.start) >= options.duration_s;
  };
  auto maybe_all_done = [&] {
    if (sending_over && num_done == num_sent) {
      dispatch.cancel();
      progress.cancel();
    }
  };
  auto send = [&](size_t i) {
    const WorkloadRequest& r = requests[i];
    RequestOutcome& o = outcomes[i];
    o.id = r.id;
    o.prompt_tokens = r.prompt_tokens;
    sent[i] = true;
    ++num_sent;
    auto exchange = std::make_shared<Exchange>(
        run, i, HttpRequestText(options.url, "POST", "/v1/completions", RequestBody(options, r)),
        &o);
    exchange->Start();
  };

  // Open loop: a timer walks the arrival times; everything due is sent at once (no request
  // waits for another's answer).
  std::function<void()> schedule_open = [&] {
    for (;;) {
      if (next >= n || past_duration() ||
          (options.duration_s > 0 && requests[next].arrival_s > options.duration_s)) {
        sending_over = true;
        return maybe_all_done();
      }
      Clock::time_point due = run.start + ToDuration(requests[next].arrival_s);
      if (due > Clock::now()) break;
      send(next++);
    }
    dispatch.expires_at(run.start + ToDuration(requests[next].arrival_s));
    dispatch.async_wait([&](beast::error_code ec) {
      if (!ec) schedule_open();
    });
  };
  // Closed loop: one more whenever one finishes.
  auto send_closed = [&] {
    if (next >= n || past_duration()) {
      sending_over = true;
      return;
    }
    send(next++);
  };

  run.on_finish = [&](size_t) {
    ++num_done;
    if (closed_loop && !sending_over) send_closed();
    maybe_all_done();
  };

  std::function<void()> show_progress = [&] {
    std::fprintf(stderr, "\r[bench] sent %lld/%zu  done %lld  in flight %lld  elapsed %.1f s\x1b[K",
                 static_cast<long long>(num_sent), n, static_cast<long long>(num_done),
                 static_cast<long long>(num_sent - num_done), Seconds(Clock::now() - run.start));
    std::fflush(stderr);
    progress.expires_after(std::chrono::milliseconds(250));
    progress.async_wait([&](beast::error_code ec) {
      if (!ec) show_progress();
    });
  };

  run.start = Clock::now();
  if (options.progress) show_progress();
  if (closed_loop) {
    for (int c = 0; c < options.concurrency && !sending_over; ++c) send_closed();
    maybe_all_done();
  } else {
    schedule_open();
  }
  io.run();
  const double duration = Seconds(Clock::now() - run.start);
  if (options.progress) {
    std::fprintf(stderr, "\r[bench] sent %lld/%zu  done %lld  elapsed %.1f s\x1b[K\n",
                 static_cast<long long>(num_sent), n, static_cast<long long>(num_done), duration);
  }

  LoadResult result;
  result.duration_s = duration;
  for (size_t i = 0; i < n; ++i) {
    if (!sent[i]) continue;
    result.outcomes.push_back(std::move(outcomes[i]));
    result.max_tokens.push_back(requests[i].max_tokens);
  }
  return result;
}

}  // namespace tandem
