// An io_context running on its own thread for a test's lifetime (tests of Asio-based code).
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <thread>

namespace tandem::test {

struct IoThread {
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard{io.get_executor()};
  std::thread thread{[this] { io.run(); }};
  ~IoThread() {
    guard.reset();
    io.stop();
    thread.join();
  }
};

}  // namespace tandem::test
