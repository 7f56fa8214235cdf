// What every instance server sets up the same way, so that the prefill, decode and colocated
// servers only say what is theirs:
//   - InstanceSetup: the instance's name ("decode-0"), its served model name, its metrics
//     registry (role and model labels) with the gauges every role exports, and the host options
//     its config section gives;
//   - CheckRequest: the checks every instance applies to a request it takes in;
//   - HostedRole: the RoleProcess of a running instance (stopping it drains its host).
// Threads: InstanceSetup is built and read on the starting thread; its gauges are set on the
// engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/metrics.h"
#include "common/base/status.h"
#include "common/config/config.h"
#include "common/engine/sampling_params.h"
#include "common/serving/instance_host.h"
#include "common/serving/role_main.h"

namespace tandem {

struct InstanceSetup {
  std::string name;        // "prefill-0"
  std::string model_name;  // served model name
  std::unique_ptr<MetricsRegistry> metrics;
  Gauge* running = nullptr;  // tandem_num_requests_running
  Gauge* waiting = nullptr;  // tandem_num_requests_waiting
  Gauge* usage = nullptr;    // tandem_kv_cache_usage_ratio

  // `section` is the role's; InvalidArgument when its port is 0.
  static StatusOr<InstanceSetup> Create(InstanceRole role, const RoleArgs& args,
                                        const InstanceSection& section, std::string model_name,
                                        const std::string& running_help,
                                        const std::string& waiting_help);
  // The host's options: ports SECTION.port + index, control section, drain bound, metrics. The
  // caller adds what Hello says of its KV.
  // InvalidArgument when the section's addresses cannot be served (AdvertiseHost).
  StatusOr<HostOptions> Host(InstanceRole role, const RoleArgs& args,
                             const InstanceSection& section) const;
  void SetGauges(double running_requests, double waiting_requests, int64_t free_blocks,
                 int64_t total_blocks) const;
};

// InvalidArgument (empty prompt, a token outside the vocabulary, bad sampling), TooLarge (prompt
// + max_tokens over max_model_len).
Status CheckRequest(const std::vector<int32_t>& prompt, const SamplingParams& sampling,
                    int32_t vocab_size, int64_t max_model_len);

// A running instance: owns its driver (which owns the engine, the transport and the host);
// Stop() drains the host, and the driver goes after it.
class HostedRole final : public RoleProcess {
 public:
  HostedRole(std::unique_ptr<InstanceDriver> driver, InstanceHost* host)
      : driver_(std::move(driver)), host_(host) {}
  ~HostedRole() override { Stop(); }
  void Stop() override { host_->Stop(); }
  int control_port() const { return host_->control_port(); }

 private:
  std::unique_ptr<InstanceDriver> driver_;
  InstanceHost* host_;  // the driver's
};

}  // namespace tandem
