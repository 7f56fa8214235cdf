// GPU check of the NCCL KV transfer backend (kvtransfer/nccl/nccl_transport.h).
//
// What it does: the parent process is the prefill side (publisher, device 0); it starts itself
// again (posix_spawn of /proc/self/exe, so the child gets a fresh CUDA context) as the decode
// side (puller, on the second GPU: CUDA_VISIBLE_DEVICES). Two pipes are the control plane: parent to child carries the PeerInfo
// and every KvDescriptor, child to parent the pull orders (all wire encoded); the puller makes
// the NCCL link at its first pull, as the servers' do.
//   1. correctness: 300 requests with seeded random block lists (1..64 blocks of 64 KiB per
//      layer, 4 layers, different random block choices on each side, so the range cuts differ
//      and both sides' plans must cut them alike). Each layer's byte stream is filled from a seeded generator on
//      the publisher; the puller checks an FNV-1a checksum of every received block against the
//      same generator. Up to 4 requests in flight.
//   2. a request the publisher released before the pull (its hold ran out): that pull fails
//      with NotFound and the link goes on.
//   3. bandwidth: 8 requests of 1 GiB (32 layers x 32 MiB, one range per layer); GB/s measured
//      on the puller from the first Pull to the last on_done.
// NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU detected"), so
// this needs two GPUs; with fewer (or none) it prints the reason and exits 2.
// Exit codes: 0 all checks passed, 1 a check failed, 2 cannot run here.
#include <cuda_runtime_api.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/engine/cuda/cuda_util.h"
#include "kvtransfer/nccl/nccl_transport.h"
#include "kvtransfer/wire.h"

extern char** environ;

namespace tandem {
namespace {

constexpr uint64_t kSeed = 20240604;
constexpr int kRequests = 300;
constexpr uint32_t kLayers = 4;
constexpr uint64_t kBlockBytes = 64 << 10;
constexpr uint32_t kMaxBlocks = 64;
constexpr int kWindow = 4;
constexpr uint64_t kSlotBytes = uint64_t{kMaxBlocks} * kLayers * kBlockBytes;
constexpr int kBwRequests = 8;
constexpr uint32_t kBwLayers = 32;
constexpr uint64_t kBwLayerBytes = 32ull << 20;
constexpr auto kTimeout = std::chrono::seconds(30);

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "nccl_transfer_check: %s\n", what.c_str());
  std::exit(1);
}
template <typename T>
T Must(StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(std::string(what) + ": " + v.status().ToString());
  return std::move(v).value();
}
void Must(const Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

uint64_t Fnv(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// The layer's byte stream of request `r`.
std::vector<uint8_t> LayerStream(int r, uint32_t layer, uint64_t bytes) {
  std::vector<uint8_t> out(bytes);
  std::mt19937_64 rng(kSeed ^ (uint64_t(r) << 20) ^ layer);
  for (uint64_t i = 0; i < bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<uint64_t>(8, bytes - i));
  }
  return out;
}

// Request r's block count (both sides agree) and one side's random block lists inside slot
// r % kWindow, merged into ranges where consecutive.
uint32_t BlockCount(int r) { return std::mt19937(kSeed + r)() % kMaxBlocks + 1; }
LayerRanges RandomRanges(int r, uint64_t side_salt) {
  std::mt19937 rng(kSeed * 7 + r * 131 + side_salt);
  std::vector<uint32_t> blocks(kMaxBlocks * kLayers);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  const uint32_t n = BlockCount(r);
  const uint64_t slot = (r % kWindow) * kSlotBytes;
  LayerRanges layers(kLayers);
  for (uint32_t l = 0; l < kLayers; ++l) {
    std::vector<uint32_t> mine(blocks.begin() + l * n, blocks.begin() + (l + 1) * n);
    if (rng() % 2) std::sort(mine.begin(), mine.end());  // sometimes long contiguous runs
    for (uint32_t b : mine) {
      const uint64_t off = slot + uint64_t{b} * kBlockBytes;
      auto& v = layers[l];
      if (!v.empty() && v.back().offset + v.back().length == off) {
        v.back().length += kBlockBytes;
      } else {
        v.push_back({off, kBlockBytes});
      }
    }
  }
  return layers;
}

void WriteMsg(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) Die("control pipe write failed");
    done += n;
  }
}
std::string ReadExact(int fd, size_t n) {
  std::string out(n, '\0');
  size_t done = 0;
  while (done < n) {
    const ssize_t k = read(fd, out.data() + done, n - done);
    if (k <= 0) Die("control pipe closed");
    done += k;
  }
  return out;
}
// One message, or nothing when the other side closed the pipe.
std::optional<std::string> ReadMsgOrEnd(int fd) {
  std::string head(kKvWireHeaderBytes, '\0');
  const ssize_t k = read(fd, head.data(), head.size());
  if (k == 0) return std::nullopt;
  if (k < 0) Die("control pipe read failed");
  if (static_cast<size_t>(k) < head.size()) head = head.substr(0, k) + ReadExact(fd, head.size() - k);
  KvWireHeader h = Must(DecodeKvWireHeader(AsBytes(head)), "wire header");
  return head + ReadExact(fd, h.message_bytes - kKvWireHeaderBytes);
}
std::string ReadMsg(int fd) {
  std::string head = ReadExact(fd, kKvWireHeaderBytes);
  KvWireHeader h = Must(DecodeKvWireHeader(AsBytes(head)), "wire header");
  return head + ReadExact(fd, h.message_bytes - kKvWireHeaderBytes);
}

