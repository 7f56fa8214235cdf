#include "router/router_main.h"

#include <chrono>
#include <cstdlib>
#include <memory>

#include "common/base/log.h"
#include "common/base/metrics.h"
#include "common/config/config.h"
#include "common/config/serving_config.h"
#include "common/model/model_store.h"
#include "common/serving/role_main.h"
#include "router/api_keys.h"
#include "router/cluster_backend.h"
#include "common/net/http_server.h"
#include "router/openai_api.h"
#include "router/router_service.h"

namespace tandem {
namespace {

// The router as a RoleProcess: the HTTP front end over the cluster backend.
class RouterProcess : public RoleProcess {
 public:
  static StatusOr<std::unique_ptr<RoleProcess>> Start(const RoleArgs& args,
                                                      const ReplicaAdvisor& advisor) {
    const ClusterConfig& config = args.config;
    TANDEM_ASSIGN_OR_RETURN(std::string model_dir, ResolveModelDir(config.model));
    const std::string served_name = ServedModelName(config.model);
    StatusOr<ServedModel> model = LoadServedModel(model_dir, served_name,
                                                  ChatTemplateSetting(config),
                                                  config.model.max_model_len);
    if (!model.ok()) return model.status().WithContext("model " + model_dir);
    // Keys before anything listens: a bad key file stops the router, never opens it.
    StatusOr<ApiKeys> keys = LoadApiKeys(config, std::getenv(kApiKeysEnv));
    if (!keys.ok()) return keys.status();
    if (keys->empty()) {
      TANDEM_LOG(kWarn) << "no API keys (router.api_keys_file, $" << kApiKeysEnv
                        << "): the API is open to anyone who can reach " << config.router.host
                        << ":" << config.router.port;
    } else {
      TANDEM_LOG(kInfo) << "API keys required: " << keys->size() << " key(s)"
                        << (config.router.metrics_require_api_key ? ", on /metrics too" : "");
    }
    std::unique_ptr<RouterProcess> router(
        new RouterProcess(config, served_name, args.control, advisor));
    router->drain_timeout_ = std::chrono::milliseconds(
        static_cast<int64_t>(args.drain_timeout_s * 1000));
    TANDEM_RETURN_IF_ERROR(router->backend_.Start());
    if (Status s = router->advice_.Start(config); !s.ok()) {
      router->backend_.Stop();
      return s;
    }
    RouterServiceOptions service_options;
    service_options.max_concurrent_requests = config.router.max_concurrent_requests;
    service_options.metrics = &router->metrics_;
    service_options.worker_threads = config.router.tokenize_threads;
    service_options.api_keys = std::make_shared<const ApiKeys>(std::move(keys).value());
    service_options.metrics_require_api_key = config.router.metrics_require_api_key;
    service_options.traffic = &router->traffic_;
    router->service_ = std::make_unique<RouterService>(std::move(model).value(),
                                                       &router->backend_, service_options);
    HttpServerOptions http;
    http.host = config.router.host;
    http.port = static_cast<uint16_t>(config.router.port);
    http.io_threads = config.router.http_threads;
    http.max_connections = config.router.max_connections;
    http.max_body_bytes = static_cast<size_t>(config.router.max_body_bytes);
    http.request_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(config.router.request_timeout_s * 1000));
    router->server_ = std::make_unique<HttpServer>(http);
    router->service_->RegisterRoutes(router->server_.get());
    if (Status s = router->server_->Start(); !s.ok()) {
      router->backend_.Stop();
      return s;
    }
    TANDEM_LOG(kInfo) << "router serving " << served_name << " on http://" << http.host << ":"
                      << router->server_->port() << " (policy " << config.router.policy << ")";
    return std::unique_ptr<RoleProcess>(std::move(router));
  }

  void Stop() override {
    if (stopped_) return;
    stopped_ = true;
    TANDEM_LOG(kInfo) << "draining " << service_->running() << " request(s)";
    // Order matters: the HTTP server drains (and cancels what is left) while the backend still
    // delivers events; then the backend stops.
    server_->Stop(drain_timeout_);
    advice_.Stop();
    backend_.Stop();
  }

  Status Reload(const ClusterConfig& config) override {
    TANDEM_RETURN_IF_ERROR(backend_.Reconfigure(config));
    return advice_.Reconfigure(config);
  }

 private:
  RouterProcess(const ClusterConfig& config, const std::string& served_name,
                const ControlOptions& control, const ReplicaAdvisor& advisor)
      : metrics_(Labels{{"role", "router"}, {"model", served_name}}),
        backend_(config, BackendOptions(&metrics_, control)),
        advice_(advisor, &traffic_, &metrics_) {}
  static ClusterBackendOptions BackendOptions(MetricsRegistry* metrics,
                                              const ControlOptions& control) {
    ClusterBackendOptions options;
    options.metrics = metrics;
    options.control = control;
    return options;
  }

  MetricsRegistry metrics_;
  ClusterBackend backend_;
  TrafficRecorder traffic_;  // what the service was offered: the recommendation's input
  ReplicaAdviceLoop advice_;
  std::unique_ptr<RouterService> service_;
  std::unique_ptr<HttpServer> server_;
  std::chrono::milliseconds drain_timeout_{30000};  // --drain-timeout-s
  bool stopped_ = false;
};

}  // namespace

int RouterMain(const std::vector<std::string>& args, ReplicaAdvisor advisor) {
  RoleSpec spec;
  spec.command = "router";
  spec.description = "Runs the OpenAI-compatible router in front of the cluster's instances.";
  spec.instance = false;
  spec.start = [advisor = std::move(advisor)](const RoleArgs& role_args) {
    return RouterProcess::Start(role_args, advisor);
  };
  return RunRoleMain(spec, args);
}

}  // namespace tandem
