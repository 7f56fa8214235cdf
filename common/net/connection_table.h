// The control connections an instance holds, by id, and which of them are router sessions.
//
// Every connection (accepted or outbound) gets an id. A connection whose peer said Hello with role
// router is a router session: its id is the Hello's instance_id (the router draws a fresh one per
// connection; control_wire.h Submit.decode_session). A session is open while one of its
// connections is; the router gives a session up by closing it, so an instance learns from this
// table which requests are still wanted. Every router connection receives LoadReports.
//
// Thread-safe: io threads add, mark and remove; any thread looks up and sends.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "common/base/thread_annotations.h"
#include "common/net/control_channel.h"

namespace tandem {

using ConnId = uint64_t;  // never 0

class ConnectionTable {
 public:
  using ConnPtr = std::shared_ptr<ControlConnection>;

  // Registers a connection and returns its id.
  ConnId Add(ConnPtr conn);
  // The connection said Hello as a router with session id `session`.
  void MarkRouter(ConnId id, uint64_t session);
  void Remove(ConnId id);

  ConnPtr Get(ConnId id) const;
  // Queues `message` on connection `id`; false when it is gone or closed.
  bool Send(ConnId id, const ControlMessage& message) const;

  // The open connection of router session `session` (the latest, when the router reused an id),
  // or nothing when the session is closed.
  std::optional<ConnId> RouterSession(uint64_t session) const;
  // Whether connection `id` is a router's, and its session.
  std::optional<uint64_t> SessionOf(ConnId id) const;
  std::vector<ConnPtr> Routers() const;

  size_t size() const;
  // CloseAfterFlush on every connection.
  void CloseAllAfterFlush() const;
  void CloseAll() const;

 private:
  struct Entry {
    ConnPtr conn;
    std::optional<uint64_t> session;  // set for a router connection
  };
  mutable Mutex mutex_;
  std::map<ConnId, Entry> conns_ TANDEM_GUARDED_BY(mutex_);
  ConnId next_id_ TANDEM_GUARDED_BY(mutex_) = 1;
};

}  // namespace tandem
