// kv_link_bench: one request's KV pulled between two processes on two hosts (perf/netns_kv.sh
// runs them in two network namespaces joined by a veth bridge), through Tandem's UCX backend,
// with the bytes checked end to end.
//
//   kv_link_bench serve DIR [--net-devices DEV] [--reps N]
//       Allocates a KV pool as a prefill server does (UCX_TLS=tcp), fills it, publishes
//       requests of 1024, 4096 and 16384 tokens (N + 1 times each, the first a warm-up) with
//       their blocks scattered over the pool, writes DIR/peer.bin, DIR/descriptors.bin and
//       DIR/checksums.txt, then DIR/ready; exits when DIR/done appears (or after 600 s).
//   kv_link_bench pull DIR [--net-devices DEV] [--inflight N]
//       Connects to that publisher, pulls every descriptor into the same offsets of its own
//       pool, checks each request's bytes against the publisher's checksum, prints a table and
//       writes kv_link_bench.tsv (raw numbers) in the current directory; then creates DIR/done.
//
// Reads: authenticated read messages (UcxReads::kMessages), as the servers read over tcp; the
// publisher's secret travels in DIR/secret.
//
// Model shape: `medium` (12 layers, 4 KV heads, head_dim 64), fp32, 16-token blocks: one block
// of one layer is 32 KiB, one get (as in kvtransfer_bench, whose table this one extends across
// hosts). Exit status: 0 when every pull succeeded with the right bytes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvtransfer/ucx_transport.h"
#include "kvtransfer/wire.h"

namespace {

using namespace std::chrono_literals;
using namespace tandem;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr int kLayers = 12;
constexpr size_t kBlockTokens = 16;
constexpr size_t kBlockBytes = 2 * kBlockTokens * 4 * 64 * sizeof(float);  // 32 KiB
constexpr size_t kPoolBlocks = 1024 + 64;  // 16k tokens plus slack, per layer
constexpr size_t kPoolBytes = kLayers * kPoolBlocks * kBlockBytes;
constexpr size_t kRequestTokens[] = {1024, 4096, 16384};

struct Args {
  std::string mode, dir, net_devices;
  std::string secret;  // serve makes it (DIR/secret), pull reads it: both hold the same
  int reps = 5;
  size_t inflight = 64;
};

bool ParseArgs(int argc, char** argv, Args* args) {
  if (argc < 3) return false;
  args->mode = argv[1];
  args->dir = argv[2];
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--net-devices" && i + 1 < argc) {
      args->net_devices = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      args->reps = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--inflight" && i + 1 < argc) {
      args->inflight = std::stoul(argv[++i]);
    } else {
      return false;
    }
  }
  return args->mode == "serve" || args->mode == "pull";
}

// FNV-1a over the bytes of `ranges`, layer by layer, in order.
uint64_t Checksum(const uint8_t* base, const LayerRanges& ranges) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& layer : ranges)
    for (const ByteRange& r : layer)
      for (uint64_t i = 0; i < r.length; ++i) h = (h ^ base[r.offset + i]) * 1099511628211ull;
  return h;
}

// A request of `tokens` tokens whose blocks are scattered over the pool (as after a while of
// serving); the same seed gives the same layout.
LayerRanges ScatteredRequest(size_t tokens, uint64_t seed) {
  std::vector<uint32_t> ids(kPoolBlocks);
  for (uint32_t i = 0; i < kPoolBlocks; ++i) ids[i] = i;
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  LayerRanges ranges(kLayers);
  for (int l = 0; l < kLayers; ++l)
    for (size_t b = 0; b < tokens / kBlockTokens; ++b)
      ranges[l].push_back({(l * kPoolBlocks + ids[b]) * kBlockBytes, kBlockBytes});
  return ranges;
}

StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

UcxOptions Options(const Args& args) {
  UcxOptions options;
  options.tls = "tcp";
  options.net_devices = args.net_devices;
  options.timeout = 60s;
  options.lease_timeout = 600s;
  options.max_inflight_gets = args.inflight;
  options.report_results = false;  // the bench reports nothing back: leases just expire
  options.reads = UcxReads::kMessages;  // as the servers read over tcp
  options.secret = args.secret;
  return options;
}

int Serve(Args args) {
  const fs::path dir = args.dir;
  args.secret = "kv-link-bench-" + std::to_string(std::random_device{}()) +
                std::to_string(std::random_device{}());
  WriteFile(dir / "secret", args.secret);
  auto pool = AllocateUcxPool(kPoolBytes, Options(args));
  if (!pool.ok()) return std::fprintf(stderr, "pool: %s\n", pool.status().ToString().c_str()), 1;
  auto* bytes = static_cast<uint8_t*>((*pool)->region().base);
  std::mt19937_64 fill(7);
  for (size_t i = 0; i < kPoolBytes; i += 8) {
    const uint64_t v = fill();
    std::memcpy(bytes + i, &v, 8);
  }
  auto publisher = CreateUcxPublisher(*pool, Options(args));
  if (!publisher.ok())
    return std::fprintf(stderr, "publisher: %s\n", publisher.status().ToString().c_str()), 1;
  std::string descriptors;
  std::ostringstream checksums;
  for (size_t tokens : kRequestTokens) {
    const LayerRanges ranges = ScatteredRequest(tokens, tokens);
    checksums << tokens << ' ' << Checksum(bytes, ranges) << '\n';
    for (int rep = 0; rep <= args.reps; ++rep) {
      auto d = (*publisher)->Publish("t" + std::to_string(tokens) + "-r" + std::to_string(rep),
                                     ranges, [](const std::string&, const Status&) {});
      if (!d.ok()) return std::fprintf(stderr, "publish: %s\n", d.status().ToString().c_str()), 1;
      const std::string encoded = Encode(*d);
      const uint32_t size = static_cast<uint32_t>(encoded.size());
      descriptors.append(reinterpret_cast<const char*>(&size), sizeof size);
      descriptors += encoded;
    }
  }
  WriteFile(dir / "peer.bin", Encode((*publisher)->peer_info()));
  WriteFile(dir / "descriptors.bin", descriptors);
  WriteFile(dir / "checksums.txt", checksums.str());
  WriteFile(dir / "ready", "");
  const auto deadline = Clock::now() + 600s;
  while (!fs::exists(dir / "done") && Clock::now() < deadline) std::this_thread::sleep_for(50ms);
  return 0;
}

