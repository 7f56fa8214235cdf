// `tandem bench`: the OpenAI-API load generator, and `tandem bench sweep`.
#pragma once

#include <string>
#include <vector>

namespace tandem {

int BenchMain(const std::vector<std::string>& args);

}  // namespace tandem
