// Large prompts are templated and tokenized off the HTTP io threads: /health stays fast while
// several of them are tokenized at once (measured, with a generous bound).
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "cluster/make_model_cli.h"
#include "common/net/http_server.h"
#include "router/backend.h"
#include "router/openai_api.h"
#include "router/router_service.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

// Finishes every request at once with one token.
class InstantBackend : public Backend {
 public:
  Status Submit(const GenerateRequest&, std::function<void(BackendEvent)> on_event) override {
    BackendEvent event;
    event.tokens.push_back(GeneratedToken{1, 0, {}});
    event.finish_reason = "length";
    on_event(std::move(event));
    return Status::Ok();
  }
  void Cancel(const std::string&) override {}
  bool Ready() const override { return true; }
};

TEST_CASE("HTTP: /health stays fast while large prompts are tokenized", "[router]") {
  test::TempDir dir;
  std::string out = (dir.path() / "tiny").string();
  REQUIRE(MakeModelMain({"--preset", "tiny", "--out", out}) == 0);
  StatusOr<ServedModel> model = LoadServedModel(out, "tiny", "auto", 1 << 22);
  REQUIRE(model.ok());
  InstantBackend backend;
  RouterService service(std::move(model).value(), &backend);
  HttpServerOptions options;
  options.io_threads = 2;
  options.max_body_bytes = 16 << 20;
  HttpServer server(options);
  service.RegisterRoutes(&server);
  REQUIRE(server.Start().ok());
  const std::string base = "http://127.0.0.1:" + std::to_string(server.port());

  // Four prompts of ~6 MB of words, sent at once.
  std::string words;
  while (words.size() < (6u << 20)) words += "the quick brown fox jumps over the lazy dog ";
  std::string body =
      nlohmann::json{{"model", "tiny"}, {"prompt", words}, {"max_tokens", 1}}.dump();
  std::string file = dir.Write("big.json", body);
  std::atomic<bool> sending{true};
  std::atomic<int> answered{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&] {
      test::CommandResult r = test::RunCommand(
          "curl -s -o /dev/null -w '%{http_code}' --max-time 60 -H 'Content-Type: "
          "application/json' --data-binary @'" + file + "' '" + base + "/v1/completions'");
      if (r.output.find("200") != std::string::npos) answered.fetch_add(1);
    });
  }
  // Poll /health while they are tokenized; keep the slowest answer.
  double worst_s = 0;
  int polls = 0;
  auto start = std::chrono::steady_clock::now();
  while (answered.load() < 4 && std::chrono::steady_clock::now() - start < 60s) {
    auto t0 = std::chrono::steady_clock::now();
    test::CommandResult r = test::RunCommand("curl -s -o /dev/null -w '%{http_code}' "
                                             "--max-time 10 '" + base + "/health'");
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.output.find("200") != std::string::npos) ++polls;
    worst_s = std::max(worst_s, took);
    std::this_thread::sleep_for(20ms);
  }
  sending = false;
  for (auto& c : clients) c.join();
  WARN("slowest /health during tokenization: " << worst_s << " s over " << polls << " polls");
  CHECK(answered.load() == 4);
  CHECK(polls > 0);
  CHECK(worst_s < 0.5);  // io threads that tokenize themselves take over 1 s here
  server.Stop(2s);
}

}  // namespace
}  // namespace tandem