// One pool a side, of blocks of kBlockBytes (one "layer", as the ranges here are not laid out
// layer by layer: with equal degrees the plan only needs them inside the pool).
KvPoolShape PoolShape() {
  const uint64_t bytes = std::max(kWindow * kSlotBytes, 2 * kBwLayers * kBwLayerBytes);
  return KvPoolShape{KvLayout{1, 1, static_cast<int>(kBlockBytes / (2 * 8 * sizeof(float))), 8},
                     1, static_cast<int>(bytes / kBlockBytes)};
}

struct Releases {
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  int failed = 0;
  void Add(const Status& s) {
    std::lock_guard<std::mutex> l(mu);
    ++done;
    if (!s.ok()) {
      ++failed;
      std::fprintf(stderr, "release: %s\n", s.ToString().c_str());
    }
    cv.notify_all();
  }
  void WaitFor(int n) {
    std::unique_lock<std::mutex> l(mu);
    if (!cv.wait_for(l, kTimeout, [&] { return done >= n; })) Die("publisher: release timed out");
  }
};

int Publisher(int out_fd, int in_fd) {
  Must(cuda::SetDevice(0), "set device 0");
  cuda::DeviceBuffer region = Must(cuda::DeviceBuffer::Allocate(PoolShape().pool_bytes()), "region");
  PullDrivenOptions options;
  options.timeout = kTimeout;
  auto pub = Must(CreateNcclPublisher({{region.data(), region.size()}}, PoolShape(), options),
                  "publisher");
  WriteMsg(out_fd, Encode(pub->peer_info()));
  // The puller's orders, as the prefill server relays them (KvTransport).
  std::thread orders([&] {
    while (std::optional<std::string> order = ReadMsgOrEnd(in_fd))
      Must(pub->OnPullerMessage(AsBytes(*order)), "pull order");
  });
  Releases releases;
  auto on_release = [&](const std::string&, const Status& s) { releases.Add(s); };

  for (int r = 0; r < kRequests; ++r) {
    releases.WaitFor(r - kWindow + 1);  // slot r % kWindow is free again
    LayerRanges layers = RandomRanges(r, 1);
    for (uint32_t l = 0; l < kLayers; ++l) {
      const std::vector<uint8_t> stream = LayerStream(r, l, BlockCount(r) * kBlockBytes);
      uint64_t pos = 0;
      for (const ByteRange& br : layers[l]) {
        Must(region.CopyFromHost(stream.data() + pos, br.length, nullptr, br.offset), "fill");
        pos += br.length;
      }
    }
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    KvDescriptor d = Must(pub->Publish("req-" + std::to_string(r), std::move(layers), on_release),
                          "publish");
    WriteMsg(out_fd, Encode(d));
  }
  releases.WaitFor(kRequests);
  {  // released before the pull: the puller gets filler and NotFound
    KvDescriptor d = Must(pub->Publish("gone-0", RandomRanges(0, 1), {}), "publish gone-0");
    TransferResult expired;
    expired.instance_id = pub->peer_info().instance_id;
    expired.request_id = "gone-0";
    expired.code = StatusCode::kDeadlineExceeded;
    expired.message = "hold ran out";
    Must(pub->Release(expired), "release gone-0");
    WriteMsg(out_fd, Encode(d));
  }
  for (int r = 0; r < kBwRequests; ++r) {
    releases.WaitFor(kRequests + r - 1);  // two slots of kBwLayers layers
    LayerRanges layers(kBwLayers);
    for (uint32_t l = 0; l < kBwLayers; ++l) {
      layers[l].push_back({((r % 2) * kBwLayers + l) * kBwLayerBytes, kBwLayerBytes});
    }
    KvDescriptor d = Must(pub->Publish("bw-" + std::to_string(r), std::move(layers), on_release),
                          "publish");
    WriteMsg(out_fd, Encode(d));
  }
  releases.WaitFor(kRequests + kBwRequests);
  orders.join();  // the puller closes its pipe when it is done
  std::printf("publisher: %d releases, %d failed\n", releases.done, releases.failed);
  return releases.failed == 0 ? 0 : 1;
}

