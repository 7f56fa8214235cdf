// kvtransfer_bench: bandwidth of pulling one request's KV through the UCX backend, beside
// ucx_perftest (ucx-utils) ucp_get on the same transport and message size, in the same run.
//
// Model: 12 layers, 4 KV heads, head_dim 64, fp32, blocks of 16 tokens; a block holds K and V,
// so one block of one layer is 2*16*4*64*4 = 32 KiB, one contiguous range. A request's blocks
// are scattered over the pool (as after a while of serving). Publisher and puller run in this
// process on two separate UCX contexts and workers (each with its progress thread), so the
// bytes cross the transport as between processes (tcp: loopback sockets; sm: cma/posix).
//
//   kvtransfer_bench [--tls 'tcp;sm'] [--ucx-pool] [--no-perftest]
// Prints a table; writes raw numbers to kvtransfer_bench.tsv in the current directory.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvtransfer/ucx_transport.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using namespace tandem;

constexpr int kLayers = 12;
constexpr size_t kBlockTokens = 16;
constexpr size_t kBlockBytes = 2 * kBlockTokens * 4 * 64 * sizeof(float);  // 32 KiB
constexpr size_t kPoolBlocks = 1024 + 64;  // 16k tokens plus slack, per layer

double MiBps(double bytes, double seconds) { return bytes / seconds / (1 << 20); }

