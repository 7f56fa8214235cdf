// kvtransfer_bench: bandwidth of pulling one request's KV through the UCX backend, beside
// ucx_perftest (ucx-utils) ucp_get on the same transport and message size, in the same run.
//
// Model: `medium` (12 layers, 4 KV heads, head_dim 64), fp32, blocks of 16 tokens; a block holds
// K and V, so one block of one layer is 2*16*4*64*4 = 32 KiB, one contiguous range. A request's
// blocks are scattered over the pool (as after a while of serving). Publisher and puller run in
// this process on two separate UCX contexts and workers (each with its progress thread), so the
// bytes cross the transport as between processes (tcp: loopback sockets; sm: sysv/posix shared
// memory). Both pools are allocated by UCX, as the servers' are (see UcxPool); --user-memory
// registers heap memory instead (over sm UCX 1.13 then emulates gets with active messages).
//
// How it is made comparable with ucx_perftest:
//  - perftest runs `-t ucp_get -s S -O N` with S = the median size of the gets the request
//    actually issues (PlanCopies pieces; 32 KiB here) and N = our max_inflight_gets, over the same
//    UCX_TLS, server and client processes on 127.0.0.1.
//  - perftest re-reads ONE S-byte buffer into one S-byte buffer (cache hot); it has no flag to
//    walk a larger buffer (-s a,b,c with -D iov is not supported for ucp_get: it reports
//    nonsense rates). So the bench also pulls the same request shape with every range pointing
//    at one 32 KiB block on each side ("hot" column): our full stack on perftest's memory pattern.
//    "ratio" compares the real (DRAM-sized, scattered) request with perftest, "hot ratio" the
//    hot pattern; memcpy is one thread copying the same scattered blocks in this process.
//
// Reads: as the servers choose them (ReadsForTls: authenticated read messages over tcp, RMA gets
// over sm); --reads rma|messages forces one (RMA over tcp is what Tandem no longer does: UCX
// serves it to anyone; kept to measure what the authenticated reads cost).
//
//   kvtransfer_bench [--tls 'tcp;sm'] [--reads rma|messages] [--user-memory] [--no-perftest]
//                    [--inflight N] [--runs N]
// --runs N: a request's blocks come in runs of N adjacent ids on each side (as from a fresh
// pool, or blocks reused in the order they were freed); PlanCopies merges each run's ranges into
// one get (CoalesceCopies). Default 1: every block on its own.
// Prints a table; writes raw numbers to kvtransfer_bench.tsv in the current directory.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
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

double MiBps(double bytes, double seconds) {
  return bytes / seconds / (1 << 20);
}

// Runs ucx_perftest ucp_get server and client; returns the overall bandwidth in MB/s (2^20).
double RunPerftest(const std::string& tls, size_t size, int iters, int outstanding, int port) {
  std::string env = "UCX_TLS=" + tls + " ";
  std::string common = " -t ucp_get -s " + std::to_string(size) + " -n " + std::to_string(iters) +
                       " -w 100 -O " + std::to_string(outstanding) + " -f -p " +
                       std::to_string(port);
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

// Pulls `remote` into `local` `reps` times (after one warm-up); returns the best seconds.
double BestPull(KvPublisher& publisher, KvPuller& puller, const LayerRanges& remote,
                const LayerRanges& local, int reps, const std::string& tag, uint64_t* bytes) {
  double best = 1e9;
  for (int r = 0; r < reps + 1; ++r) {
    std::string id = "bench-" + tag + "-" + std::to_string(r);
    auto d = publisher.Publish(id, remote, [](const std::string&, const Status&) {});
    if (!d.ok()) return -1;
    *bytes = d->total_bytes;
    PullWaiter waiter;
    auto start = Clock::now();
    if (!puller.Pull(*d, local, waiter.callbacks()).ok()) return -1;
    Status s = waiter.Wait(120s);
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!s.ok()) {
      std::fprintf(stderr, "pull failed: %s\n", s.ToString().c_str());
      return -1;
    }
    if (r > 0) best = std::min(best, seconds);
  }
  return best;
}

struct BenchArgs {
  std::vector<std::string> tls_list = {"tcp", "sm"};
  bool perftest = true;
  bool user_memory = false;
  size_t inflight = 64;
  std::string reads;  // "" = ReadsForTls
  size_t run = 1;      // blocks come in ascending runs of this many adjacent ids (1: scattered)
};

// false on a bad argument.
bool ParseArgs(int argc, char** argv, BenchArgs* args) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--tls" && i + 1 < argc) {
      args->tls_list.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ';');) args->tls_list.push_back(t);
    } else if (a == "--user-memory") {
      args->user_memory = true;
    } else if (a == "--no-perftest") {
      args->perftest = false;
    } else if (a == "--reads" && i + 1 < argc) {
      args->reads = argv[++i];
      if (args->reads != "rma" && args->reads != "messages") return false;
    } else if (a == "--inflight" && i + 1 < argc) {
      args->inflight = std::stoul(argv[++i]);
    } else if (a == "--runs" && i + 1 < argc) {
      args->run = std::stoul(argv[++i]);
      if (args->run < 1 || args->run > 1024) return false;
    } else {
      return false;
    }
  }
  return true;
}

