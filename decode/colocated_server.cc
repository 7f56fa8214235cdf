#include "decode/colocated_server.h"

#include "decode/decode_server.h"

namespace tandem {

int ColocatedMain(const std::vector<std::string>& args) {
  return RunBatchInstanceMain(InstanceRole::kColocated, args);
}

}  // namespace tandem