// Runs ucx_perftest ucp_get server and client; returns the overall bandwidth in MB/s (2^20).
double RunPerftest(const std::string& tls, size_t size, int iters, int port) {
  std::string env = "UCX_TLS=" + tls + " ";
  std::string common = " -t ucp_get -s " + std::to_string(size) + " -n " + std::to_string(iters) +
                       " -w 100 -O 64 -f -p " + std::to_string(port);
  std::string server = env + "timeout 60 ucx_perftest" + common + " >/dev/null 2>&1 &";
  if (std::system(server.c_str()) != 0) return -1;
  std::this_thread::sleep_for(500ms);
  std::string client = env + "timeout 60 ucx_perftest 127.0.0.1" + common + " 2>&1";
  FILE* pipe = popen(client.c_str(), "r");
  if (!pipe) return -1;
  char line[1024];
  double bw = -1;
  while (fgets(line, sizeof(line), pipe)) {
    // -f prints one row: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall
    std::istringstream in(line);
    double v[8] = {};
    int n = 0;
    while (n < 8 && in >> v[n]) ++n;
    if (n == 8) bw = v[5];
  }
  pclose(pipe);
  return bw;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> tls_list = {"tcp", "sm"};
  bool perftest = true;
  bool use_ucx_pool = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--tls" && i + 1 < argc) {
      tls_list.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ';');) tls_list.push_back(t);
    } else if (a == "--ucx-pool") {
      use_ucx_pool = true;
    } else if (a == "--no-perftest") {
      perftest = false;
    } else {
      std::fprintf(stderr, "usage: %s [--tls 'tcp;sm'] [--ucx-pool] [--no-perftest]\n",
                   argv[0]);
      return 2;
    }
  }
  const size_t pool_bytes = kLayers * kPoolBlocks * kBlockBytes;
  std::vector<uint8_t> src(pool_bytes), dst(pool_bytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < pool_bytes; i += 4096) src[i] = static_cast<uint8_t>(rng());
  std::ofstream tsv("kvtransfer_bench.tsv");
  tsv << "tls\ttokens\tbytes\tseconds_best\ttandem_MiBps\tperftest_MiBps\tratio\tmemcpy_MiBps\n";
  std::printf("%-7s %7s %8s %14s %16s %7s %13s\n", "tls", "tokens", "MiB", "tandem MiB/s",
              "perftest MiB/s", "ratio", "memcpy MiB/s");
  int port = 20000 + static_cast<int>(rng() % 20000);
  for (const std::string& tls : tls_list) {
    UcxOptions options;
    options.tls = tls;
    options.timeout = 60s;
    options.max_inflight_gets = 64;
    // The publisher's pool is allocated by UCX (shared memory): see ucx_transport.h.
    MemoryRegion src_region;
    std::shared_ptr<UcxPool> src_pool;
    if (use_ucx_pool) {
      auto allocated = AllocateUcxPool(pool_bytes, options);
      if (!allocated.ok()) return 1;
      src_pool = *allocated;
      src_region = src_pool->region();
    }
    auto publisher = use_ucx_pool ? CreateUcxPublisher(src_pool, options)
                                  : CreateUcxPublisher({src.data(), pool_bytes}, options);
    auto puller = CreateUcxPuller({dst.data(), pool_bytes}, options);
    if (!publisher.ok() || !puller.ok()) {
      std::fprintf(stderr, "UCX_TLS=%s: %s %s\n", tls.c_str(),
                   publisher.status().ToString().c_str(), puller.status().ToString().c_str());
      continue;
    }
    Status connected = (*puller)->Connect((*publisher)->peer_info());
    if (!connected.ok()) {
      std::fprintf(stderr, "connect: %s\n", connected.ToString().c_str());
      continue;
    }
    double perftest_bw = perftest ? RunPerftest(tls, kBlockBytes, 20000, port++) : -1;
    for (size_t tokens : {1024, 4096, 16384}) {
      size_t blocks = tokens / kBlockTokens;
      std::vector<uint32_t> ids(kPoolBlocks);
      for (uint32_t i = 0; i < kPoolBlocks; ++i) ids[i] = i;
      std::shuffle(ids.begin(), ids.end(), rng);
      LayerRanges remote(kLayers), local(kLayers);
      for (int l = 0; l < kLayers; ++l) {
        for (size_t b = 0; b < blocks; ++b) {
          remote[l].push_back({(l * kPoolBlocks + ids[b]) * kBlockBytes, kBlockBytes});
          local[l].push_back({(l * kPoolBlocks + ids[kPoolBlocks - 1 - b]) * kBlockBytes,
                              kBlockBytes});
        }
      }
      int reps = tokens == 16384 ? 3 : tokens == 4096 ? 5 : 10;
      double best = 1e9;
      uint64_t bytes = 0;
      for (int r = 0; r < reps + 1; ++r) {  // the first run warms up
        std::string id = "bench-" + std::to_string(tokens) + "-" + std::to_string(r);
        auto d = (*publisher)->Publish(id, remote, [](const std::string&, const Status&) {});
        if (!d.ok()) return 1;
        bytes = d->total_bytes;
        PullWaiter waiter;
        auto start = Clock::now();
        if (!(*puller)->Pull(*d, local, waiter.callbacks()).ok()) return 1;
        Status s = waiter.Wait(120s);
        double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        if (!s.ok()) {
          std::fprintf(stderr, "pull failed: %s\n", s.ToString().c_str());
          return 1;
        }
        if (r > 0) best = std::min(best, seconds);
      }
      // Baseline: the same scattered copies as one thread of memcpy in this process (what a
      // shared-memory get can reach at best; ucx_perftest reuses one cache-hot buffer).
      const uint8_t* src_base =
          use_ucx_pool ? static_cast<const uint8_t*>(src_region.base) : src.data();
      double best_memcpy = 1e9;
      for (int r = 0; r < reps; ++r) {
        auto start = Clock::now();
        for (int l = 0; l < kLayers; ++l) {
          for (size_t b = 0; b < blocks; ++b) {
            std::memcpy(dst.data() + local[l][b].offset, src_base + remote[l][b].offset,
                        kBlockBytes);
          }
        }
        best_memcpy = std::min(
            best_memcpy, std::chrono::duration<double>(Clock::now() - start).count());
      }
      double memcpy_bw = MiBps(static_cast<double>(bytes), best_memcpy);
      double bw = MiBps(static_cast<double>(bytes), best);
      double ratio = perftest_bw > 0 ? bw / perftest_bw : 0;
      std::printf("%-7s %7zu %8.1f %14.1f %16.1f %6.0f%% %13.1f\n", tls.c_str(), tokens,
                  bytes / double(1 << 20), bw, perftest_bw, ratio * 100, memcpy_bw);
      tsv << tls << '\t' << tokens << '\t' << bytes << '\t' << best << '\t' << bw << '\t'
          << perftest_bw << '\t' << ratio << '\t' << memcpy_bw << '\n';
    }
  }
  return 0;
}
