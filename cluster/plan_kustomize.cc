#include "cluster/plan_kustomize.h"

#include <sstream>
#include <utility>

namespace tandem {
namespace {

// One role's patch: GPUs and the instance shape on its command line.
void KustomizeRole(std::ostringstream& y, const char* role, const InstanceSection& s) {
  const int gpus = s.tensor_parallel * s.pipeline_parallel;
  y << "  - target:\n      kind: Deployment\n      name: tandem-" << role << "\n"
    << "    patch: |-\n";
  auto add_arg = [&](const std::string& key, const std::string& value) {
    y << "      - op: add\n        path: /spec/template/spec/containers/0/args/-\n"
      << "        value: --" << role << "." << key << "=" << value << "\n";
  };
  add_arg("device", s.device);
  add_arg("tensor_parallel", std::to_string(s.tensor_parallel));
  add_arg("pipeline_parallel", std::to_string(s.pipeline_parallel));
  add_arg("max_batch_size", std::to_string(s.max_batch_size));
  if (s.kv_blocks > 0) add_arg("kv_blocks", std::to_string(s.kv_blocks));
  if (s.device == "cpu") {
    add_arg("threads", std::to_string(s.threads));
    return;
  }
  for (const char* bound : {"requests", "limits"}) {
    y << "      - op: add\n        path: /spec/template/spec/containers/0/resources/" << bound
      << "/nvidia.com~1gpu\n        value: \"" << gpus << "\"\n";
  }
}

}  // namespace

std::string PlanKustomization(const Plan& plan, const PlanOptions& o, const std::string& base) {
  const ClusterConfig& c = plan.config;
  std::ostringstream y;
  y << "# written by tandem plan: " << o.workload << " workload, SLO TTFT " << o.slo.ttft_s
    << " s, TPOT " << o.slo.tpot_s << " s at " << o.target * 100 << "% attainment, " << o.gpus
    << " GPUs (" << o.gpus_per_node << " per node)\n"
    << "# predicted goodput " << plan.chosen.rate << " req/s: " << c.prefill.instances
    << " prefill x " << c.prefill.tensor_parallel * c.prefill.pipeline_parallel << " GPU(s), "
    << c.decode.instances << " decode x " << c.decode.tensor_parallel * c.decode.pipeline_parallel
    << " GPU(s)\n"
    << "# Put the SLO in the cluster ConfigMap (cluster.yaml) so the router judges by it:\n"
    << "#   slo: {ttft_s: " << o.slo.ttft_s << ", tpot_s: " << o.slo.tpot_s
    << ", attainment_target: " << o.target << "}\n"
    << "#   model: {max_model_len: " << o.max_model_len << "}\n"
    << "# The planned counts are the Deployments' replicas and the floor of the autoscaler\n"
    << "# (KEDA scales above them on tandem_recommended_replicas when traffic outgrows the plan).\n"
    << "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
    << "resources:\n  - " << base << "\n"
    << "replicas:\n  - name: tandem-prefill\n    count: " << c.prefill.instances
    << "\n  - name: tandem-decode\n    count: " << c.decode.instances << "\n"
    << "patches:\n";
  KustomizeRole(y, "prefill", c.prefill);
  KustomizeRole(y, "decode", c.decode);
  for (const auto& [role, count] :
       {std::pair{"prefill", c.prefill.instances}, std::pair{"decode", c.decode.instances}}) {
    y << "  - target:\n      group: keda.sh\n      kind: ScaledObject\n      name: tandem-" << role
      << "\n    patch: |-\n      - op: replace\n        path: /spec/minReplicaCount\n"
      << "        value: " << count << "\n";
  }
  return y.str();
}

}  // namespace tandem
