// A fake instance for router tests: speaks the real control protocol over TCP, answers Hello,
// sends LoadReports every 100 ms, records what the router sends (in order) and lets the test
// send Tokens/Finish or pause its heartbeat.
#pragma once

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/net/control_channel.h"
#include "tests/test_control.h"

namespace tandem::test {

using namespace std::chrono_literals;

template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds limit = 5000ms) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

class FakeInstance {
 public:
  FakeInstance(boost::asio::io_context& io, InstanceRole role, int port) : io_(io), role_(role) {
    Listen(port);
    heartbeat_ = std::thread([this] {
      while (!quit_) {
        std::this_thread::sleep_for(100ms);
        std::lock_guard<std::mutex> lock(mutex_);
        if (connection_ && beating_) connection_->Send(report_);
      }
    });
  }
  ~FakeInstance() {
    quit_ = true;
    heartbeat_.join();
    Kill();
  }
  int port() const { return port_; }

  void Listen(int port) {
    auto listener = ControlListener::Listen(io_, "127.0.0.1", port, TestControlOptions(), [this](auto connection) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        connection_ = connection;
      }
      connection->Start([this, connection](ControlMessage m) { OnMessage(connection, m); },
                        [this](const Status&) {
                          std::lock_guard<std::mutex> lock(mutex_);
                          ++closes_;
                        });
    });
    REQUIRE(listener.ok());
    listener_ = std::move(listener).value();
    port_ = listener_->port();
  }
  // Like kill -9: the listener and the connection go away at once.
  void Kill() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (listener_) listener_->Stop();
    if (connection_) connection_->Close();
    connection_.reset();
  }
  void Restart() {
    Kill();
    std::this_thread::sleep_for(50ms);
    Listen(port_);
  }
  void StopHeartbeat() { beating_ = false; }
  void ResumeHeartbeat() { beating_ = true; }
  // What the heartbeat reports from now on (default: an idle instance that took nothing in).
  void SetReport(const LoadReport& report) {
    std::lock_guard<std::mutex> lock(mutex_);
    report_ = report;
  }

  void Send(const ControlMessage& m) {
    std::lock_guard<std::mutex> lock(mutex_);
    REQUIRE(connection_);
    connection_->Send(m);
  }
  void SendTokens(const std::string& id, std::vector<int32_t> ids) {
    Tokens t;
    t.request_id = id;
    for (int32_t x : ids) t.tokens.push_back(GeneratedToken{x, 0, {}});
    Send(t);
  }
  void SendFinish(const std::string& id, std::string reason = "length") {
    Finish f;
    f.request_id = id;
    f.finish_reason = std::move(reason);
    Send(f);
  }
  std::vector<tandem::Submit> submits() {
    std::lock_guard<std::mutex> lock(mutex_);
    return submits_;
  }
  std::vector<std::string> cancels() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cancels_;
  }
  // "submit <id>" and "cancel <id>", in the order they arrived.
  std::vector<std::string> log() {
    std::lock_guard<std::mutex> lock(mutex_);
    return log_;
  }
  // The router's Hellos (their instance_id is its session id), one per connection.
  std::vector<Hello> hellos() {
    std::lock_guard<std::mutex> lock(mutex_);
    return hellos_;
  }
  // Control connections that closed (by either side).
  int closes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return closes_;
  }

 private:
  void OnMessage(const std::shared_ptr<ControlConnection>& connection, ControlMessage m) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto* h = std::get_if<Hello>(&m)) {
      hellos_.push_back(*h);
      Hello hello;
      hello.role = role_;
      hello.name = InstanceRoleName(role_);
      hello.model = "fake";
      hello.control_address = "127.0.0.1:" + std::to_string(port_);
      hello.kv_block_size = 16;
      hello.kv_total_blocks = 1000;
      connection->Send(hello);
    } else if (auto* s = std::get_if<tandem::Submit>(&m)) {
      submits_.push_back(*s);
      log_.push_back("submit " + s->request_id);
    } else if (auto* c = std::get_if<tandem::Cancel>(&m)) {
      cancels_.push_back(c->request_id);
      log_.push_back("cancel " + c->request_id);
    }
  }

  boost::asio::io_context& io_;
  InstanceRole role_;
  int port_ = 0;
  std::atomic<bool> quit_{false};
  std::atomic<bool> beating_{true};
  std::mutex mutex_;
  std::unique_ptr<ControlListener> listener_;
  std::shared_ptr<ControlConnection> connection_;
  std::vector<tandem::Submit> submits_;
  std::vector<std::string> cancels_;
  std::vector<std::string> log_;
  std::vector<Hello> hellos_;
  int closes_ = 0;
  LoadReport report_;
  std::thread heartbeat_;
};

// Two adjacent free ports (instance I listens on base + I).
inline int FreePortPair(boost::asio::io_context& io) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    auto a = ControlListener::Listen(io, "127.0.0.1", 0, TestControlOptions(), [](auto) {});
    REQUIRE(a.ok());
    int base = (*a)->port();
    auto b = ControlListener::Listen(io, "127.0.0.1", base + 1, TestControlOptions(), [](auto) {});
    if (b.ok()) return base;
  }
  FAIL("no two adjacent free ports");
  return 0;
}

}  // namespace tandem::test
