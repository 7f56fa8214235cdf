#include "decode/colocated_server.h"

namespace tandem {

StatusOr<std::unique_ptr<ColocatedServer>> ColocatedServer::Start(InstanceOptions options) {
  options.role = InstanceRole::kColocated;
  TANDEM_ASSIGN_OR_RETURN(auto server, DecodeServer::Start(options));
  return std::unique_ptr<ColocatedServer>(new ColocatedServer(std::move(server)));
}

int ColocatedMain(const std::vector<std::string>& args) {
  return RunBatchInstanceMain(InstanceRole::kColocated, args);
}

}  // namespace tandem
