// A local cluster as child processes of this binary: `tandem up CONFIG` and `tandem serve`.
//
// Start-up. The launcher loads the config as the serving commands do (LoadServingConfig), checks
// what would stop a child (cluster/launcher_checks.h: at least one instance, router.host,
// colliding ports, ports in use, the latency model, the model, the KV pools against this
// machine's memory) and stops with exit code 1 and a message naming the field when one fails.
// Ports that are 0 in the config (S.port, S.metrics_port, router.port) are picked here, free on
// 127.0.0.1 and below the ephemeral range. It then writes the validated, effective config (with
// the picked ports) to a private run directory (/tmp/tandem-up-XXXXXX/config.yaml, removed when
// the cluster stops) and starts every instance (`tandem prefill|decode|colocated --config
// SNAPSHOT --index I`) and the router (`tandem router --config SNAPSHOT`) from that snapshot;
// restarts use it too, so editing the file of a running cluster changes nothing until SIGHUP or
// the next `up`. Until the router's /ready answers 200 from the router this launcher started
// (its pid holds the listening socket), a child that exits before it ever answered /health, or
// that does not answer /health within launcher.ready_timeout_s, stops the cluster with exit
// code 1 (a child that has answered and then exits is restarted, as below).
//
// Supervision. Once ready, a child that exits is restarted after a backoff (1 s, doubling to
// 30 s; back to 1 s once it has run for a minute), with a log line each time. Every child's
// /health (instances: S.metrics_port + I, always set under `up`; the router: router.port) is
// polled every launcher.health_interval_s (each poll bounded by launcher.health_timeout_s); a
// child that has answered once since its start and then fails launcher.health_failures polls in
// a row is killed (SIGKILL) and restarted the same way. SIGHUP rereads slo, router.policy,
// router.latency_model and logging from the live file, writes them into the snapshot and passes
// SIGHUP to the router (an invalid file is logged and changes nothing). SIGINT/SIGTERM stop the
// cluster: SIGTERM to the router (it drains), then to the instances, SIGKILL to whatever is left
// after stop_timeout_s each. Children run in their own process groups (a terminal's Ctrl-C
// reaches only the launcher, which then stops them in order) and get SIGTERM if the launcher dies.
//
// Once ready the launcher prints one line to stdout:
//   "tandem: ready at http://HOST:PORT (model NAME)"
// Single-threaded; RunCluster blocks until the cluster is stopped.
#pragma once

#include <string>
#include <vector>

#include "common/config/config.h"
#include "common/base/status.h"

namespace tandem {

struct LaunchOptions {
  std::string config_path;             // the live file (read at start and on SIGHUP)
  std::vector<std::string> overrides;  // "section.key=value", applied to the file
  std::string binary;                  // "" = this executable (/proc/self/exe)
  double stop_timeout_s = 10;          // per stage of the shutdown, before SIGKILL
};

// For each section with instances and port 0 (and metrics_port 0), and router.port 0: picks a
// free base port (instances I use base + I) and returns the overrides that set them
// ("prefill.port=21000"). The picked ranges do not overlap. Unavailable if none is found.
StatusOr<std::vector<std::string>> PickPorts(const ClusterConfig& config);

// Starts and supervises the cluster until SIGINT/SIGTERM. Returns an exit code (kExitOk after a
// clean stop; kExitFailure when the config, the machine or the model is unusable, or a child
// could not start).
int RunCluster(const LaunchOptions& options);

// `tandem up CONFIG [--SECTION.KEY=VALUE ...]`.
int UpMain(const std::vector<std::string>& args);
// `tandem serve [--SECTION.KEY=VALUE ...]`: the embedded default cluster (kServeConfigYaml).
int ServeMain(const std::vector<std::string>& args);

// The embedded default: the medium built-in model, 1 router on 127.0.0.1:8000, 1 prefill and
// 1 decode instance on picked ports.
extern const char kServeConfigYaml[];

}  // namespace tandem
