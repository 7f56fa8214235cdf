#include "router/router_main.h"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>

#include "common/config/config.h"
#include "common/config/serving_config.h"
#include "common/base/flags.h"
#include "common/base/log.h"
#include "common/base/metrics.h"
#include "common/model/model_store.h"
#include "router/cluster_backend.h"
#include "router/http_server.h"
#include "router/openai_api.h"
#include "router/router_service.h"

namespace tandem {
namespace {

constexpr auto kDrainTimeout = std::chrono::seconds(30);

void ApplyLogging(const ClusterConfig& config) {
  if (auto level = ParseLogLevel(config.logging.level); level.ok()) SetLogLevel(*level);
  if (auto format = ParseLogFormat(config.logging.format); format.ok()) SetLogFormat(*format);
}

}  // namespace

int RouterMain(const std::vector<std::string>& args) {
  FlagParser flags("tandem router --config FILE [--SECTION.KEY=VALUE ...]",
                   "Runs the OpenAI-compatible router in front of the cluster's instances.");
  flags.AddString("config", "", "cluster config file (YAML)");
  flags.AllowConfigOverrides();
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "tandem router: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  const std::string config_path = flags.GetString("config");
  if (config_path.empty() || !flags.positional().empty()) {
    std::fprintf(stderr, "tandem router: expected --config FILE (and no positional arguments)\n");
    return kExitUsage;
  }
  const std::vector<std::string> overrides = flags.config_overrides();
  StatusOr<ClusterConfig> config = LoadServingConfig(config_path, overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return kExitFailure;
  }
  SetLogRole("router");
  ApplyLogging(*config);

  // Signals are taken by sigwait below; block them before any thread starts so that every
  // thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  StatusOr<std::string> model_dir = ResolveModelDir(config->model);
  if (!model_dir.ok()) {
    TANDEM_LOG(kError) << "model: " << model_dir.status().message();
    return kExitFailure;
  }
  std::string served_name = ServedModelName(config->model);
  StatusOr<ServedModel> model = LoadServedModel(*model_dir, served_name,
                                                config->model.chat_template,
                                                config->model.max_model_len);
  if (!model.ok()) {
    TANDEM_LOG(kError) << "model " << *model_dir << ": " << model.status().message();
    return kExitFailure;
  }

  MetricsRegistry metrics(Labels{{"role", "router"}, {"model", served_name}});
  ClusterBackendOptions backend_options;
  backend_options.metrics = &metrics;
  ClusterBackend backend(*config, backend_options);
  if (Status s = backend.Start(); !s.ok()) {
    TANDEM_LOG(kError) << s.message();
    return kExitFailure;
  }
  RouterServiceOptions service_options;
  service_options.max_concurrent_requests = config->router.max_concurrent_requests;
  service_options.metrics = &metrics;
  RouterService service(std::move(model).value(), &backend, service_options);

  HttpServerOptions http;
  http.host = config->router.host;
  http.port = static_cast<uint16_t>(config->router.port);
  http.io_threads = config->router.http_threads;
  http.max_body_bytes = static_cast<size_t>(config->router.max_body_bytes);
  http.request_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config->router.request_timeout_s * 1000));
  HttpServer server(http);
  service.RegisterRoutes(&server);
  if (Status s = server.Start(); !s.ok()) {
    TANDEM_LOG(kError) << s.message();
    backend.Stop();
    return kExitFailure;
  }
  TANDEM_LOG(kInfo) << "router serving " << served_name << " on http://" << http.host << ":"
                    << server.port() << " (policy " << config->router.policy << ")";

  for (;;) {
    int signal_number = 0;
    if (sigwait(&signals, &signal_number) != 0) continue;
    if (signal_number == SIGHUP) {
      StatusOr<ClusterConfig> reloaded = LoadServingConfig(config_path, overrides);
      if (!reloaded.ok()) {
        TANDEM_LOG(kError) << "config reload failed, keeping the old one: "
                           << reloaded.status().message();
        continue;
      }
      if (Status s = backend.Reconfigure(*reloaded); !s.ok()) {
        TANDEM_LOG(kError) << "config reload failed, keeping the old one: " << s.message();
        continue;
      }
      ApplyLogging(*reloaded);
      continue;
    }
    TANDEM_LOG(kInfo) << "signal " << signal_number << ": draining " << service.running()
                      << " request(s)";
    break;
  }
  // Order matters: the HTTP server drains (and cancels what is left) while the backend still
  // delivers events; then the backend stops.
  server.Stop(std::chrono::duration_cast<std::chrono::milliseconds>(kDrainTimeout));
  backend.Stop();
  TANDEM_LOG(kInfo) << "router stopped";
  return kExitOk;
}

}  // namespace tandem