int Puller(int in_fd, int out_fd) {
  Must(cuda::SetDevice(0), "set device 0 (the second GPU: CUDA_VISIBLE_DEVICES)");
  cuda::DeviceBuffer region = Must(cuda::DeviceBuffer::Allocate(PoolShape().pool_bytes()), "region");
  PullDrivenOptions options;
  options.timeout = kTimeout;
  auto puller = Must(CreateNcclPuller({{region.data(), region.size()}}, PoolShape(), options),
                     "puller");
  auto with_orders = [out_fd](PullCallbacks callbacks) {
    callbacks.to_publisher = [out_fd](std::string bytes) { WriteMsg(out_fd, bytes); };
    return callbacks;
  };
  Must(puller->Connect(Must(DecodePeerInfo(AsBytes(ReadMsg(in_fd))), "peer info")), "connect");

  struct InFlight {
    int r;
    LayerRanges local;
    PullWaiter waiter;
  };
  std::deque<InFlight> inflight;
  uint64_t bad_blocks = 0, checked_blocks = 0, bytes = 0;
  auto finish = [&](InFlight& f) {
    Must(f.waiter.Wait(std::chrono::duration_cast<std::chrono::milliseconds>(kTimeout)),
         ("pull " + std::to_string(f.r)).c_str());
    for (uint32_t l = 0; l < kLayers; ++l) {
      const std::vector<uint8_t> want = LayerStream(f.r, l, BlockCount(f.r) * kBlockBytes);
      std::vector<uint8_t> got(kBlockBytes);
      uint64_t pos = 0;
      for (const ByteRange& br : f.local[l]) {
        for (uint64_t b = 0; b < br.length; b += kBlockBytes, pos += kBlockBytes) {
          Must(region.CopyToHost(got.data(), kBlockBytes, nullptr, br.offset + b), "read back");
          ++checked_blocks;
          bytes += kBlockBytes;
          if (Fnv(got.data(), kBlockBytes) != Fnv(want.data() + pos, kBlockBytes)) ++bad_blocks;
        }
      }
    }
  };
  for (int r = 0; r < kRequests; ++r) {
    KvDescriptor d = Must(DecodeKvDescriptor(AsBytes(ReadMsg(in_fd))), "descriptor");
    inflight.push_back({r, RandomRanges(r, 2), PullWaiter()});
    Must(puller->Pull(d, inflight.back().local, with_orders(inflight.back().waiter.callbacks())),
         "pull");
    if (inflight.size() >= kWindow) {
      finish(inflight.front());
      inflight.pop_front();
    }
  }
  while (!inflight.empty()) {
    finish(inflight.front());
    inflight.pop_front();
  }
  std::printf("correctness: %d requests, %llu blocks (%llu bytes) checked, %llu bad\n", kRequests,
              (unsigned long long)checked_blocks, (unsigned long long)bytes,
              (unsigned long long)bad_blocks);

  {
    KvDescriptor d = Must(DecodeKvDescriptor(AsBytes(ReadMsg(in_fd))), "descriptor gone-0");
    PullWaiter waiter;
    Must(puller->Pull(d, RandomRanges(0, 2), with_orders(waiter.callbacks())), "pull gone-0");
    const Status gone =
        waiter.Wait(std::chrono::duration_cast<std::chrono::milliseconds>(kTimeout));
    std::printf("released before the pull: %s\n", gone.ToString().c_str());
    if (gone.code() != StatusCode::kNotFound) Die("gone-0: expected NotFound");
  }

  std::deque<PullWaiter> waiters;
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < kBwRequests; ++r) {
    KvDescriptor d = Must(DecodeKvDescriptor(AsBytes(ReadMsg(in_fd))), "descriptor");
    if (r == 0) start = std::chrono::steady_clock::now();
    LayerRanges local(kBwLayers);
    for (uint32_t l = 0; l < kBwLayers; ++l) {
      // Reverse layer placement: the local cut differs from the publisher's.
      local[l].push_back({((r % 2) * kBwLayers + (kBwLayers - 1 - l)) * kBwLayerBytes,
                          kBwLayerBytes});
    }
    waiters.emplace_back();
    Must(puller->Pull(d, std::move(local), with_orders(waiters.back().callbacks())), "bw pull");
    if (waiters.size() >= 2) {
      Must(waiters.front().Wait(std::chrono::duration_cast<std::chrono::milliseconds>(kTimeout)),
           "bw wait");
      waiters.pop_front();
    }
  }
  while (!waiters.empty()) {
    Must(waiters.front().Wait(std::chrono::duration_cast<std::chrono::milliseconds>(kTimeout)),
         "bw wait");
    waiters.pop_front();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double gb = double(kBwRequests) * kBwLayers * kBwLayerBytes / 1e9;
  std::printf("bandwidth: %d x %.2f GB in %.3f s = %.2f GB/s (GPU0 -> GPU1, NCCL p2p)\n",
              kBwRequests, gb / kBwRequests, s, gb / s);
  return bad_blocks == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  using namespace tandem;
  if (argc == 4 && std::string(argv[1]) == "--puller") {
    const int rc = Puller(std::atoi(argv[2]), std::atoi(argv[3]));
    close(std::atoi(argv[3]));
    return rc;
  }
  StatusOr<int> count = cuda::DeviceCount();
  if (!count.ok()) {
    std::printf("nccl_transfer_check: skipped: no usable GPU (%s)\n",
                count.status().ToString().c_str());
    return 2;
  }
  if (*count < 2) {
    std::printf("nccl_transfer_check: skipped: %d GPU(s); NCCL needs the two ranks on two "
                "different devices\n", *count);
    return 2;
  }
  int down[2], up[2];  // parent -> child, child -> parent
  if (pipe(down) != 0 || pipe(up) != 0) Die("pipe");
  const std::string in_arg = std::to_string(down[0]), out_arg = std::to_string(up[1]);
  char* child_argv[] = {const_cast<char*>("/proc/self/exe"), const_cast<char*>("--puller"),
                        const_cast<char*>(in_arg.c_str()), const_cast<char*>(out_arg.c_str()),
                        nullptr};
  pid_t child = 0;
  // The child computes on the second GPU as its device 0, as an instance given its GPU by
  // S.cuda_devices does (a link of pool 0 runs on device 0).
  std::vector<std::string> env_strings;
  std::string visible = "1";
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr && std::strchr(v, ',')) {
    visible = std::string(std::strchr(v, ',') + 1);
    visible = visible.substr(0, visible.find(','));
  }
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) != 0) env_strings.emplace_back(*e);
  env_strings.push_back("CUDA_VISIBLE_DEVICES=" + visible);
  std::vector<char*> child_env;
  for (std::string& e : env_strings) child_env.push_back(e.data());
  child_env.push_back(nullptr);
  // The child keeps only its own ends: holding the parent's (down[1], up[0]) would leave it
  // waiting forever for input if the parent died. A child that dies makes the parent's next
  // write fail (EPIPE, reported) instead of killing it by SIGPIPE.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addclose(&actions, down[1]);
  posix_spawn_file_actions_addclose(&actions, up[0]);
  const int spawned =
      posix_spawn(&child, "/proc/self/exe", &actions, nullptr, child_argv, child_env.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) Die("posix_spawn");
  std::signal(SIGPIPE, SIG_IGN);  // after the spawn: the child keeps the default
  close(down[0]);
  close(up[1]);
  const int pub_rc = Publisher(down[1], up[0]);
  close(down[1]);
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  const int child_rc = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 1;
  std::printf("nccl_transfer_check: %s (publisher %d, puller %d)\n",
              pub_rc == 0 && child_rc == 0 ? "PASS" : "FAIL", pub_rc, child_rc);
  return pub_rc == 0 && child_rc == 0 ? 0 : 1;
}