// A connected publisher and puller over one transport, and their pools.
// The memory is declared first: it outlives the publisher and puller that registered it.
struct Endpoints {
  std::vector<uint8_t> heap_src, heap_dst;  // --user-memory
  std::shared_ptr<UcxPool> src_pool, dst_pool;
  uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  std::unique_ptr<KvPublisher> publisher;
  std::unique_ptr<KvPuller> puller;
};

StatusOr<std::unique_ptr<Endpoints>> MakeEndpoints(const BenchArgs& args, const UcxOptions& options,
                                                   size_t pool_bytes) {
  auto e = std::make_unique<Endpoints>();
  StatusOr<std::unique_ptr<KvPublisher>> publisher = Internal("unset");
  StatusOr<std::unique_ptr<KvPuller>> puller = Internal("unset");
  if (args.user_memory) {
    e->heap_src.assign(pool_bytes, 0);
    e->heap_dst.assign(pool_bytes, 0);
    e->src = e->heap_src.data();
    e->dst = e->heap_dst.data();
    publisher = CreateUcxPublisher({e->src, pool_bytes}, options);
    puller = CreateUcxPuller({e->dst, pool_bytes}, options);
  } else {
    auto a = AllocateUcxPool(pool_bytes, options);
    auto b = AllocateUcxPool(pool_bytes, options);
    if (!a.ok() || !b.ok())
      return Internal("pool: " + a.status().ToString() + " " + b.status().ToString());
    e->src_pool = *a;
    e->dst_pool = *b;
    e->src = static_cast<uint8_t*>(e->src_pool->region().base);
    e->dst = static_cast<uint8_t*>(e->dst_pool->region().base);
    publisher = CreateUcxPublisher(e->src_pool, options);
    puller = CreateUcxPuller(e->dst_pool, options);
  }
  if (!publisher.ok() || !puller.ok())
    return Internal(publisher.status().ToString() + " " + puller.status().ToString());
  e->publisher = std::move(*publisher);
  e->puller = std::move(*puller);
  return e;
}

