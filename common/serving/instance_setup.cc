#include "common/serving/instance_setup.h"

#include "common/config/serving_config.h"

namespace tandem {

StatusOr<InstanceSetup> InstanceSetup::Create(InstanceRole role, const RoleArgs& args,
                                              const InstanceSection& section,
                                              std::string model_name,
                                              const std::string& running_help,
                                              const std::string& waiting_help) {
  const std::string role_name = InstanceRoleName(role);
  if (section.port == 0) return InvalidArgument(role_name + ".port must be set (nonzero)");
  InstanceSetup setup;
  setup.name = role_name + "-" + std::to_string(args.index);
  // On many hosts each host runs its own index 0: the address tells them apart (Hello, logs).
  if (IsMultiHost(args.config)) {
    TANDEM_ASSIGN_OR_RETURN(std::string host, AdvertiseHost(args.config, section, role_name));
    setup.name += "@" + host;
  }
  setup.model_name = std::move(model_name);
  setup.metrics = std::make_unique<MetricsRegistry>(
      Labels{{"role", role_name}, {"model", setup.model_name}});
  setup.running = &setup.metrics->AddGauge("tandem_num_requests_running", running_help).Get();
  setup.waiting = &setup.metrics->AddGauge("tandem_num_requests_waiting", waiting_help).Get();
  setup.usage = &setup.metrics->AddGauge("tandem_kv_cache_usage_ratio",
                                         "Fraction of KV blocks in use.").Get();
  return setup;
}

StatusOr<HostOptions> InstanceSetup::Host(InstanceRole role, const RoleArgs& args,
                                          const InstanceSection& section) const {
  HostOptions o;
  o.bind_host = section.host;
  TANDEM_ASSIGN_OR_RETURN(o.advertise_host,
                          AdvertiseHost(args.config, section, InstanceRoleName(role)));
  o.name = name;
  o.role = role;
  o.model = model_name;
  o.control_port = section.port + args.index;
  o.metrics_port = section.metrics_port == 0 ? 0 : section.metrics_port + args.index;
  o.control = args.config.control;
  o.control_options = args.control;
  o.drain_timeout_s = args.drain_timeout_s;
  o.kv_block_size = args.config.kv_cache.block_size;
  o.metrics = metrics.get();
  return o;
}

void InstanceSetup::SetGauges(double running_requests, double waiting_requests,
                              int64_t free_blocks, int64_t total_blocks) const {
  running->Set(running_requests);
  waiting->Set(waiting_requests);
  usage->Set(total_blocks == 0 ? 0.0
                               : 1.0 - static_cast<double>(free_blocks) / total_blocks);
}

Status CheckRequest(const std::vector<int32_t>& prompt, const SamplingParams& sampling,
                    int32_t vocab_size, int64_t max_model_len) {
  if (prompt.empty()) return InvalidArgument("prompt is empty");
  for (int32_t t : prompt)
    if (t < 0 || t >= vocab_size)
      return InvalidArgument("prompt token " + std::to_string(t) + " is outside the vocabulary");
  TANDEM_RETURN_IF_ERROR(sampling.ValidateForVocab(vocab_size));
  const int64_t total = static_cast<int64_t>(prompt.size()) + sampling.max_tokens;
  if (total > max_model_len)
    return TooLarge("prompt (" + std::to_string(prompt.size()) + ") + max_tokens (" +
                    std::to_string(sampling.max_tokens) + ") exceeds max_model_len " +
                    std::to_string(max_model_len));
  return Status();
}

}  // namespace tandem
