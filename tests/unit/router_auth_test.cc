// API keys on the router's HTTP API (router/api_keys.h, RouterService): key sources, the
// Authorization check, OpenAI's 401, which routes stay open, and key files that stop start-up.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "cluster/make_model_cli.h"
#include "common/net/http_server.h"
#include "router/api_keys.h"
#include "router/backend.h"
#include "router/openai_api.h"
#include "router/router_service.h"
#include "tests/unit/test_util.h"
#include "tests/unit/tiny_model.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr char kKey[] = "sk-tandem-test-0123456789";

const ServedModel& Model() { return test::TinyServedModel(); }

// Answers every request with one eos token ("stop"), inline; counts what reached it.
class OneTokenBackend : public Backend {
 public:
  Status Submit(const GenerateRequest&, std::function<void(BackendEvent)> on_event) override {
    ++submitted;
    BackendEvent event;
    event.tokens.push_back(GeneratedToken{Model().eos_token_ids.at(0), -0.5f, {}});
    event.finish_reason = "stop";
    on_event(std::move(event));
    return Status::Ok();
  }
  void Cancel(const std::string&) override {}
  bool Ready() const override { return true; }
  std::atomic<int> submitted{0};
};

struct Reply {
  int status = 0;
  std::string headers;
  std::string body;
};

class AuthFixture {
 public:
  explicit AuthFixture(bool metrics_require_api_key = false) {
    RouterServiceOptions options;
    options.api_keys = std::make_shared<const ApiKeys>(std::vector<std::string>{kKey, "other"});
    options.metrics_require_api_key = metrics_require_api_key;
    options.before_tokenize = [this] { ++tokenized; };
    service_ = std::make_unique<RouterService>(Model(), &backend, options);
    server_ = std::make_unique<HttpServer>(HttpServerOptions{});
    service_->RegisterRoutes(server_.get());
    REQUIRE(server_->Start().ok());
  }
  ~AuthFixture() { server_->Stop(2s); }

  // curl with `key` as the bearer token ("" = no Authorization header).
  Reply Get(const std::string& method, const std::string& path, const std::string& key,
            const std::string& body = "") {
    std::string cmd = "curl -s -S --max-time 8 -D '" + File("headers") + "' -o '" +
                      File("body") + "' -w '%{http_code}' -X " + method;
    if (!key.empty()) cmd += " -H 'Authorization: Bearer " + key + "'";
    if (!body.empty()) {
      cmd += " -H 'Content-Type: application/json' --data-binary @'" +
             dir_.Write("request.json", body) + "'";
    }
    cmd += " 'http://127.0.0.1:" + std::to_string(server_->port()) + path + "'";
    test::CommandResult result = test::RunCommand(cmd);
    UNSCOPED_INFO(cmd << " -> " << result.output);
    Reply reply;
    reply.status = std::atoi(result.output.c_str());
    reply.headers = Read(File("headers"));
    reply.body = Read(File("body"));
    return reply;
  }

  std::string Metrics() { return service_->metrics().Render(); }

  OneTokenBackend backend;
  std::atomic<int> tokenized{0};

 private:
  std::string File(const std::string& name) { return (dir_.path() / name).string(); }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  test::TempDir dir_;
  std::unique_ptr<RouterService> service_;
  std::unique_ptr<HttpServer> server_;
};

const std::string kCompletion = R"({"model":"tiny","prompt":"hello","max_tokens":4})";

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// OpenAI's 401: the body's fields, the header, and never the key.
void CheckUnauthorized(const Reply& reply, const std::string& message_start) {
  CHECK(reply.status == 401);
  CHECK(Has(reply.headers, "WWW-Authenticate: Bearer"));
  json body = json::parse(reply.body);
  const json& error = body.at("error");
  CHECK(error.at("message").get<std::string>().rfind(message_start, 0) == 0);
  CHECK(error.at("type") == "invalid_request_error");
  CHECK(error.at("param").is_null());
  CHECK(error.at("code") == "invalid_api_key");
  CHECK_FALSE(Has(reply.body, kKey));
}

TEST_CASE("api keys: key file lines, the env list and the Authorization check", "[router]") {
  CHECK(ParseApiKeyLines("# keys\n\n  sk-a  \r\nsk-b\n#sk-c\n") ==
        std::vector<std::string>{"sk-a", "sk-b"});
  CHECK(ParseApiKeyList(nullptr).empty());
  CHECK(ParseApiKeyList(" sk-a, ,sk-b,") == std::vector<std::string>{"sk-a", "sk-b"});

  ApiKeys keys({"sk-a", "sk-b"});
  CHECK(keys.Contains("sk-b"));
  CHECK_FALSE(keys.Contains("sk-"));
  CHECK_FALSE(keys.Contains("sk-bb"));
  CHECK(keys.Check("Bearer sk-a") == ApiKeyCheck::kOk);
  CHECK(keys.Check("bearer  sk-b ") == ApiKeyCheck::kOk);  // the scheme in any case
  CHECK(keys.Check("Bearer sk-x") == ApiKeyCheck::kInvalid);
  CHECK(keys.Check("") == ApiKeyCheck::kMissing);
  CHECK(keys.Check("Bearer ") == ApiKeyCheck::kMissing);
  CHECK(keys.Check("Basic c2stYQ==") == ApiKeyCheck::kMissing);
  CHECK(keys.Check("Bearersk-a") == ApiKeyCheck::kMissing);
  CHECK(ApiKeys().Check("") == ApiKeyCheck::kOk);  // no keys: open
}

