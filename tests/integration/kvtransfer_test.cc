// kvtransfer between two real processes on 127.0.0.1: this test process pulls (decode side);
// a child process publishes (prefill side). The child is this same binary re-executed with the
// hidden test case "kvtransfer publisher child" selected, so it starts with a fresh UCX (no
// fork of a process whose UCX threads are running) and needs no extra build target.
//
// Control plane: one loopback TCP connection, frames of u32 length + u8 kind + payload;
// PeerInfo and KvDescriptor travel in their kvtransfer wire encoding.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/base/metrics.h"
#include "kvtransfer/transfer.h"
#include "kvtransfer/ucx_transport.h"
#include "tests/test_ucx.h"

extern char** environ;

namespace tandem {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kLayers = 2;
constexpr uint32_t kBlocks = 256;  // per layer, both sides
constexpr uint32_t kMaxBlocksPerRequest = 16;
constexpr uint32_t kWindow = kBlocks / kMaxBlocksPerRequest;  // requests in flight

// ---- framing over a blocking socket, every wait bounded ----

bool WaitReadable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

bool ReadAll(int fd, void* buf, size_t n, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || !WaitReadable(fd, left)) return false;
    ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= r;
  }
  return true;
}

bool WriteAll(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= w;
  }
  return true;
}

bool SendFrame(int fd, char kind, const std::string& payload) {
  uint32_t len = static_cast<uint32_t>(payload.size() + 1);
  std::string frame(reinterpret_cast<char*>(&len), 4);
  frame.push_back(kind);
  frame += payload;
  return WriteAll(fd, frame.data(), frame.size());
}

// Returns false on timeout, EOF or an oversized frame.
bool RecvFrame(int fd, char* kind, std::string* payload, std::chrono::milliseconds timeout) {
  uint32_t len = 0;
  if (!ReadAll(fd, &len, 4, timeout) || len == 0 || len > (16u << 20)) return false;
  std::string body(len, '\0');
  if (!ReadAll(fd, body.data(), len, timeout)) return false;
  *kind = body[0];
  *payload = body.substr(1);
  return true;
}

template <typename T>
void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(v));
}
template <typename T>
T Get(const std::string& s, size_t* at) {
  T v;
  REQUIRE(*at + sizeof(T) <= s.size());
  std::memcpy(&v, s.data() + *at, sizeof(T));
  *at += sizeof(T);
  return v;
}

uint64_t Checksum(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// A pool of kBlocks blocks per layer, laid out [layer][block][bytes] as the KV cache is.
class BlockPool {
 public:
  static size_t Bytes(size_t block_bytes) { return kLayers * kBlocks * block_bytes; }
  // Over `external` (Bytes(block_bytes) long, not owned) or over memory of its own.
  BlockPool(size_t block_bytes, uint64_t seed, void* external = nullptr)
      : block_bytes_(block_bytes), rng_(seed) {
    if (external == nullptr) own_.resize(Bytes(block_bytes));
    base_ = external ? static_cast<uint8_t*>(external) : own_.data();
    for (uint32_t b = 0; b < kBlocks; ++b) free_.push_back(b);
  }
  MemoryRegion region() { return {base_, Bytes(block_bytes_)}; }
  size_t block_bytes() const { return block_bytes_; }
  uint64_t Offset(uint32_t layer, uint32_t block) const {
    return (static_cast<uint64_t>(layer) * kBlocks + block) * block_bytes_;
  }
  uint8_t* Data(uint32_t layer, uint32_t block) { return base_ + Offset(layer, block); }
  // Random free blocks (not contiguous), or empty if too few are free.
  std::vector<uint32_t> Allocate(uint32_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.size() < n) return {};
    std::vector<uint32_t> out;
    for (uint32_t i = 0; i < n; ++i) {
      size_t k = rng_() % free_.size();
      out.push_back(free_[k]);
      free_[k] = free_.back();
      free_.pop_back();
    }
    return out;
  }
  void Free(const std::vector<uint32_t>& blocks) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.insert(free_.end(), blocks.begin(), blocks.end());
  }
  size_t free_count() {
    std::lock_guard<std::mutex> lock(mutex_);
    return free_.size();
  }
  LayerRanges Ranges(const std::vector<uint32_t>& blocks) const {
    LayerRanges layers(kLayers);
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t b : blocks) layers[l].push_back({Offset(l, b), block_bytes_});
    }
    return layers;
  }

 private:
  size_t block_bytes_;
  std::vector<uint8_t> own_;
  uint8_t* base_;
  std::mutex mutex_;
  std::vector<uint32_t> free_;
  std::mt19937_64 rng_;
};