int Pull(Args args) {
  const fs::path dir = args.dir;
  auto secret = ReadFile(dir / "secret");
  if (!secret.ok()) return std::fprintf(stderr, "no secret in %s\n", args.dir.c_str()), 1;
  args.secret = *secret;
  auto peer_bytes = ReadFile(dir / "peer.bin");
  auto descriptor_bytes = ReadFile(dir / "descriptors.bin");
  auto checksum_text = ReadFile(dir / "checksums.txt");
  if (!peer_bytes.ok() || !descriptor_bytes.ok() || !checksum_text.ok())
    return std::fprintf(stderr, "no publisher files in %s\n", args.dir.c_str()), 1;
  auto peer = DecodePeerInfo(AsBytes(*peer_bytes));
  if (!peer.ok()) return std::fprintf(stderr, "peer: %s\n", peer.status().ToString().c_str()), 1;
  std::map<size_t, uint64_t> expected;
  std::istringstream cin(*checksum_text);
  for (size_t tokens = 0, sum = 0; cin >> tokens >> sum;) expected[tokens] = sum;

  auto pool = AllocateUcxPool(kPoolBytes, Options(args));
  if (!pool.ok()) return std::fprintf(stderr, "pool: %s\n", pool.status().ToString().c_str()), 1;
  auto* bytes = static_cast<uint8_t*>((*pool)->region().base);
  auto puller = CreateUcxPuller(*pool, Options(args));
  if (!puller.ok())
    return std::fprintf(stderr, "puller: %s\n", puller.status().ToString().c_str()), 1;
  if (Status s = (*puller)->Connect(*peer); !s.ok())
    return std::fprintf(stderr, "connect: %s\n", s.ToString().c_str()), 1;

  struct Row {
    uint64_t bytes = 0;
    size_t gets = 0;
    std::vector<double> seconds;  // warm-up excluded
    bool checked = false;
  };
  std::map<size_t, Row> rows;
  const std::string& all = *descriptor_bytes;
  for (size_t at = 0; at + 4 <= all.size();) {
    uint32_t size = 0;
    std::memcpy(&size, all.data() + at, 4);
    auto d = DecodeKvDescriptor(AsBytes(all.substr(at + 4, size)));
    at += 4 + size;
    if (!d.ok()) return std::fprintf(stderr, "descriptor: %s\n", d.status().ToString().c_str()), 1;
    const size_t tokens = std::stoul(d->request_id.substr(1));
    const bool warm_up = d->request_id.ends_with("-r0");
    std::fill(bytes, bytes + kPoolBytes, 0);  // a pull that moves nothing cannot pass the check
    PullWaiter waiter;
    const auto start = Clock::now();
    Status s = (*puller)->Pull(*d, d->layers, waiter.callbacks());
    if (s.ok()) s = waiter.Wait(120s);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!s.ok()) return std::fprintf(stderr, "pull %s: %s\n", d->request_id.c_str(),
                                     s.ToString().c_str()), 1;
    Row& row = rows[tokens];
    row.bytes = d->total_bytes;
    row.gets = 0;
    for (const auto& layer : d->layers) row.gets += layer.size();
    if (!warm_up) row.seconds.push_back(seconds);
    if (!row.checked) {
      if (Checksum(bytes, d->layers) != expected[tokens])
        return std::fprintf(stderr, "request of %zu tokens: bytes differ\n", tokens), 1;
      row.checked = true;
    }
  }
  std::ofstream tsv("kv_link_bench.tsv");
  tsv << "tokens\tbytes\tgets\tseconds_best\tseconds_median\tMiBps_best\tMiBps_median\n";
  std::printf("%6s %7s %6s %9s %11s %11s %6s\n", "tokens", "MiB", "gets", "best ms",
              "best MiB/s", "median MiB/s", "bytes");
  for (auto& [tokens, row] : rows) {
    std::sort(row.seconds.begin(), row.seconds.end());
    const double best = row.seconds.front(), median = row.seconds[row.seconds.size() / 2];
    const double mib = row.bytes / double(1 << 20);
    std::printf("%6zu %7.1f %6zu %9.1f %11.0f %11.0f %6s\n", tokens, mib, row.gets, best * 1e3,
                mib / best, mib / median, row.checked ? "ok" : "?");
    tsv << tokens << '\t' << row.bytes << '\t' << row.gets << '\t' << best << '\t' << median
        << '\t' << mib / best << '\t' << mib / median << '\n';
  }
  WriteFile(dir / "done", "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: %s serve DIR [--net-devices DEV] [--reps N]\n"
                 "       %s pull DIR [--net-devices DEV] [--inflight N]\n",
                 argv[0], argv[0]);
    return 2;
  }
  return args.mode == "serve" ? Serve(args) : Pull(args);
}
