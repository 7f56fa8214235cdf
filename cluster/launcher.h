// A local cluster as child processes of this binary: `tandem up CONFIG` and `tandem serve`.
//
// The launcher starts every instance (`tandem prefill|decode|colocated --config CONFIG --index I`)
// and the router (`tandem router --config CONFIG`), each with the launcher's config overrides.
// Ports that are 0 in the config (S.port, S.metrics_port, router.port) are picked here, free on
// 127.0.0.1 and below the ephemeral range, and passed to every child as overrides
// (--prefill.port=...), so that the router and the instances agree.
//
// Supervision: a child that exits while the cluster runs is restarted after a backoff (1 s,
// doubling to 30 s; back to 1 s once it has run for a minute), with a log line each time.
// SIGHUP is passed on to the router (config reload). SIGINT/SIGTERM stop the cluster: SIGTERM
// to the router (it drains), then to the instances, SIGKILL to whatever is left after
// stop_timeout_s each. Children run in their own process groups (a terminal's Ctrl-C reaches
// only the launcher, which then stops them in order) and get SIGTERM if the launcher dies.
//
// Once the router's /ready answers 200 the launcher prints one line to stdout:
//   "tandem: ready at http://HOST:PORT (model NAME)"
// Single-threaded; RunCluster blocks until the cluster is stopped.
#pragma once

#include <string>
#include <vector>

#include "common/config/config.h"
#include "common/base/status.h"

namespace tandem {

struct LaunchOptions {
  std::string config_path;             // passed to every child as --config
  std::vector<std::string> overrides;  // "section.key=value", passed to every child
  std::string binary;                  // "" = this executable (/proc/self/exe)
  double stop_timeout_s = 10;          // per stage of the shutdown, before SIGKILL
};

// For each section with instances and port 0 (and metrics_port 0), and router.port 0: picks a
// free base port (instances I use base + I) and returns the overrides that set them
// ("prefill.port=21000"). The picked ranges do not overlap. Unavailable if none is found.
StatusOr<std::vector<std::string>> PickPorts(const ClusterConfig& config);

// Starts and supervises the cluster until SIGINT/SIGTERM. Returns an exit code (kExitOk after a
// clean stop; kExitFailure when the config or the model is unusable).
int RunCluster(const LaunchOptions& options);

// `tandem up CONFIG [--SECTION.KEY=VALUE ...]`.
int UpMain(const std::vector<std::string>& args);
// `tandem serve [--SECTION.KEY=VALUE ...]`: the embedded default cluster (kServeConfigYaml).
int ServeMain(const std::vector<std::string>& args);

// The embedded default: the medium built-in model, 1 router on 127.0.0.1:8000, 1 prefill and
// 1 decode instance on picked ports.
extern const char kServeConfigYaml[];

}  // namespace tandem