// One thread of memcpy over the same scattered blocks, in this process: the best seconds.
double BestMemcpy(const Endpoints& e, const LayerRanges& remote, const LayerRanges& local,
                  size_t blocks, int reps) {
  double best_memcpy = 1e9;
  for (int r = 0; r < reps; ++r) {
    auto start = Clock::now();
    for (int l = 0; l < kLayers; ++l) {
      for (size_t b = 0; b < blocks; ++b) {
        std::memcpy(e.dst + local[l][b].offset, e.src + remote[l][b].offset, kBlockBytes);
      }
    }
    best_memcpy =
        std::min(best_memcpy, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best_memcpy;
}

// What one transport's rows share: the perftest results by message size, the next port.
struct TransportRun {
  const BenchArgs& args;
  const std::string& tls;
  Endpoints& endpoints;
  size_t pool_bytes;
  std::mt19937_64& rng;
  std::map<uint64_t, double>& perftest_by_size;
  int& port;
  std::ofstream& tsv;
};

// `blocks` block ids of a pool: ascending runs of `length` adjacent ids (the last may be
// shorter), the runs at random places. length 1: every block somewhere else.
std::vector<uint32_t> BlockRuns(size_t blocks, size_t length, std::mt19937_64& rng) {
  std::vector<uint32_t> slots(kPoolBlocks / length);
  for (uint32_t i = 0; i < slots.size(); ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<uint32_t> ids;
  for (size_t s = 0; ids.size() < blocks; ++s)
    for (size_t k = 0; k < length && ids.size() < blocks; ++k)
      ids.push_back(static_cast<uint32_t>(slots[s] * length + k));
  return ids;
}

// One row: a request of `tokens` tokens pulled scattered (in runs of --runs adjacent blocks) and
// hot, perftest and memcpy beside. false when a pull fails.
bool BenchRequestSize(TransportRun& run, size_t tokens) {
  const size_t blocks = tokens / kBlockTokens;
  const std::vector<uint32_t> from = BlockRuns(blocks, run.args.run, run.rng);
  const std::vector<uint32_t> to = BlockRuns(blocks, run.args.run, run.rng);
  LayerRanges remote(kLayers), local(kLayers), hot_remote(kLayers), hot_local(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    for (size_t b = 0; b < blocks; ++b) {
      remote[l].push_back({(l * kPoolBlocks + from[b]) * kBlockBytes, kBlockBytes});
      local[l].push_back({(l * kPoolBlocks + to[b]) * kBlockBytes, kBlockBytes});
      hot_remote[l].push_back({0, kBlockBytes});
      hot_local[l].push_back({0, kBlockBytes});
    }
  }
  // The gets the puller will issue, and their median size: perftest's message size.
  auto pieces = PlanCopies(remote, run.pool_bytes, local, run.pool_bytes);
  if (!pieces.ok()) return false;
  std::vector<uint64_t> sizes;
  for (const CopyPiece& p : *pieces) sizes.push_back(p.length);
  std::nth_element(sizes.begin(), sizes.begin() + sizes.size() / 2, sizes.end());
  const uint64_t get_size = sizes[sizes.size() / 2];
  if (run.args.perftest && !run.perftest_by_size.count(get_size)) {
    int iters = static_cast<int>(std::max<uint64_t>(2000, (512ull << 20) / get_size));
    run.perftest_by_size[get_size] =
        RunPerftest(run.tls, get_size, iters, static_cast<int>(run.args.inflight), run.port++);
  }
  const double perftest_bw = run.args.perftest ? run.perftest_by_size[get_size] : -1;

  const int reps = tokens == 16384 ? 3 : tokens == 4096 ? 5 : 10;
  uint64_t bytes = 0, hot_bytes = 0;
  KvPublisher& publisher = *run.endpoints.publisher;
  KvPuller& puller = *run.endpoints.puller;
  double best = BestPull(publisher, puller, remote, local, reps, std::to_string(tokens), &bytes);
  // The hot pattern is short (a few ms even at 16k): more tries, or a time slice lost to
  // another process on a shared machine decides the result.
  double hot = BestPull(publisher, puller, hot_remote, hot_local, 20,
                        "hot-" + std::to_string(tokens), &hot_bytes);
  if (best < 0 || hot < 0) return false;
  const double best_memcpy = BestMemcpy(run.endpoints, remote, local, blocks, reps);
  double memcpy_bw = MiBps(static_cast<double>(bytes), best_memcpy);
  double bw = MiBps(static_cast<double>(bytes), best);
  double hot_bw = MiBps(static_cast<double>(hot_bytes), hot);
  double ratio = perftest_bw > 0 ? bw / perftest_bw : 0;
  double hot_ratio = perftest_bw > 0 ? hot_bw / perftest_bw : 0;
  std::printf("%-7s %6zu %6.0f %6zu %8s %12.0f %14.0f %5.0f%% %12.0f %5.0f%% %12.0f\n",
              run.tls.c_str(), tokens, bytes / double(1 << 20), pieces->size(),
              (std::to_string(get_size >> 10) + " KiB").c_str(), bw, perftest_bw, ratio * 100,
              hot_bw, hot_ratio * 100, memcpy_bw);
  std::fflush(stdout);
  run.tsv << run.tls << '\t' << tokens << '\t' << bytes << '\t' << pieces->size() << '\t'
          << get_size << '\t' << best << '\t' << bw << '\t' << perftest_bw << '\t' << ratio << '\t'
          << hot_bw << '\t' << hot_ratio << '\t' << memcpy_bw << '\n';
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  BenchArgs args;
  if (!ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: %s [--tls 'tcp;sm'] [--reads rma|messages] [--user-memory] "
                 "[--no-perftest] [--inflight N] [--runs N]\n",
                 argv[0]);
    return 2;
  }
  const size_t pool_bytes = kLayers * kPoolBlocks * kBlockBytes;
  std::mt19937_64 rng(1);
  std::ofstream tsv("kvtransfer_bench.tsv");
  tsv << "tls\ttokens\tbytes\tgets\tget_bytes_median\tseconds_best\ttandem_MiBps"
         "\tperftest_MiBps\tratio\thot_MiBps\thot_ratio\tmemcpy_MiBps\n";
  std::printf("%-7s %6s %6s %6s %8s %12s %14s %6s %12s %6s %12s\n", "tls", "tokens", "MiB", "gets",
              "get size", "tandem MiB/s", "perftest MiB/s", "ratio", "hot MiB/s", "hot r",
              "memcpy MiB/s");
  int port = 20000 + static_cast<int>(rng() % 20000);
  for (const std::string& tls : args.tls_list) {
    UcxOptions options;
    options.tls = tls;
    options.timeout = 60s;
    options.max_inflight_gets = args.inflight;
    options.reads = args.reads.empty() ? ReadsForTls(tls)
                    : args.reads == "rma" ? UcxReads::kRma
                                          : UcxReads::kMessages;
    options.secret = "kvtransfer-bench-secret-0123456789abcdef";
    StatusOr<std::unique_ptr<Endpoints>> endpoints = MakeEndpoints(args, options, pool_bytes);
    if (!endpoints.ok()) {
      std::fprintf(stderr, "UCX_TLS=%s: %s\n", tls.c_str(), endpoints.status().message().c_str());
      continue;
    }
    Endpoints& e = **endpoints;
    for (size_t i = 0; i < pool_bytes; i += 4096) e.src[i] = static_cast<uint8_t>(rng());
    Status connected = e.puller->Connect(e.publisher->peer_info());
    if (!connected.ok()) {
      std::fprintf(stderr, "connect: %s\n", connected.ToString().c_str());
      continue;
    }
    std::map<uint64_t, double> perftest_by_size;
    TransportRun run{args, tls, e, pool_bytes, rng, perftest_by_size, port, tsv};
    for (size_t tokens : {1024, 4096, 16384})
      if (!BenchRequestSize(run, tokens)) return 1;
  }
  return 0;
}
