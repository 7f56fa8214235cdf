// Placeholder until the command lands (being written in this change set).
#include "cluster/planner.h"

#include <cstdio>

namespace tandem {

int PlanMain(const std::vector<std::string>&) {
  std::fprintf(stderr, "not built yet\n");
  return 1;
}

}  // namespace tandem
