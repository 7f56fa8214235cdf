// `tandem plan --kustomize-out DIR`: the plan as a kustomize overlay (cluster/planner.h).
#pragma once

#include <string>

#include "cluster/planner.h"

namespace tandem {

// A kustomize overlay over `base` (a path relative to the overlay's directory, e.g. "../gpu")
// that runs the plan on Kubernetes: the Deployments' replicas (tandem-prefill, tandem-decode)
// and, as the floor of their ScaledObjects, the planned counts; per role the GPUs of an
// instance (nvidia.com/gpu = tensor_parallel x pipeline_parallel, requests and limits) and
// its shape as --SECTION.KEY overrides on the instance's command line (device,
// tensor_parallel, pipeline_parallel, max_batch_size, kv_blocks; threads for a cpu instance).
// The SLO and model length stay in the cluster ConfigMap (the router reloads them live),
// written as a comment.
std::string PlanKustomization(const Plan& plan, const PlanOptions& options,
                              const std::string& base);

}  // namespace tandem
