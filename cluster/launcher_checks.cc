#include "cluster/launcher_checks.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "common/config/serving_config.h"
#include "common/model/model_store.h"

namespace tandem {
namespace {

struct BoundPort {
  std::string field;  // "decode.port"
  std::string who;    // "decode-1"
  int port = 0;
};

// Every port a child of `up` binds, in a fixed order (router first); those left at 0 (for
// PickPorts) are not listed.
std::vector<BoundPort> BoundPorts(const ClusterConfig& c) {
  std::vector<BoundPort> out;
  if (c.router.port != 0) out.push_back({"router.port", "the router", c.router.port});
  const auto sections = InstanceSections(c);
  for (auto& [name, s] : sections) {
    for (int i = 0; i < s->instances; ++i) {
      const std::string who = std::string(name) + "-" + std::to_string(i);
      if (s->port > 0) out.push_back({std::string(name) + ".port", who, s->port + i});
      if (s->metrics_port > 0)
        out.push_back({std::string(name) + ".metrics_port", who + " (metrics)", s->metrics_port + i});
    }
  }
  return out;
}

std::string Join(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += (out.empty() ? "" : "\n") + l;
  return out;
}

// Binds a TCP socket to host:port (port 0: any) and closes it; "" or the error.
std::string TryBind(const std::string& host, int port) {
  sockaddr_storage storage{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    length = sizeof *v4;
  } else if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    length = sizeof *v6;
  } else {
    return "not an IP address";
  }
  int fd = ::socket(storage.ss_family, SOCK_STREAM, 0);
  if (fd < 0) return std::strerror(errno);
  int one = 1;
  // As the servers bind: SO_REUSEADDR lets a port in TIME_WAIT be taken, not one that listens.
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  std::string error;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0) error = std::strerror(errno);
  ::close(fd);
  return error;
}

// Socket inodes that listen on `port` in `proc`/net/tcp or tcp6; empty where neither table can
// be read or neither lists one.
std::set<std::string> ListeningInodes(int port, const std::filesystem::path& proc) {
  std::set<std::string> inodes;
  for (const char* table : {"net/tcp", "net/tcp6"}) {
    std::ifstream in(proc / table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
            timeout >> inode))
        continue;
      const size_t colon = local.rfind(':');
      if (state != "0A" || colon == std::string::npos) continue;  // 0A = LISTEN
      if (std::strtol(local.c_str() + colon + 1, nullptr, 16) == port) inodes.insert(inode);
    }
  }
  return inodes;
}

// "" when no GPU is shared by instances whose pools' kv_cache.memory_fraction shares of it add
// up past kMaxKvMemoryShare; else what is wrong with the first such GPU. Each instance on cuda
// without S.kv_blocks sizes its pool (each rank's) at that share of the GPU's memory, so two on
// one GPU take twice it. A GPU is an entry of S.cuda_devices, or rank r of the launcher's own
// GPUs for an instance that inherits them; entries that name one GPU two ways (an ordinal and
// its UUID) are not matched here (start-up's free-memory check catches those).
std::string GpuMemoryShares(const ClusterConfig& c) {
  std::map<std::string, std::vector<std::string>> users;  // GPU -> "prefill-0", ...
  for (auto& [role, s] : InstanceSections(c)) {
    if (s->device != "cuda" || s->kv_blocks > 0) continue;
    for (int i = 0; i < s->instances; ++i) {
      const std::string who = std::string(role) + "-" + std::to_string(i);
      const std::string list = CudaVisibleDevicesFor(*s, i);
      auto use = [&](const std::string& gpu) {
        std::vector<std::string>& on = users[gpu];
        if (on.empty() || on.back() != who) on.push_back(who);
      };
      if (list.empty()) {
        for (int r = 0; r < std::max(s->tensor_parallel, 1); ++r)
          use("the launcher's GPU " + std::to_string(r));
        continue;
      }
      std::stringstream entries(list);
      for (std::string gpu; std::getline(entries, gpu, ',');) use("GPU " + gpu);
    }
  }
  const double fraction = c.kv_cache.memory_fraction;
  for (const auto& [gpu, who] : users) {
    const double sum = fraction * static_cast<double>(who.size());
    if (who.size() < 2 || sum <= kMaxKvMemoryShare + 1e-9) continue;
    std::string names;
    for (const std::string& w : who) names += (names.empty() ? "" : ", ") + w;
    auto number = [](const char* format, double value) {
      char text[32];
      std::snprintf(text, sizeof text, format, value);
      return std::string(text);
    };
    const double fair = std::floor(kMaxKvMemoryShare / static_cast<double>(who.size()) * 100) / 100;
    return number("%g", fraction) + " for each of the " + std::to_string(who.size()) +
           " instances on " + gpu + " (" + names + ") adds up to " + number("%.2f", sum) +
           " of its memory, more than " + number("%.2f", kMaxKvMemoryShare) + ": lower it to " +
           number("%.2f", fair) + " or less (a little less leaves room for their weights and " +
           "buffers), or give the instances GPUs of their own (S.cuda_devices)";
  }
  return "";
}

}  // namespace

