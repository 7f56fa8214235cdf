#include "kvtransfer/ucx_capabilities.h"

#include <ucp/api/ucp.h>
#include <ucs/memory/memory_type.h>


namespace tandem {

StatusOr<UcxCapabilities> ProbeUcx(const std::string& tls) {
  UcxCapabilities caps;
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  caps.version =
      std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);

  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  auto failed = [&](const std::string& what) {
    return Unavailable("UCX " + caps.version + ": " + what + ": " + ucs_status_string(st));
  };
  if (st != UCS_OK) return failed("config read");
  if (!tls.empty() && (st = ucp_config_modify(config, "TLS", tls.c_str())) != UCS_OK) {
    ucp_config_release(config);
    return InvalidArgument("UCX_TLS '" + tls + "': " + ucs_status_string(st));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
  ucp_context_h context = nullptr;
  st = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (st != UCS_OK) return failed(tls.empty() ? "init" : "init (UCX_TLS=" + tls + ")");
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  st = ucp_context_query(context, &attr);
  ucp_cleanup(context);
  if (st != UCS_OK) return failed("query");
  for (int t = 0; t < UCS_MEMORY_TYPE_LAST; ++t) {
    if ((attr.memory_types & (uint64_t{1} << t)) == 0) continue;
    caps.memory_types.push_back(ucs_memory_type_names[t]);
    if (t == UCS_MEMORY_TYPE_CUDA) caps.cuda_memory = true;
  }
  return caps;
}

std::string DescribeUcx(const StatusOr<UcxCapabilities>& probed) {
  if (!probed.ok()) return "UCX: unavailable (" + probed.status().message() + ")";
  std::string types;
  for (const std::string& t : probed->memory_types) types += (types.empty() ? "" : ", ") + t;
  return "UCX " + probed->version + ": memory types " + (types.empty() ? "none" : types) +
         "; KV in GPU memory over UCX: " +
         (probed->cuda_memory ? "yes" : "no (this UCX has no CUDA transport)");
}

}  // namespace tandem
