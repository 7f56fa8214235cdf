// The control connections an instance holds, by id, and which of them are routers.
//
// Prefill, decode and colocated servers all keep the same table: every connection (accepted or
// outbound) gets an id; a connection that said Hello with role router is a router; the most
// recent live router receives Tokens/Finish (one router per cluster), and every router receives
// LoadReports. Thread-safe: io threads add/remove, the engine thread looks up.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/net/control_channel.h"

namespace tandem {

class ConnectionTable {
 public:
  using ConnPtr = std::shared_ptr<ControlConnection>;

  // Registers a connection and returns its id (never 0).
  uint64_t Add(ConnPtr conn) {
    const uint64_t id = next_id_++;
    std::lock_guard<std::mutex> lock(mutex_);
    conns_[id] = std::move(conn);
    return id;
  }

  // The connection `id` said Hello as a router.
  void MarkRouter(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    router_ids_.push_back(id);
  }

  void Remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    conns_.erase(id);
    std::erase(router_ids_, id);
  }

  // The current router (the last that said Hello and is still connected), or null.
  ConnPtr Router() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (router_ids_.empty()) return nullptr;
    auto it = conns_.find(router_ids_.back());
    return it == conns_.end() ? nullptr : it->second;
  }

  std::vector<ConnPtr> Routers() const {
    std::vector<ConnPtr> routers;
    std::lock_guard<std::mutex> lock(mutex_);
    for (uint64_t id : router_ids_)
      if (auto it = conns_.find(id); it != conns_.end()) routers.push_back(it->second);
    return routers;
  }

  void CloseAll() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [id, conn] : conns_) conn->Close();
  }

 private:
  mutable std::mutex mutex_;
  std::map<uint64_t, ConnPtr> conns_;
  std::vector<uint64_t> router_ids_;  // in Hello order; back() is the current router
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace tandem
