// The colocated instance: prefill and decode in one engine loop (vLLM-style continuous batching
// of prefill chunks and decode steps under one token budget), no KV transfer. The baseline the
// disaggregated cluster is measured against; the same engine and sampler as decode, so greedy
// outputs agree token for token. It is a DecodeServer with role kColocated: see
// decode/decode_server.h for the threading and shutdown contract.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "decode/decode_server.h"

namespace tandem {

class ColocatedServer {
 public:
  // options.role is forced to kColocated.
  static StatusOr<std::unique_ptr<ColocatedServer>> Start(InstanceOptions options);
  void Stop() { server_->Stop(); }
  int control_port() const { return server_->control_port(); }

 private:
  explicit ColocatedServer(std::unique_ptr<DecodeServer> server) : server_(std::move(server)) {}
  std::unique_ptr<DecodeServer> server_;
};

// `tandem colocated [--config FILE] [--index I] [--SECTION.KEY=VALUE ...]`
int ColocatedMain(const std::vector<std::string>& args);

}  // namespace tandem
