// `tandem generate`: runs the engine alone (no servers) greedily on one prompt. It is the
// "engine alone" reference that end-to-end runs are compared against, and how tests read our
// logits (--dump-logits).
#pragma once

#include <string>
#include <vector>

namespace tandem {

// Entry point of the subcommand; args exclude "tandem generate". Returns a process exit code.
int GenerateMain(const std::vector<std::string>& args);

}  // namespace tandem
