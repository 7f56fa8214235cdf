// One main for every long-running role of the `tandem` binary: `tandem prefill|decode|colocated`
// and `tandem router`. It parses the flags (--config, --index and --drain-timeout-s for
// instances, --SECTION.KEY=VALUE overrides), loads and validates the config once (the process
// runs on that snapshot), sets up logging, blocks SIGTERM/SIGINT/SIGHUP in every thread, starts
// the role and waits for a signal: SIGTERM or SIGINT drains (RoleProcess::Stop) and exits 0;
// SIGHUP reloads the config file for the router (RoleProcess::Reload), and so does a change of the
// file's contents (polled every router.config_watch_interval_s: a Kubernetes ConfigMap edit);
// instances ignore both (they run the snapshot they started with).
// Exit codes: 0 after a drain, 1 on a start-up failure (config, model, port), 2 on bad flags.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/config/config.h"
#include "common/net/control_channel.h"

namespace tandem {

// A running role. Stop() and Reload() are called from the main thread only.
class RoleProcess {
 public:
  virtual ~RoleProcess() = default;
  // Refuses new work, waits (bounded) for what is in flight, stops every thread.
  virtual void Stop() = 0;
  // Applies a reloaded config to new work. FailedPrecondition for roles that cannot.
  virtual Status Reload(const ClusterConfig& config) {
    static_cast<void>(config);
    return FailedPrecondition("this role does not reload its config");
  }
};

// The control connections' options from control: and the cluster secret.
ControlOptions MakeControlOptions(const ControlSection& control, std::string secret);

struct RoleArgs {
  ClusterConfig config;
  // From control: and the cluster secret (LoadClusterSecret): every control connection's.
  ControlOptions control;
  int index = 0;                // instances: ports are SECTION.port + index
  double drain_timeout_s = 30;  // bound of the drain on SIGTERM (--drain-timeout-s)
};

struct RoleSpec {
  std::string command;      // "prefill": the usage line and the log role
  std::string description;  // one line for --help
  // Instances take --index and may run on defaults without --config; the
  // router requires --config and takes no index.
  bool instance = true;
  std::function<StatusOr<std::unique_ptr<RoleProcess>>(const RoleArgs&)> start;
};

int RunRoleMain(const RoleSpec& spec, const std::vector<std::string>& args);

}  // namespace tandem