// ---- the publisher child ----

// Hidden: runs only when the parent re-executes this binary with the test's name.
TEST_CASE("kvtransfer publisher child", "[.kvtransfer_child]") {
  const char* port = getenv("TANDEM_KV_CHILD_PORT");
  if (port == nullptr) return;
  const char* tls = getenv("TANDEM_KV_CHILD_TLS");
  const char* block_bytes = getenv("TANDEM_KV_CHILD_BLOCK_BYTES");
  UcxOptions options = test::TestUcxOptions(tls);
  options.lease_timeout = 10s;
  // TANDEM_KV_CHILD_UCX_POOL=1: UCX allocates the pool (shared memory, the fast sm path).
  const char* ucx_pool = getenv("TANDEM_KV_CHILD_UCX_POOL");
  size_t bytes = BlockPool::Bytes(std::stoul(block_bytes));
  std::shared_ptr<UcxPool> ucx_memory;
  StatusOr<std::unique_ptr<KvPublisher>> publisher = InvalidArgument("unused");
  if (ucx_pool && std::string(ucx_pool) == "1") {
    auto allocated = AllocateUcxPool(bytes, options);
    REQUIRE(allocated.ok());
    ucx_memory = *allocated;
    publisher = CreateUcxPublisher(ucx_memory, options);
  }
  std::unique_ptr<BlockPool> pool_owner;
  if (publisher.ok()) {
    pool_owner =
        std::make_unique<BlockPool>(std::stoul(block_bytes), getpid(), ucx_memory->region().base);
  } else {
    pool_owner = std::make_unique<BlockPool>(std::stoul(block_bytes), getpid());
    publisher = CreateUcxPublisher(pool_owner->region(), options);
  }
  REQUIRE(publisher.ok());
  BlockPool& pool = *pool_owner;

  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(port)));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  REQUIRE(SendFrame(fd, 'I', Encode((*publisher)->peer_info())));

  std::mt19937_64 rng(getpid());
  for (;;) {
    char kind;
    std::string payload;
    if (!RecvFrame(fd, &kind, &payload, 60s)) break;
    if (kind == 'Q') break;
    if (kind == 'S') {
      // Wait (bounded) for the release messages of the last pulls, then report the pool.
      auto deadline = Clock::now() + 5s;
      while ((*publisher)->published_count() > 0 && Clock::now() < deadline) {
        std::this_thread::sleep_for(1ms);
      }
      std::string out;
      Put<uint32_t>(&out, static_cast<uint32_t>(pool.free_count()));
      REQUIRE(SendFrame(fd, 'S', out));
      continue;
    }
    REQUIRE(kind == 'P');
    size_t at = 0;
    uint32_t request_no = Get<uint32_t>(payload, &at);
    uint32_t n = Get<uint32_t>(payload, &at);
    // Releases come back asynchronously (the puller's result message), so the pool may be
    // briefly short: wait for blocks, bounded, as a prefill server would.
    std::vector<uint32_t> blocks = pool.Allocate(n);
    for (auto deadline = Clock::now() + 5s; blocks.empty() && Clock::now() < deadline;) {
      std::this_thread::sleep_for(100us);
      blocks = pool.Allocate(n);
    }
    REQUIRE(blocks.size() == n);
    std::string sums;
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t b : blocks) {
        uint8_t* p = pool.Data(l, b);
        for (size_t i = 0; i < pool.block_bytes(); i += 8) {
          uint64_t v = rng();
          std::memcpy(p + i, &v, std::min<size_t>(8, pool.block_bytes() - i));
        }
        Put<uint64_t>(&sums, Checksum(p, pool.block_bytes()));
      }
    }
    auto d = (*publisher)->Publish("req-" + std::to_string(request_no), pool.Ranges(blocks),
                                   [&pool, blocks](const std::string&, const Status&) {
                                     pool.Free(blocks);
                                   });
    REQUIRE(d.ok());
    std::string out;
    std::string desc = Encode(*d);
    Put<uint32_t>(&out, static_cast<uint32_t>(desc.size()));
    out += desc;
    out += sums;
    REQUIRE(SendFrame(fd, 'D', out));
  }
  close(fd);
  publisher->reset();  // unmaps a UCX-allocated pool: pool_owner is not used after this
}

