// The checks that a config must pass to be served on this machine, beyond what LoadConfig checks.
//
// LoadConfig accepts what any command can use, including the GPU layouts that `tandem simulate`
// and `tandem plan` read. The commands that run servers (up, serve, prefill, decode, colocated,
// router, check-config) load through LoadServingConfig, which also refuses what no server here
// does, each with the place it was set and the field ("cluster.yaml:7:11: decode.device: ..."):
//   - S.device cuda on a build without CUDA, and on prefill or decode instances unless
//     transfer.backend is cuda_ipc or nccl, or ucx where the UCX at hand moves CUDA memory over
//     transfer.ucx_tls (SetUcxCudaProbe) and tensor_parallel is 1 (their KV is in GPU memory);
//   - S.tensor_parallel > 1 on cpu (a CPU instance is one process; use S.threads);
//     S.pipeline_parallel > 1;
//   - S.cuda_devices on an instance that is not on cuda (it would pick nothing);
//   - S.preemption swap (decode preempts by recompute only);
//   - S.scheduling prefill_first on prefill or decode (only colocated instances schedule steps);
//   - transfer.backend cuda_ipc or nccl on a build without CUDA, or with prefill or decode on
//     cpu;
//   - transfer.backend inproc with prefill or decode instances (each instance is its own
//     process; inproc moves KV within one process, for tests).
// Sizes that need the model (the KV pool against max_model_len and the machine's memory) are
// checked where the model is known: KvPoolBlocks (common/engine/kv_cache.h) and `tandem up`.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/config/config.h"

namespace tandem {

// OK, or InvalidArgument with every problem, one per line.
Status ValidateForServing(const ClusterConfig& config);

// Whether the UCX at hand moves CUDA memory over the transports `tls` (transfer.ucx_tls)
// allows. The commands set it at start (kvtransfer's ProbeUcx, which common/config does not
// link); unset, ValidateForServing takes the answer to be no. Asked only for a cuda instance
// over ucx.
using UcxCudaProbe = bool (*)(const std::string& tls);
void SetUcxCudaProbe(UcxCudaProbe probe);

// LoadConfig (path empty: the defaults) followed by ValidateForServing.
StatusOr<ClusterConfig> LoadServingConfig(const std::string& path,
                                          const std::vector<std::string>& overrides = {});

// The environment variable that carries the cluster secret when control.secret_file is unset.
inline constexpr const char* kClusterSecretEnv = "TANDEM_CLUSTER_SECRET";

// The cluster secret every control peer must prove it holds: the contents of
// control.secret_file (surrounding white space trimmed; a relative path is relative to the config
// file), else $TANDEM_CLUSTER_SECRET. InvalidArgument naming control.secret_file when neither is
// set, when the file cannot be read or is readable by group or others, or when the secret is
// shorter than 16 bytes. The secret itself never appears in a message.
StatusOr<std::string> LoadClusterSecret(const ClusterConfig& config);

// The environment variable that names the address peers dial (a pod's status.podIP).
inline constexpr const char* kAdvertiseHostEnv = "TANDEM_ADVERTISE_HOST";

// With transfer.backend cuda_ipc, how long before prefill's hold on a request's KV ends
// (prefill.kv_hold_timeout_s) decode stops starting its pull: a copy's bound,
// transfer.timeout_s, and at least 1 s. ValidateForServing asks for a hold of twice this.
inline double CudaIpcPullMarginSeconds(double transfer_timeout_s) {
  return transfer_timeout_s > 1.0 ? transfer_timeout_s : 1.0;
}

// The CUDA_VISIBLE_DEVICES of instance `index` of `section`: its S.cuda_devices entry (index
// modulo the list), or with S.tensor_parallel t > 1 its t entries, index*t .. index*t+t-1 (modulo
// the list, comma-separated: its ranks' GPUs 0..t-1); "" to inherit the launcher's (device cpu,
// or no list).
std::string CudaVisibleDevicesFor(const InstanceSection& section, int index);

// Whether the instances of this config run on other machines: some S.addresses entry is not a
// loopback address.
bool IsMultiHost(const ClusterConfig& config);

// The address an instance of `section` (named `name`) gives peers to dial: $TANDEM_ADVERTISE_HOST,
// else S.advertise_host, else S.host. InvalidArgument naming the field when that is 0.0.0.0 / ::
// (S.host listens everywhere: name the one address peers dial), not an IP address, or loopback
// in a multi-host cluster (peers elsewhere cannot dial it).
StatusOr<std::string> AdvertiseHost(const ClusterConfig& config, const InstanceSection& section,
                                    const std::string& name);

// `path` as the config file names it: relative paths are relative to the file's directory (or
// the working directory for a config without a file).
std::string ConfigRelativePath(const ClusterConfig& config, const std::string& path);
// model.chat_template with a file path resolved as ConfigRelativePath does (auto and none as
// they are).
std::string ChatTemplateSetting(const ClusterConfig& config);

// Bytes of memory this process may use: physical memory, or the cgroup's limit when that is
// lower (a container). 0 when neither can be read.
uint64_t MachineMemoryBytes();

// Whether this build has the CUDA libraries (NCCL): TANDEM_CUDA=ON with a CUDA compiler.
bool BuiltWithCuda();

}  // namespace tandem
