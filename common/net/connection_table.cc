#include "common/net/connection_table.h"

namespace tandem {

ConnId ConnectionTable::Add(ConnPtr conn) {
  MutexLock lock(&mutex_);
  const ConnId id = next_id_++;
  conns_[id] = Entry{std::move(conn), std::nullopt};
  return id;
}

void ConnectionTable::MarkRouter(ConnId id, uint64_t session) {
  MutexLock lock(&mutex_);
  if (auto it = conns_.find(id); it != conns_.end()) it->second.session = session;
}

void ConnectionTable::Remove(ConnId id) {
  MutexLock lock(&mutex_);
  conns_.erase(id);
}

ConnectionTable::ConnPtr ConnectionTable::Get(ConnId id) const {
  MutexLock lock(&mutex_);
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.conn;
}

bool ConnectionTable::Send(ConnId id, const ControlMessage& message) const {
  ConnPtr conn = Get(id);
  return conn != nullptr && conn->Send(message);
}

std::optional<ConnId> ConnectionTable::RouterSession(uint64_t session) const {
  MutexLock lock(&mutex_);
  std::optional<ConnId> found;
  for (const auto& [id, entry] : conns_)
    if (entry.session == session && !entry.conn->closed()) found = id;  // ids grow: the latest
  return found;
}

std::optional<uint64_t> ConnectionTable::SessionOf(ConnId id) const {
  MutexLock lock(&mutex_);
  auto it = conns_.find(id);
  return it == conns_.end() ? std::nullopt : it->second.session;
}

std::vector<ConnectionTable::ConnPtr> ConnectionTable::Routers() const {
  std::vector<ConnPtr> routers;
  MutexLock lock(&mutex_);
  for (const auto& [id, entry] : conns_)
    if (entry.session) routers.push_back(entry.conn);
  return routers;
}

size_t ConnectionTable::size() const {
  MutexLock lock(&mutex_);
  return conns_.size();
}

void ConnectionTable::CloseAllAfterFlush() const {
  MutexLock lock(&mutex_);
  for (const auto& [id, entry] : conns_) entry.conn->CloseAfterFlush();
}

void ConnectionTable::CloseAll() const {
  MutexLock lock(&mutex_);
  for (const auto& [id, entry] : conns_) entry.conn->Close();
}

}  // namespace tandem