// ---- the puller side (this process) ----

class Child {
 public:
  Child(const std::string& tls, size_t block_bytes, bool ucx_pool = false) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(listen(listen_fd_, 1) == 0);
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    // Everything exec needs is built before fork: the child may only call exec.
    std::vector<std::string> env_strings = {
        "TANDEM_KV_CHILD_PORT=" + std::to_string(ntohs(addr.sin_port)),
        "TANDEM_KV_CHILD_TLS=" + tls, "TANDEM_KV_CHILD_BLOCK_BYTES=" + std::to_string(block_bytes),
        std::string("TANDEM_KV_CHILD_UCX_POOL=") + (ucx_pool ? "1" : "0")};
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    for (char** e = environ; *e; ++e) envp.push_back(*e);
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", name = "kvtransfer publisher child";
    std::string quiet = "--out=/dev/null";
    char* argv[] = {exe.data(), name.data(), quiet.data(), nullptr};
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      execve(exe.c_str(), argv, envp.data());
      _exit(127);
    }
    REQUIRE(WaitReadable(listen_fd_, 20s));
    fd_ = accept(listen_fd_, nullptr, nullptr);
    REQUIRE(fd_ >= 0);
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char kind;
    std::string payload;
    REQUIRE(RecvFrame(fd_, &kind, &payload, 20s));
    REQUIRE(kind == 'I');
    auto info = DecodePeerInfo(AsBytes(payload));
    REQUIRE(info.ok());
    info_ = *info;
  }
  ~Child() {
    if (fd_ >= 0) close(fd_);
    if (listen_fd_ >= 0) close(listen_fd_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int fd() const { return fd_; }
  pid_t pid() const { return pid_; }
  const PeerInfo& info() const { return info_; }
  // Asks the child to quit and waits (bounded) for a clean exit.
  int Quit() {
    SendFrame(fd_, 'Q', "");
    for (int i = 0; i < 1000; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }
  void Kill(int signal) {
    kill(pid_, signal);
    if (signal == SIGKILL) {
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

 private:
  int listen_fd_ = -1;
  int fd_ = -1;
  pid_t pid_ = -1;
  PeerInfo info_;
};

struct Published {
  KvDescriptor descriptor;
  std::vector<uint64_t> sums;  // [layer][block]
};

Published RequestPublish(Child& child, uint32_t request_no, uint32_t blocks) {
  std::string out;
  Put<uint32_t>(&out, request_no);
  Put<uint32_t>(&out, blocks);
  REQUIRE(SendFrame(child.fd(), 'P', out));
  char kind;
  std::string payload;
  REQUIRE(RecvFrame(child.fd(), &kind, &payload, 10s));
  REQUIRE(kind == 'D');
  size_t at = 0;
  uint32_t desc_len = Get<uint32_t>(payload, &at);
  REQUIRE(at + desc_len <= payload.size());
  auto d = DecodeKvDescriptor(AsBytes(payload.substr(at, desc_len)));
  REQUIRE(d.ok());
  at += desc_len;
  Published p{*d, {}};
  while (at < payload.size()) p.sums.push_back(Get<uint64_t>(payload, &at));
  REQUIRE(p.sums.size() == kLayers * blocks);
  return p;
}

uint32_t ChildFreeCount(Child& child) {
  REQUIRE(SendFrame(child.fd(), 'S', ""));
  char kind;
  std::string payload;
  REQUIRE(RecvFrame(child.fd(), &kind, &payload, 10s));
  REQUIRE(kind == 'S');
  size_t at = 0;
  return Get<uint32_t>(payload, &at);
}

struct Completion {
  uint32_t request_no;
  Status status;
};

// Moves `count` requests of 1..16 random blocks with up to kWindow in flight; checks every
// block's checksum. Returns the number of blocks checked.
uint64_t MoveRequests(Child& child, KvPuller& puller, BlockPool& pool, uint32_t count,
                      uint32_t first_no, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<Completion> completions;
  struct Pending {
    std::vector<uint32_t> local;
    std::vector<uint64_t> sums;
  };
  std::map<uint32_t, Pending> pending;
  uint32_t sent = 0, done = 0;
  uint64_t blocks_checked = 0, mismatches = 0;
  while (done < count) {
    if (sent < count && sent - done < kWindow) {
      uint32_t no = first_no + sent++;
      uint32_t n = 1 + rng() % kMaxBlocksPerRequest;
      Published p = RequestPublish(child, no, n);
      std::vector<uint32_t> local = pool.Allocate(n);
      REQUIRE(local.size() == n);
      pending[no] = {local, p.sums};
      PullCallbacks cb;
      cb.on_done = [&, no](const std::string&, const Status& s) {
        std::lock_guard<std::mutex> lock(mutex);
        completions.push_back({no, s});
        cv.notify_one();
      };
      REQUIRE(puller.Pull(p.descriptor, pool.Ranges(local), std::move(cb)).ok());
      continue;
    }
    std::unique_lock<std::mutex> lock(mutex);
    REQUIRE(cv.wait_for(lock, 10s, [&] { return !completions.empty(); }));
    while (!completions.empty()) {
      Completion c = completions.front();
      completions.pop_front();
      lock.unlock();
      INFO("request " << c.request_no << ": " << c.status.ToString());
      REQUIRE(c.status.ok());
      Pending& p = pending.at(c.request_no);
      for (uint32_t l = 0; l < kLayers; ++l) {
        for (size_t i = 0; i < p.local.size(); ++i) {
          uint64_t got = Checksum(pool.Data(l, p.local[i]), pool.block_bytes());
          mismatches += got != p.sums[l * p.local.size() + i];
          ++blocks_checked;
        }
      }
      pool.Free(p.local);
      pending.erase(c.request_no);
      ++done;
      lock.lock();
    }
  }
  CHECK(mismatches == 0);
  return blocks_checked;
}

TEST_CASE("kvtransfer moves 10000 block lists between two processes", "[kvtransfer]") {
  // "sm": the publisher's pool allocated by UCX (shared-memory RMA); "sm-user-memory": a pool
  // the test allocated, which UCX 1.13 serves over sm by emulating gets with active messages.
  std::string mode = GENERATE(as<std::string>{}, "tcp", "sm", "sm-user-memory");
  std::string tls = mode == "tcp" ? "tcp" : "sm";
  INFO("mode " << mode);
  constexpr size_t kBlockBytes = 1024;
  auto start = Clock::now();
  Child child(tls, kBlockBytes, mode == "sm");
  BlockPool pool(kBlockBytes, 1);
  MetricsRegistry metrics;
  UcxOptions options = test::TestUcxOptions(tls);
  options.metrics = &metrics;
  auto puller = CreateUcxPuller(pool.region(), options);
  REQUIRE(puller.ok());
  REQUIRE((*puller)->Connect(child.info()).ok());
  // The emulated path is slow (see ucx_transport.h): fewer requests keep the test short.
  const uint32_t count = mode == "sm-user-memory" ? 2000 : 10000;
  uint64_t blocks = MoveRequests(child, **puller, pool, count, 0, 2024);
  CHECK(pool.free_count() == kBlocks);
  CHECK((*puller)->inflight_count() == 0);
  CHECK(ChildFreeCount(child) == kBlocks);
  std::string text = metrics.Render();
  CHECK(text.find("tandem_kv_transfer_seconds_count " + std::to_string(count)) !=
        std::string::npos);
  CHECK(text.find("tandem_kv_transfers_inflight 0") != std::string::npos);
  CHECK(child.Quit() == 0);
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  WARN(mode << ": " << count << " requests, " << blocks << " blocks of " << kBlockBytes
                  << " B checked in " << seconds << " s");
}

// Pulls one request of all kBlocks blocks; returns its status and how long it took.
std::pair<Status, double> PullAll(Child& child, KvPuller& puller, BlockPool& pool,
                                  uint32_t request_no, std::function<void()> after_start) {
  Published p = RequestPublish(child, request_no, kBlocks);
  std::vector<uint32_t> local = pool.Allocate(kBlocks);
  REQUIRE(local.size() == kBlocks);
  PullWaiter waiter;
  auto start = Clock::now();
  REQUIRE(puller.Pull(p.descriptor, pool.Ranges(local), waiter.callbacks()).ok());
  after_start();
  Status s = waiter.Wait(10s);
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  pool.Free(local);  // on_done ran: nothing touches these blocks any more
  return {s, seconds};
}

TEST_CASE("kvtransfer fails fast when the publisher hangs or dies and reconnects",
          "[kvtransfer]") {
  constexpr size_t kBlockBytes = 128 << 10;  // 64 MiB per pool: a pull takes a while over tcp
  constexpr auto kTimeout = 1500ms;
  BlockPool pool(kBlockBytes, 3);
  MetricsRegistry metrics;
  UcxOptions options = test::TestUcxOptions("tcp");
  options.timeout = kTimeout;
  options.metrics = &metrics;
  auto puller = CreateUcxPuller(pool.region(), options);
  REQUIRE(puller.ok());
  KvPuller& pull = **puller;
  {
    Child child("tcp", kBlockBytes);
    REQUIRE(pull.Connect(child.info()).ok());
    MoveRequests(child, pull, pool, 5, 0, 7);
    // Hang: SIGSTOP the publisher, so no get is ever answered.
    auto [hung, hung_s] = PullAll(child, pull, pool, 100, [&] { child.Kill(SIGSTOP); });
    WARN("hung publisher: " << hung.ToString() << " after " << hung_s << " s");
    CHECK(hung.code() == StatusCode::kDeadlineExceeded);
    CHECK(hung_s < std::chrono::duration<double>(kTimeout).count() + 1.0);
    CHECK(pool.free_count() == kBlocks);
    child.Kill(SIGKILL);
  }
  {
    // Dead: kill -9 mid-transfer.
    Child child("tcp", kBlockBytes);
    REQUIRE(pull.Connect(child.info()).ok());
    MoveRequests(child, pull, pool, 5, 0, 8);
    auto [dead, dead_s] = PullAll(child, pull, pool, 200, [&] {
      std::this_thread::sleep_for(20ms);
      child.Kill(SIGKILL);
    });
    WARN("killed publisher: " << dead.ToString() << " after " << dead_s << " s");
    CHECK(!dead.ok());
    CHECK(dead_s < std::chrono::duration<double>(kTimeout).count() + 1.0);
    CHECK(pool.free_count() == kBlocks);
    CHECK(pull.inflight_count() == 0);
  }
  {
    // Restarted: a new incarnation connects and works.
    Child child("tcp", kBlockBytes);
    REQUIRE(pull.Connect(child.info()).ok());
    MoveRequests(child, pull, pool, 50, 0, 9);
    CHECK(pool.free_count() == kBlocks);
    CHECK(ChildFreeCount(child) == kBlocks);
    CHECK(child.Quit() == 0);
  }
  std::string text = metrics.Render();
  CHECK(text.find("tandem_kv_transfer_failures_total{reason=\"timeout\"} 1") != std::string::npos);
  CHECK(text.find("tandem_kv_transfers_inflight 0") != std::string::npos);
}

TEST_CASE("kvtransfer streams layers from another process as they are announced",
          "[kvtransfer]") {
  // The child publishes every layer at once; here the puller is told layer by layer (as the
  // decode server is by prefill's KvProgress) and must read no layer before it is announced.
  std::string mode = GENERATE(as<std::string>{}, "tcp", "sm");
  INFO("mode " << mode);
  constexpr size_t kBlockBytes = 4096;
  constexpr uint32_t kRequestBlocks = 16;
  Child child(mode, kBlockBytes, mode == "sm");
  BlockPool pool(kBlockBytes, 5);
  MetricsRegistry metrics;
  UcxOptions options = test::TestUcxOptions(mode);
  options.timeout = 1000ms;
  options.layer_wait_timeout = 1000ms;
  options.metrics = &metrics;
  auto created = CreateUcxPuller(pool.region(), options);
  REQUIRE(created.ok());
  KvPuller& puller = **created;
  REQUIRE(puller.Connect(child.info()).ok());
  auto layer_sums_match = [&](const Published& p, const std::vector<uint32_t>& local,
                              uint32_t l) {
    for (size_t i = 0; i < local.size(); ++i)
      if (Checksum(pool.Data(l, local[i]), kBlockBytes) != p.sums[l * local.size() + i])
        return false;
    return true;
  };
  {
    Published p = RequestPublish(child, 1, kRequestBlocks);
    std::vector<uint32_t> local = pool.Allocate(kRequestBlocks);
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t b : local) std::memset(pool.Data(l, b), 0, kBlockBytes);
    std::mutex mutex;
    std::vector<uint32_t> order;
    PullWaiter waiter;
    PullCallbacks cb = waiter.callbacks();
    auto count = cb.on_layer;
    cb.on_layer = [&, count](uint32_t layer) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        order.push_back(layer);
      }
      count(layer);
    };
    REQUIRE(puller.Pull(p.descriptor, pool.Ranges(local), std::move(cb), 0).ok());
    for (uint32_t available = 1; available <= kLayers; ++available) {
      std::this_thread::sleep_for(600ms);  // the wait for layers is bounded per layer
      CHECK(waiter.layers_done() == available - 1);
      for (uint32_t l = available - 1; l < kLayers; ++l) CHECK_FALSE(layer_sums_match(p, local, l));
      REQUIRE(puller.SetLayersAvailable(p.descriptor.request_id, available).ok());
      for (int i = 0; i < 500 && waiter.layers_done() < available; ++i)
        std::this_thread::sleep_for(10ms);
      REQUIRE(waiter.layers_done() == available);
      for (uint32_t l = 0; l < available; ++l) CHECK(layer_sums_match(p, local, l));
    }
    REQUIRE(waiter.Wait(5s).ok());
    CHECK(order == std::vector<uint32_t>{0, 1});
    pool.Free(local);
  }
  {
    // The publisher never announces a layer: the pull fails by the timeout, both sides free.
    Published p = RequestPublish(child, 2, kRequestBlocks);
    std::vector<uint32_t> local = pool.Allocate(kRequestBlocks);
    PullWaiter waiter;
    auto start = Clock::now();
    REQUIRE(puller.Pull(p.descriptor, pool.Ranges(local), waiter.callbacks(), 0).ok());
    Status s = waiter.Wait(10s);
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    CHECK(s.code() == StatusCode::kDeadlineExceeded);
    CHECK(waiter.layers_done() == 0);
    pool.Free(local);
    WARN(mode << ": no layer announced, the pull failed after " << seconds << " s (timeout 1 s)");
  }
  CHECK(pool.free_count() == kBlocks);
  CHECK(puller.inflight_count() == 0);
  CHECK(ChildFreeCount(child) == kBlocks);  // the child's lease was released by the result
  std::string text = metrics.Render();
  CHECK(text.find("tandem_kv_transfer_failures_total{reason=\"timeout\"} 1") != std::string::npos);
  CHECK(text.find("tandem_kv_transfers_inflight 0") != std::string::npos);
  CHECK(child.Quit() == 0);
}

}  // namespace
}  // namespace tandem