Status CheckClusterLayout(const ClusterConfig& c) {
  std::vector<std::string> errors;
  auto add = [&](const std::string& field, const std::string& what) {
    errors.push_back(c.Where(field) + ": " + field + ": " + what);
  };
  const bool prefill = c.prefill.instances > 0, decode = c.decode.instances > 0;
  if (!prefill && !decode && c.colocated.instances == 0)
    add("colocated.instances",
        "the cluster has no instances: set prefill.instances and decode.instances (a "
        "disaggregated pair) or colocated.instances to at least 1");
  if (prefill && !decode)
    add("decode.instances", "is 0, so the prefill instances' requests could never be decoded");
  if (decode && !prefill)
    add("prefill.instances", "is 0, so the decode instances would never get a request");
  for (auto& [name, s] : InstanceSections(c)) {
    if (!s->addresses.empty() || !s->dns_name.empty())
      add(std::string(name) + (s->addresses.empty() ? ".dns_name" : ".addresses"),
          "tandem up starts every instance itself, on this machine; S.addresses is for a router "
          "whose instances run elsewhere (start them with tandem prefill|decode|colocated there)");
  }
  // NCCL joins one prefill GPU and one decode GPU per link and refuses two ranks on one GPU:
  // every instance of one role on GPUs the other role's do not use.
  if (c.transfer.backend == "nccl" && prefill && decode) {
    std::map<std::string, std::set<std::string>> gpus;  // role -> the GPUs its instances use
    bool inherit = false;
    for (const char* role : {"prefill", "decode"}) {
      const InstanceSection& s = std::string(role) == "prefill" ? c.prefill : c.decode;
      for (int i = 0; i < s.instances; ++i) {
        const std::string list = CudaVisibleDevicesFor(s, i);
        inherit = inherit || list.empty();
        std::stringstream entries(list);
        for (std::string gpu; std::getline(entries, gpu, ',');) gpus[role].insert(gpu);
      }
    }
    std::vector<std::string> shared;
    std::set_intersection(gpus["prefill"].begin(), gpus["prefill"].end(),
                          gpus["decode"].begin(), gpus["decode"].end(),
                          std::back_inserter(shared));
    if (inherit)
      add("transfer.backend",
          "nccl needs prefill and decode on different GPUs (NCCL puts no two ranks of a link on "
          "one GPU), and tandem up starts them all on this machine: set prefill.cuda_devices and "
          "decode.cuda_devices to GPUs that differ");
    else if (!shared.empty())
      add("decode.cuda_devices",
          "GPU '" + shared.front() + "' is also a prefill instance's (prefill.cuda_devices), and "
          "transfer.backend nccl puts no two ranks of a link on one GPU: give decode other GPUs");
  }
  if (std::string error = GpuMemoryShares(c); !error.empty())
    add("kv_cache.memory_fraction", error);
  if (std::string error = TryBind(c.router.host, 0); error == "not an IP address")
    add("router.host", "'" + c.router.host + "' is not an IP address (e.g. 127.0.0.1, 0.0.0.0)");
  else if (!error.empty())
    add("router.host", "cannot listen on '" + c.router.host + "': " + error);
  std::map<int, const BoundPort*> owner;
  const std::vector<BoundPort> ports = BoundPorts(c);
  for (const BoundPort& p : ports) {
    if (p.port < 1 || p.port > 65535) {
      add(p.field, p.who + " would listen on port " + std::to_string(p.port) +
                       ", outside [1, 65535]");
      continue;
    }
    auto [it, inserted] = owner.emplace(p.port, &p);
    if (!inserted)
      add(p.field, p.who + " would listen on port " + std::to_string(p.port) + ", as " +
                       it->second->who + " (" + it->second->field + ") does");
  }
  if (errors.empty()) return Status::Ok();
  return InvalidArgument(Join(errors));
}

