// Placeholder until the engine lands (issue #3): the subcommand exists and says so.
#include "common/make_model.h"

#include <cstdio>

#include "common/flags.h"

namespace tandem {

int MakeModelMain(const std::vector<std::string>&) {
  std::fprintf(stderr, "tandem make-model: not built yet\n");
  return kExitFailure;
}

}  // namespace tandem
