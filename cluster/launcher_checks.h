// What `tandem up` checks before it starts a child, so that a cluster that cannot run stops at
// start-up with a message naming the field instead of restarting a child for ever; and the
// config snapshot the children run on.
//
// Every function here is a plain function of the config (and of this machine's sockets and
// memory where it says so); none starts a process.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "common/base/status.h"
#include "common/config/config.h"
#include "common/engine/kv_cache.h"

namespace tandem {

// The layout of the cluster, with no socket opened: at least one instance (a prefill+decode pair
// or a colocated instance; prefill without decode and the reverse are refused); router.host an IP
// address; every port that a child binds (router.port, S.port + I, S.metrics_port + I) in
// [1, 65535] and used once; instances on cuda that share a GPU (S.cuda_devices, or the launcher's
// GPUs they inherit) without kv_cache.memory_fraction shares that add up past
// kMaxKvMemoryShare. Ports left at 0 (PickPorts picks them) are not checked. InvalidArgument
// with every problem, one per line, each naming where the field was set and the field.
Status CheckClusterLayout(const ClusterConfig& config);

// Every port that a child binds, other than those left at 0, is free now (router.port on
// router.host, the instances' on 127.0.0.1). Unavailable naming the field and the port otherwise.
Status CheckPortsFree(const ClusterConfig& config);

// Every CPU instance's KV pool (KvPoolBlocks) for a model whose KV has `layout`, and all of them
// together within kMaxKvMemoryShare of `machine_bytes` (0: not checked). Instances on `cuda`
// keep their pools in device memory: each checks its own GPU when it starts.
Status CheckKvMemory(const ClusterConfig& config, const KvLayout& layout, uint64_t machine_bytes);

// The config the children run on, readable from any directory: model.path,
// router.latency_model and router.api_keys_file absolute (the latter two relative to the config
// file's directory, model.path to the working directory), model.name fixed to the served name.
ClusterConfig SnapshotConfig(const ClusterConfig& config);

// Who holds the socket that listens on a TCP port, as /proc tells it (WhoListensOn).
enum class PortHolder {
  kThisProcess,   // the process asked about holds it: an answer on the port comes from it
  kOtherProcess,  // a listener is listed, and none of the process's file descriptors is it
  kUnknown,       // /proc does not tell: its socket tables or the process's fds are unreadable,
                  // or they list no listener on the port (a sandboxed kernel, such as gVisor)
};

// Which process holds the socket that listens on TCP `port`, asked for process `pid`: the
// listening sockets' inodes from `proc`/net/tcp and tcp6, matched against the socket links in
// `proc`/PID/fd. Meant for a port something has just answered on, so that a listener exists:
// where /proc lists none, it cannot tell (kUnknown), rather than blaming another process.
PortHolder WhoListensOn(pid_t pid, int port, const std::filesystem::path& proc = "/proc");

}  // namespace tandem
