// Placeholder until the simulator lands (being written in this change set).
#include "cluster/simulator.h"

#include <cstdio>

namespace tandem {

StatusOr<SimulationResult> Simulate(const ClusterConfig&, const LatencyModelFile&,
                                    const std::vector<WorkloadRequest>&,
                                    const SimulationOptions&) {
  return FailedPrecondition("simulator not built yet");
}

int SimulateMain(const std::vector<std::string>&) {
  std::fprintf(stderr, "not built yet\n");
  return 1;
}

}  // namespace tandem
