// block_runs_bench: how many KV copies a request's blocks cost when they move between instances.
// A pull moves each run of adjacent block ids as one copy (one get, NCCL message or memcpy:
// kvtransfer CoalesceCopies), so the longer the runs the BlockManager hands out, the fewer and
// larger the copies. Under churn (requests of 8-256 blocks, at most N alive, a random one freed
// when the next does not fit), for a few pool loads: the mean run length of the tables Allocate
// gives after warm-up, with BlockManager (lowest free id first) and, beside it, a stack of free
// ids (what it did before: the last freed block first).
//
//   block_runs_bench [--requests 20000] [--seed 1]
// Prints a table; writes the raw numbers to block_runs_bench.tsv in the current directory.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/engine/kv_cache.h"

namespace {

constexpr int kPoolBlocks = 4096;

// The allocator before FreeBlockSet: a stack of free ids, lowest first in a fresh pool.
class StackAllocator {
 public:
  StackAllocator() {
    for (int b = kPoolBlocks - 1; b >= 0; --b) free_.push_back(b);
  }
  int num_free() const { return static_cast<int>(free_.size()); }
  void Allocate(int n, std::vector<int32_t>* table) {
    for (int i = 0; i < n; ++i) {
      table->push_back(free_.back());
      free_.pop_back();
    }
  }
  void Free(const std::vector<int32_t>& table) {
    for (int32_t b : table) free_.push_back(b);
  }

 private:
  std::vector<int32_t> free_;
};

struct BlockManagerAllocator {
  tandem::BlockManager blocks{kPoolBlocks};
  int num_free() const { return blocks.num_free(); }
  void Allocate(int n, std::vector<int32_t>* table) {
    if (!blocks.Allocate(n, table).ok()) std::abort();
  }
  void Free(const std::vector<int32_t>& table) { blocks.Free(table); }
};

struct Churn {
  double mean_run = 0;     // blocks per run of adjacent ascending ids
  double mean_load = 0;    // share of the pool allocated, sampled at each Allocate
};

template <typename Allocator>
Churn Run(size_t max_alive, int requests, uint64_t seed) {
  Allocator allocator;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> alive;
  double runs = 0, blocks = 0, load = 0;
  int counted = 0;
  for (int i = 0; i < requests; ++i) {
    const int n = 8 + static_cast<int>(rng() % 249);
    while (allocator.num_free() < n || alive.size() >= max_alive) {
      const size_t k = rng() % alive.size();
      allocator.Free(alive[k]);
      alive.erase(alive.begin() + static_cast<long>(k));
    }
    std::vector<int32_t> table;
    allocator.Allocate(n, &table);
    if (i >= requests / 10) {  // after warm-up
      int r = 1;
      for (size_t j = 1; j < table.size(); ++j) r += table[j] != table[j - 1] + 1;
      runs += r;
      blocks += static_cast<double>(table.size());
      load += 1.0 - static_cast<double>(allocator.num_free()) / kPoolBlocks;
      ++counted;
    }
    alive.push_back(std::move(table));
  }
  return Churn{blocks / runs, load / counted};
}

}  // namespace

int main(int argc, char** argv) {
  int requests = 20000;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--requests") && i + 1 < argc) {
      requests = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s [--requests N] [--seed S]\n", argv[0]);
      return 2;
    }
  }
  std::ofstream tsv("block_runs_bench.tsv");
  tsv << "max_alive\tpool_load\tblockmanager_mean_run\tstack_mean_run\n";
  std::printf("%9s %9s %26s %22s\n", "max alive", "pool load", "BlockManager (lowest first)",
              "stack (last freed first)");
  for (size_t max_alive : {4, 12, 24, 48}) {
    const Churn lowest = Run<BlockManagerAllocator>(max_alive, requests, seed);
    const Churn stack = Run<StackAllocator>(max_alive, requests, seed);
    std::printf("%9zu %8.0f%% %26.1f %22.1f\n", max_alive, lowest.mean_load * 100,
                lowest.mean_run, stack.mean_run);
    tsv << max_alive << '\t' << lowest.mean_load << '\t' << lowest.mean_run << '\t'
        << stack.mean_run << '\n';
  }
  return 0;
}
