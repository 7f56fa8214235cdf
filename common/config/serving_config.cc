#include "common/config/serving_config.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <filesystem>

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

std::atomic<UcxCudaProbe> ucx_cuda_probe{nullptr};

bool UcxMovesCudaMemory(const std::string& tls) {
  const UcxCudaProbe probe = ucx_cuda_probe.load();
  return probe != nullptr && probe(tls);
}

// `ucx_moves_cuda`: what the UCX probe said for transfer.ucx_tls (ValidateForServing asks it).
void CheckInstance(ServingErrors* errors, const ClusterConfig& config, const std::string& name,
                   const InstanceSection& s, bool ucx_moves_cuda) {
  const std::string& backend = config.transfer.backend;
  if (s.device == "cuda" && !BuiltWithCuda()) {
    errors->Add(name + ".device",
                "cuda cannot be served by this build: it has no CUDA backend (build with cmake "
                "-DTANDEM_CUDA=ON on a machine with nvcc); use cpu");
  } else if (s.device == "cuda" && name != "colocated" && s.instances > 0 && backend == "ucx" &&
             ucx_moves_cuda) {
    if (s.tensor_parallel > 1)
      errors->Add(name + ".tensor_parallel",
                  std::to_string(s.tensor_parallel) + " keeps a KV pool per GPU, and "
                  "transfer.backend ucx moves one pool an instance: use cuda_ipc or nccl");
  } else if (s.device == "cuda" && name != "colocated" && s.instances > 0 &&
             backend != "cuda_ipc" && backend != "nccl") {
    const std::string why =
        backend == "ucx" ? "the UCX at hand moves host memory only over transfer.ucx_tls '" +
                               config.transfer.ucx_tls + "' (a UCX built with CUDA would move it)"
                         : "transfer.backend " + backend + " cannot move it";
    errors->Add(name + ".device",
                "cuda on " + name + " instances keeps the KV in GPU memory, and " + why +
                    ": set transfer.backend: cuda_ipc (prefill and decode on one machine) or "
                    "nccl (on any machines)");
  }
  if (!s.cuda_devices.empty() && s.device != "cuda")
    errors->Add(name + ".cuda_devices",
                "has no effect on " + s.device + " instances: it picks the GPUs of device cuda");
  if (!s.cuda_devices.empty() && s.device == "cuda" && s.tensor_parallel > 1) {
    // Instance i takes entries i*t .. i*t+t-1 (CudaVisibleDevicesFor): whole groups of distinct
    // GPUs, or two ranks (NCCL refuses) or two instances would share one.
    const size_t t = static_cast<size_t>(s.tensor_parallel), n = s.cuda_devices.size();
    if (n % t != 0) {
      errors->Add(name + ".cuda_devices",
                  std::to_string(n) + " entries are not whole groups of tensor_parallel " +
                      std::to_string(t) + " GPUs (instance i takes entries i*" +
                      std::to_string(t) + " .. i*" + std::to_string(t) + "+" +
                      std::to_string(t - 1) + ")");
    } else {
      for (size_t g = 0; g < n; g += t) {
        std::vector<std::string> group(s.cuda_devices.begin() + g, s.cuda_devices.begin() + g + t);
        std::sort(group.begin(), group.end());
        auto twice = std::adjacent_find(group.begin(), group.end());
        if (twice != group.end()) {
          errors->Add(name + ".cuda_devices",
                      "'" + *twice + "' twice among one instance's " + std::to_string(t) +
                          " GPUs: each rank needs its own");
          break;
        }
      }
    }
  }
  if (s.tensor_parallel > 1 && s.device != "cuda")
    errors->Add(name + ".tensor_parallel",
                std::to_string(s.tensor_parallel) + " cannot be served on " + s.device +
                ": a CPU instance is one process (use " + name + ".threads); tensor "
                "parallelism splits a model over the GPUs of a cuda instance");
  if (s.pipeline_parallel > 1)
    errors->Add(name + ".pipeline_parallel",
                std::to_string(s.pipeline_parallel) + " cannot be served: an instance runs "
                "one pipeline stage (use tensor_parallel on cuda); pipeline parallelism is for "
                "tandem simulate and tandem plan");
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

void SetUcxCudaProbe(UcxCudaProbe probe) { ucx_cuda_probe.store(probe); }

Status ValidateForServing(const ClusterConfig& config) {
  ServingErrors errors(config);
  // The UCX probe makes a UCX context: asked once, and only where a prefill or decode instance
  // on cuda would move its KV over ucx.
  const auto kv_on_cuda = [](const InstanceSection& s) {
    return s.instances > 0 && s.device == "cuda";
  };
  const bool ucx_moves_cuda = BuiltWithCuda() && config.transfer.backend == "ucx" &&
                              (kv_on_cuda(config.prefill) || kv_on_cuda(config.decode)) &&
                              UcxMovesCudaMemory(config.transfer.ucx_tls);
  CheckInstance(&errors, config, "prefill", config.prefill, ucx_moves_cuda);
  CheckInstance(&errors, config, "decode", config.decode, ucx_moves_cuda);
  CheckInstance(&errors, config, "colocated", config.colocated, ucx_moves_cuda);
  const bool moves_kv = config.prefill.instances > 0 || config.decode.instances > 0;
  const std::string& backend = config.transfer.backend;
  const bool gpu_transport = backend == "cuda_ipc" || backend == "nccl";
  if (gpu_transport && moves_kv && !BuiltWithCuda())
    errors.Add("transfer.backend",
               backend + " needs a build with CUDA (cmake -DTANDEM_CUDA=ON on a machine with "
               "nvcc); this build moves KV with ucx");
  else if (gpu_transport)
    for (const auto& [name, s] : {std::pair{"prefill", &config.prefill},
                                  std::pair{"decode", &config.decode}}) {
      if (s->instances > 0 && s->device != "cuda")
        errors.Add("transfer.backend",
                   backend + " moves KV between GPU pools, and " + name + ".device is " +
                       s->device + ": set it to cuda, or use ucx");
    }
  // cuda_ipc copies straight out of prefill's pool: decode stops starting a pull one copy's
  // bound before prefill's hold ends, and the hold must leave at least as long to start one.
  const double ipc_margin = CudaIpcPullMarginSeconds(config.transfer.timeout_s);
  if (backend == "cuda_ipc" && moves_kv && config.prefill.kv_hold_timeout_s < 2 * ipc_margin) {
    char text[400];
    std::snprintf(text, sizeof text,
                  "%g s is too short for transfer.backend cuda_ipc: decode copies from prefill's "
                  "pool directly, so it stops starting a pull %g s (transfer.timeout_s, at least "
                  "1 s) before prefill frees the KV, and the hold must leave as long again to "
                  "start one: raise it to %g or more, or lower transfer.timeout_s",
                  config.prefill.kv_hold_timeout_s, ipc_margin, 2 * ipc_margin);
    errors.Add("prefill.kv_hold_timeout_s", text);
  }
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

std::string ConfigRelativePath(const ClusterConfig& config, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty() || fs::path(path).is_absolute()) return path;
  const fs::path base = config.source.empty() || config.source[0] == '<'
                            ? fs::current_path(ec)
                            : fs::absolute(config.source, ec).parent_path();
  return (base / path).lexically_normal().string();
}

std::string ChatTemplateSetting(const ClusterConfig& config) {
  const std::string& setting = config.model.chat_template;
  if (setting == "auto" || setting == "none" || setting.empty()) return setting;
  return ConfigRelativePath(config, setting);
}

std::string CudaVisibleDevicesFor(const InstanceSection& section, int index) {
  if (section.device != "cuda" || section.cuda_devices.empty() || index < 0) return "";
  const size_t t = static_cast<size_t>(std::max(section.tensor_parallel, 1));
  const size_t n = section.cuda_devices.size();
  std::string out;
  for (size_t k = 0; k < t; ++k) {  // entries index*t .. index*t+t-1, wrapping
    if (k > 0) out += ",";
    out += section.cuda_devices[(static_cast<size_t>(index) * t + k) % n];
  }
  return out;
}

bool IsMultiHost(const ClusterConfig& config) {
  for (const InstanceSection* s : {&config.prefill, &config.decode, &config.colocated}) {
    if (!s->dns_name.empty()) return true;  // instances found by name: anywhere
    for (const std::string& a : s->addresses)
      if (!IsLoopbackAddress(HostOfAddress(a))) return true;
  }
  return false;
}

StatusOr<std::string> AdvertiseHost(const ClusterConfig& config, const InstanceSection& section,
                                    const std::string& name) {
  const std::string field = name + ".advertise_host";
  std::string host = section.advertise_host.empty() ? section.host : section.advertise_host;
  std::string from = section.advertise_host.empty() ? name + ".host" : field;
  if (const char* env = std::getenv(kAdvertiseHostEnv); env != nullptr && *env != '\0') {
    host = env;
    from = std::string("$") + kAdvertiseHostEnv;
  }
  auto refuse = [&](const std::string& what) {
    return InvalidArgument(config.Where(field) + ": " + field + ": " + what);
  };
  in6_addr buffer{};
  if (::inet_pton(AF_INET, host.c_str(), &buffer) != 1 &&
      ::inet_pton(AF_INET6, host.c_str(), &buffer) != 1)
    return refuse(from + " '" + host + "' is not an IP address");
  if (IsUnspecifiedAddress(host))
    return refuse(from + " is " + host + ", which listens everywhere but cannot be dialed: set " +
                  field + " (or $" + kAdvertiseHostEnv + ") to the address peers reach this "
                  "instance at");
  if (IsLoopbackAddress(host) && IsMultiHost(config))
    return refuse(from + " is the loopback address " + host + ", but the cluster's instances "
                  "are on other machines (S.addresses): they could not reach this one");
  return host;
}

StatusOr<std::string> LoadClusterSecret(const ClusterConfig& config) {
  const std::string field = "control.secret_file";
  auto refuse = [&](const std::string& what) {
    return InvalidArgument(config.Where(field) + ": " + field + ": " + what);
  };
  std::string secret;
  if (!config.control.secret_file.empty()) {
    const std::string path = ConfigRelativePath(config, config.control.secret_file);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
      return refuse("cannot read " + path + ": " + std::strerror(errno));
    if ((st.st_mode & 077) != 0)
      return refuse(path + " is readable by group or others (chmod 600 it): a cluster secret "
                    "must be private to the user that runs the cluster");
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) return refuse("cannot read " + path);
    secret = text.str();
  } else if (const char* env = std::getenv(kClusterSecretEnv); env != nullptr) {
    secret = env;
  } else {
    return refuse(std::string("no cluster secret: set control.secret_file (a file of mode 0600) "
                              "or ") + kClusterSecretEnv + " (tandem up and tandem serve make "
                              "one for their cluster)");
  }
  const size_t begin = secret.find_first_not_of(" \t\r\n");
  const size_t end = secret.find_last_not_of(" \t\r\n");
  secret = begin == std::string::npos ? "" : secret.substr(begin, end - begin + 1);
  if (secret.size() < 16)
    return refuse("the cluster secret is " + std::to_string(secret.size()) +
                  " bytes; at least 16 are needed (64 hex digits from `openssl rand -hex 32`)");
  return secret;
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
