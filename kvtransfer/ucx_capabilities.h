// What the UCX library at hand can do for the KV data plane, asked at run time (the UCX a
// binary runs with need not be the one it was built against): its version, and the memory types
// its transports can move. KV in GPU memory can go over UCX only when "cuda" is among them;
// Debian's UCX is built without CUDA: with it, UCX moves host memory only (the GPU path is
// NCCL, kvtransfer/nccl). `tandem --version` prints it.
#pragma once

#include <string>
#include <vector>

#include "common/base/status.h"

namespace tandem {

struct UcxCapabilities {
  std::string version;                    // "1.13.1"
  std::vector<std::string> memory_types;  // UCX's names: "host", "cuda", "cuda-managed", ...
  bool cuda_memory = false;               // "cuda" is one of them
};

// Creates and drops a UCX context with the transports `tls` allows (a UCX_TLS value such as
// transfer.ucx_tls; empty: every transport UCX would pick, UCX_TLS from the environment
// applying). Unavailable naming UCX's error when no context can be made (InvalidArgument for a
// `tls` UCX does not take).
StatusOr<UcxCapabilities> ProbeUcx(const std::string& tls = "");

// One line for people: "UCX 1.13.1: memory types host; KV in GPU memory over UCX: no (this UCX
// has no CUDA transport)".
std::string DescribeUcx(const StatusOr<UcxCapabilities>& probed);

}  // namespace tandem
