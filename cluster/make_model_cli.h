// `tandem make-model`: writes a random-weight model checkpoint (common/model/make_model.h).
#pragma once

#include <string>
#include <vector>

namespace tandem {

// Entry point of the subcommand; args exclude "tandem make-model". Returns a process exit code.
int MakeModelMain(const std::vector<std::string>& args);

}  // namespace tandem
