// ClusterBackend's DNS discovery: every A/AAAA record of S.dns_name is an instance of that role
// (a Kubernetes headless Service lists its ready pods so). Resolved at Start and then every
// control.discovery_interval_s on the discovery thread, never under the backend's mutex.
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>

#include "common/base/log.h"
#include "router/cluster_backend.h"
#include "router/cluster_backend_state.h"

namespace tandem {
namespace {

const char* RoleSection(InstanceRole role) {
  switch (role) {
    case InstanceRole::kPrefill: return "prefill";
    case InstanceRole::kDecode: return "decode";
    default: return "colocated";
  }
}

}  // namespace

std::vector<int>& ClusterBackend::IdsOfLocked(InstanceRole role) {
  if (role == InstanceRole::kPrefill) return prefill_;
  if (role == InstanceRole::kDecode) return decode_;
  return colocated_;
}

int ClusterBackend::AddInstanceLocked(InstanceRole role, const std::string& address) {
  std::vector<int>& ids = IdsOfLocked(role);
  auto instance = std::make_unique<Instance>();
  instance->role = role;
  instance->name = std::string(RoleSection(role)) + "-" + std::to_string(ids.size());
  instance->address = address;
  instance->backoff_s = options_.backoff_initial_s;
  const int index = static_cast<int>(instances_.size());
  ids.push_back(index);
  instances_.push_back(std::move(instance));
  return index;
}

void ClusterBackend::AddSectionLocked(const InstanceSection& section, InstanceRole role) {
  if (!section.dns_name.empty()) {
    const size_t colon = section.dns_name.rfind(':');
    dns_targets_.push_back({role, section.dns_name.substr(0, colon),
                            std::stoi(section.dns_name.substr(colon + 1))});
    return;
  }
  const bool listed = !section.addresses.empty();
  const int count = listed ? static_cast<int>(section.addresses.size()) : section.instances;
  for (int i = 0; i < count; ++i)
    AddInstanceLocked(role, listed ? section.addresses[i]
                                   : options_.host + ":" + std::to_string(section.port + i));
}

bool ClusterBackend::ConfiguredLocked(InstanceRole role) {
  for (const DnsTarget& t : dns_targets_)
    if (t.role == role) return true;
  return !IdsOfLocked(role).empty();
}

StatusOr<std::vector<std::string>> ClusterBackend::Resolve(const DnsTarget& target) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(target.name.c_str(), nullptr, &hints, &list);
  if (rc != 0) return Unavailable("cannot resolve " + target.name + ": " + gai_strerror(rc));
  std::set<std::string> found;
  for (addrinfo* a = list; a != nullptr; a = a->ai_next) {
    char host[NI_MAXHOST];
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, host, sizeof host, nullptr, 0,
                      NI_NUMERICHOST) != 0)
      continue;
    const std::string ip = host;
    const bool v6 = ip.find(':') != std::string::npos;
    found.insert((v6 ? "[" + ip + "]" : ip) + ":" + std::to_string(target.port));
  }
  ::freeaddrinfo(list);
  return std::vector<std::string>(found.begin(), found.end());
}

void ClusterBackend::Discover() {
  for (const DnsTarget& target : dns_targets_) {
    StatusOr<std::vector<std::string>> addresses = Resolve(target);
    MutexLock lock(&mutex_);
    if (!addresses.ok()) {
      // A DNS hiccup must not drain the cluster: the instances known stay as they are.
      TANDEM_LOG(kWarn) << RoleSection(target.role) << ".dns_name: "
                        << addresses.status().message() << "; keeping the instances known";
      continue;
    }
    ApplyDiscoveryLocked(target, *addresses);
  }
}

// As MonitorLoop: mutex_ is held except between unlock() and lock().
void ClusterBackend::DiscoveryLoop() TANDEM_NO_THREAD_SAFETY_ANALYSIS {
  const auto interval =
      std::chrono::milliseconds(static_cast<int64_t>(control_.discovery_interval_s * 1000));
  std::unique_lock<Mutex> lock(mutex_);
  while (!monitor_cv_.wait_for(lock, interval,
                               [this]() TANDEM_REQUIRES(mutex_) { return stopping_; })) {
    lock.unlock();
    Discover();
    lock.lock();
  }
}

void ClusterBackend::ApplyDiscoveryLocked(const DnsTarget& target,
                                          const std::vector<std::string>& addresses) {
  const std::set<std::string> now(addresses.begin(), addresses.end());
  std::set<std::string> known;
  for (int index : IdsOfLocked(target.role)) {
    Instance& x = *instances_[index];
    known.insert(x.address);
    const bool listed = now.count(x.address) > 0;
    if (!listed && !x.retired) {
      x.retired = true;
      TANDEM_LOG(kInfo) << "instance " << x.name << " at " << x.address << " left "
                        << target.name << ": draining (no new requests)";
    } else if (listed && x.retired) {
      x.retired = false;
      x.next_attempt = Clock::now();
      TANDEM_LOG(kInfo) << "instance " << x.name << " at " << x.address << " is back in "
                        << target.name;
    }
  }
  for (const std::string& address : now) {
    if (known.count(address)) continue;
    const int index = AddInstanceLocked(target.role, address);
    TANDEM_LOG(kInfo) << "instance " << instances_[index]->name << " at " << address
                      << " joined " << target.name;
  }
}

}  // namespace tandem
