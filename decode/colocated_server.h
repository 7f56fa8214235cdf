// The colocated instance: prefill and decode in one engine loop (vLLM-style continuous batching
// of prefill chunks and decode steps under one token budget), no KV transfer. The baseline the
// disaggregated cluster is measured against; the same engine and sampler as decode, so greedy
// outputs agree token for token. It is the batch server of decode/decode_server.h with role
// kColocated: see there for the messages, sessions and shutdown contract.
#pragma once

#include <string>
#include <vector>

namespace tandem {

// `tandem colocated [--config FILE] [--index I] [--SECTION.KEY=VALUE ...]`
int ColocatedMain(const std::vector<std::string>& args);

}  // namespace tandem
