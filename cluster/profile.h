// `tandem profile`: measures an instance's prefill and decode step times on this hardware and
// fits the latency model of common/engine/latency_model.h, written as YAML.
#pragma once

#include <string>
#include <vector>

namespace tandem {

int ProfileMain(const std::vector<std::string>& args);

}  // namespace tandem