TEST_CASE("api keys: a key file that cannot be used stops start-up naming the field",
          "[router]") {
  test::TempDir dir;
  const std::string config_path = dir.Write("cluster.yaml", "router: {api_keys_file: keys}\n");
  StatusOr<ClusterConfig> config = LoadConfig(config_path);
  REQUIRE(config.ok());
  const std::string keys_path = (dir.path() / "keys").string();
  CHECK(ApiKeysPath(*config) == keys_path);  // relative to the config file's directory

  SECTION("missing") {
    StatusOr<ApiKeys> keys = LoadApiKeys(*config, nullptr);
    REQUIRE_FALSE(keys.ok());
    CHECK(Has(keys.status().message(), "router.api_keys_file: " + keys_path + ": cannot be read"));
    CHECK(Has(keys.status().message(), "cluster.yaml:1:"));  // where the field was set
  }
  SECTION("readable by others") {
    dir.Write("keys", std::string(kKey) + "\n");
    ::chmod(keys_path.c_str(), 0644);
    StatusOr<ApiKeys> keys = LoadApiKeys(*config, nullptr);
    REQUIRE_FALSE(keys.ok());
    CHECK(Has(keys.status().message(), "router.api_keys_file: " + keys_path));
    CHECK(Has(keys.status().message(), "mode 0644"));
    CHECK_FALSE(Has(keys.status().message(), kKey));
  }
  SECTION("no key in it") {
    dir.Write("keys", "# nothing yet\n\n");
    ::chmod(keys_path.c_str(), 0600);
    StatusOr<ApiKeys> keys = LoadApiKeys(*config, nullptr);
    REQUIRE_FALSE(keys.ok());
    CHECK(Has(keys.status().message(), "router.api_keys_file: " + keys_path + ": holds no key"));
  }
  SECTION("private, with keys: they and the env's count together") {
    dir.Write("keys", std::string("# ops\n") + kKey + "\n");
    ::chmod(keys_path.c_str(), 0600);
    StatusOr<ApiKeys> keys = LoadApiKeys(*config, "sk-env-1,sk-env-2");
    REQUIRE(keys.ok());
    CHECK(keys->size() == 3);
    CHECK(keys->Contains(kKey));
    CHECK(keys->Contains("sk-env-2"));
  }
  SECTION("neither file nor env: open") {
    config->router.api_keys_file.clear();
    StatusOr<ApiKeys> keys = LoadApiKeys(*config, "");
    REQUIRE(keys.ok());
    CHECK(keys->empty());
  }
}

TEST_CASE("HTTP auth: /v1 needs a key, checked before the body is parsed", "[router]") {
  AuthFixture router;
  SECTION("missing key: 401, nothing tokenized or submitted") {
    Reply reply = router.Get("POST", "/v1/completions", "", kCompletion);
    CheckUnauthorized(reply, "You didn't provide an API key");
    CHECK(router.tokenized == 0);
    CHECK(router.backend.submitted == 0);
    CHECK(Has(router.Metrics(), "tandem_router_unauthorized_requests_total{role=\"router\","
                                "model=\"tiny\",reason=\"missing\"} 1"));
  }
  SECTION("wrong key: 401, whatever the body") {
    CheckUnauthorized(router.Get("POST", "/v1/chat/completions", "sk-wrong", "{not json"),
                      "Incorrect API key provided");
    CheckUnauthorized(router.Get("GET", "/v1/models", "sk-wrong"), "Incorrect API key provided");
    CHECK(router.tokenized == 0);
    CHECK(Has(router.Metrics(), "reason=\"invalid\"} 2"));
  }
  SECTION("right key: 200") {
    Reply reply = router.Get("POST", "/v1/completions", kKey, kCompletion);
    CHECK(reply.status == 200);
    CHECK(json::parse(reply.body).at("choices").at(0).at("finish_reason") == "stop");
    CHECK(router.Get("GET", "/v1/models", "other").status == 200);
  }
  SECTION("/health, /ready and /metrics stay open") {
    CHECK(router.Get("GET", "/health", "").status == 200);
    CHECK(router.Get("GET", "/ready", "").status == 200);
    Reply metrics = router.Get("GET", "/metrics", "");
    CHECK(metrics.status == 200);
    CHECK_FALSE(Has(metrics.body, kKey));
  }
}

TEST_CASE("HTTP auth: router.metrics_require_api_key closes /metrics", "[router]") {
  AuthFixture router(/*metrics_require_api_key=*/true);
  CheckUnauthorized(router.Get("GET", "/metrics", ""), "You didn't provide an API key");
  CheckUnauthorized(router.Get("GET", "/metrics", "sk-wrong"), "Incorrect API key provided");
  Reply metrics = router.Get("GET", "/metrics", kKey);
  CHECK(metrics.status == 200);
  CHECK(Has(metrics.body, "tandem_router_unauthorized_requests_total"));
  CHECK(router.Get("GET", "/health", "").status == 200);
}

}  // namespace
}  // namespace tandem
