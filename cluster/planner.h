// `tandem plan`: DistServe's placement planner (see the implementation's header comment).
#pragma once

#include <string>
#include <vector>

namespace tandem {

int PlanMain(const std::vector<std::string>& args);

}  // namespace tandem