Status CheckPortsFree(const ClusterConfig& c) {
  std::vector<std::string> errors;
  for (const BoundPort& p : BoundPorts(c)) {
    const std::string host = p.field == "router.port" ? c.router.host : "127.0.0.1";
    if (std::string error = TryBind(host, p.port); !error.empty())
      errors.push_back(c.Where(p.field) + ": " + p.field + ": " + p.who + " cannot listen on " +
                       host + ":" + std::to_string(p.port) + ": " + error +
                       " (another process holds it: stop it or pick another port)");
  }
  if (errors.empty()) return Status::Ok();
  return Unavailable(Join(errors));
}

Status CheckKvMemory(const ClusterConfig& c, const KvLayout& layout, uint64_t machine_bytes) {
  const auto sections = InstanceSections(c);
  const double block_bytes = static_cast<double>(layout.block_bytes()) * layout.num_layers;
  double total = 0;
  int instances = 0;
  std::string fields;
  for (auto& [name, s] : sections) {
    // A pool on a GPU is not this machine's memory (the instance sizes it from the device's).
    if (s->instances <= 0 || s->device != "cpu") continue;
    TANDEM_ASSIGN_OR_RETURN(int blocks, KvPoolBlocks(c, *s, layout, machine_bytes));
    total += blocks * block_bytes * s->instances;
    instances += s->instances;
    if (s->kv_blocks > 0) fields += std::string(fields.empty() ? "" : ", ") + name + ".kv_blocks";
  }
  if (machine_bytes == 0 || total <= kMaxKvMemoryShare * static_cast<double>(machine_bytes))
    return Status::Ok();
  const std::string field = fields.empty() ? "kv_cache.memory_fraction" : fields;
  char text[200];
  std::snprintf(text, sizeof text,
                "the KV pools of the %d instance(s) take %.2f GiB together, more than %.0f%% of "
                "this machine's %.2f GiB",
                instances, total / (1 << 30), kMaxKvMemoryShare * 100,
                static_cast<double>(machine_bytes) / (1 << 30));
  const std::string where = fields.empty() ? c.Where("kv_cache.memory_fraction") : c.source;
  return InvalidArgument(where + ": " + field + ": " + text);
}

ClusterConfig SnapshotConfig(const ClusterConfig& config) {
  namespace fs = std::filesystem;
  ClusterConfig out = config;
  out.model.name = ServedModelName(config.model);
  std::error_code ec;
  if (!config.model.path.empty()) out.model.path = fs::absolute(config.model.path, ec).string();
  // Files named relative to the config file: the snapshot lives elsewhere.
  out.control.secret_file = ConfigRelativePath(config, config.control.secret_file);
  out.router.latency_model = ConfigRelativePath(config, config.router.latency_model);
  out.router.api_keys_file = ConfigRelativePath(config, config.router.api_keys_file);
  out.model.chat_template = ChatTemplateSetting(config);
  return out;
}

PortHolder WhoListensOn(pid_t pid, int port, const std::filesystem::path& proc) {
  const std::set<std::string> inodes = ListeningInodes(port, proc);
  if (inodes.empty()) return PortHolder::kUnknown;
  std::error_code ec;
  std::filesystem::directory_iterator fds(proc / std::to_string(pid) / "fd", ec);
  if (ec) return PortHolder::kUnknown;
  // increment(ec), not a range-for: the process may exit while its fds are listed.
  for (; fds != std::filesystem::directory_iterator(); fds.increment(ec)) {
    if (ec) return PortHolder::kUnknown;
    std::error_code link_ec;
    std::string target = std::filesystem::read_symlink(fds->path(), link_ec).string();
    if (link_ec || target.rfind("socket:[", 0) != 0) continue;
    if (inodes.count(target.substr(8, target.size() - 9))) return PortHolder::kThisProcess;
  }
  return ec ? PortHolder::kUnknown : PortHolder::kOtherProcess;
}

}  // namespace tandem
