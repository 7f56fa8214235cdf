#include "common/config/serving_config.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace tandem {
namespace {

class ServingErrors {
 public:
  explicit ServingErrors(const ClusterConfig& config) : config_(config) {}
  void Add(const std::string& field, const std::string& what) {
    errors_.push_back(config_.Where(field) + ": " + field + ": " + what);
  }
  Status ToStatus() const {
    if (errors_.empty()) return Status::Ok();
    std::string message;
    for (const std::string& e : errors_) message += (message.empty() ? "" : "\n") + e;
    return InvalidArgument(message);
  }

 private:
  const ClusterConfig& config_;
  std::vector<std::string> errors_;
};

void CheckInstance(ServingErrors* errors, const std::string& name, const InstanceSection& s) {
  if (s.device != "cpu")
    errors->Add(name + ".device",
                "'" + s.device + "' cannot be served: Tandem has no CUDA forward pass yet, on any "
                "build (device cuda is for tandem simulate and tandem plan); use cpu");
  if (s.tensor_parallel > 1)
    errors->Add(name + ".tensor_parallel",
                std::to_string(s.tensor_parallel) + " cannot be served: a CPU instance is one "
                "process (use " + name + ".threads); tensor parallelism is for tandem simulate "
                "and tandem plan");
  if (s.pipeline_parallel > 1)
    errors->Add(name + ".pipeline_parallel",
                std::to_string(s.pipeline_parallel) + " cannot be served: a CPU instance is one "
                "process; pipeline parallelism is for tandem simulate and tandem plan");
  if (s.preemption == "swap")
    errors->Add(name + ".preemption",
                "swap is not implemented: decode preempts by recompute (the request's KV is "
                "dropped and its tokens recomputed); use recompute");
  if (name != "colocated" && s.scheduling != "chunked")
    errors->Add(name + ".scheduling",
                "'" + s.scheduling + "' has no effect on " + name + " instances: only colocated "
                "instances mix prompts into decode steps");
}

// The first number in `path` (bytes), or 0 when it cannot be read or says "max".
uint64_t ReadLimit(const char* path) {
  std::ifstream in(path);
  uint64_t value = 0;
  if (!(in >> value)) return 0;
  return value;
}

}  // namespace

bool BuiltWithCuda() {
#ifdef TANDEM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Status ValidateForServing(const ClusterConfig& config) {
  ServingErrors errors(config);
  CheckInstance(&errors, "prefill", config.prefill);
  CheckInstance(&errors, "decode", config.decode);
  CheckInstance(&errors, "colocated", config.colocated);
  if (config.transfer.backend == "nccl" && !BuiltWithCuda())
    errors.Add("transfer.backend",
               "nccl needs a build with CUDA (cmake -DTANDEM_CUDA=ON on a machine with nvcc and "
               "NCCL); this build moves KV with ucx");
  if (config.transfer.backend == "inproc" &&
      (config.prefill.instances > 0 || config.decode.instances > 0))
    errors.Add("transfer.backend",
               "inproc moves KV only within one process (for tests), and every prefill and "
               "decode instance is its own process; use ucx");
  return errors.ToStatus();
}

StatusOr<ClusterConfig> LoadServingConfig(const std::string& path,
                                          const std::vector<std::string>& overrides) {
  TANDEM_ASSIGN_OR_RETURN(ClusterConfig config, LoadConfig(path, overrides));
  TANDEM_RETURN_IF_ERROR(ValidateForServing(config));
  return config;
}

uint64_t MachineMemoryBytes() {
  uint64_t bytes = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    std::istringstream fields(line.substr(9));
    uint64_t kib = 0;
    if (fields >> kib) bytes = kib * 1024;
    break;
  }
  if (bytes == 0) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) bytes = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  }
  // A container's limit (cgroup v2, then v1); "max" or an absurd v1 default reads as no limit.
  for (const char* limit_file :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const uint64_t limit = ReadLimit(limit_file);
    if (limit > 0 && (bytes == 0 || limit < bytes)) bytes = limit;
  }
  return bytes;
}

}  // namespace tandem
