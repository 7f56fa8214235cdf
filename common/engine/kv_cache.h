// Paged KV cache: a fixed pool of blocks allocated once, and the BlockManager that hands them out.
//
// BYTE LAYOUT (values of the layout's dtype: fp32, or bf16 on CUDA; native little endian), one
// allocation for the whole pool:
//
//   pool[layer][block][kv][kv_head][slot][head_dim]      kv: 0 = K, 1 = V; slot < block_size
//
// so block b of layer l is ONE contiguous byte range of block_bytes() =
// 2 * num_kv_heads * block_size * head_dim * value_bytes bytes, at offset
// (l * num_blocks + b) * block_bytes(). Token at position p of a request lives in block
// block_table[p / block_size], slot p % block_size, in every layer. K of head h is at
// BlockData(l, b) + (0 * num_kv_heads + h) * block_size * head_dim + slot * head_dim, V likewise
// with kv = 1. One request's KV for one layer is therefore the list of ranges
// {BlockData(l, b), block_bytes()} for b in its block table: the unit kvtransfer moves.
//
// K is stored after RoPE (what attention reads). Two pools can exchange blocks when their
// KvLayout values are equal.
//
// Threads: a KvCache and its BlockManager belong to one engine thread; the forward pass may
// read and write block memory from its worker threads while that thread waits for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/base/status.h"
#include "common/config/config.h"

namespace tandem {

inline constexpr int kDefaultBlockSize = 16;

// The type of the K and V values in a pool (kv_cache.dtype). The CPU backend computes and
// keeps KV in float32; the CUDA backend keeps either (bfloat16: half the memory a token).
enum class KvDType : uint8_t { kFloat32, kBFloat16 };
inline size_t KvValueBytes(KvDType dtype) { return dtype == KvDType::kBFloat16 ? 2 : 4; }
const char* KvDTypeName(KvDType dtype);  // "float32", "bfloat16"

struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = kDefaultBlockSize;
  KvDType dtype = KvDType::kFloat32;

  // Bytes of one (layer, block) range.
  size_t block_bytes() const {
    return size_t{2} * num_kv_heads * block_size * head_dim * KvValueBytes(dtype);
  }
  bool operator==(const KvLayout&) const = default;
  std::string ToString() const;  // "layers=2 kv_heads=2 head_dim=32 block_size=16 fp32"
};

// Hands out block ids of a pool of `num_blocks`. Reference counts let requests share prefix
// blocks: a block returns to the free list when its count falls to zero. The free list is
// preallocated: Allocate/Free allocate no memory (Allocate appends to the caller's table, which
// allocates only when that vector lacks capacity: reserve it); Publish may (an index entry).
//
// Prefix caching (when made with a block_size): a full block whose KV is computed can be
// published under the tokens it holds and the block before it. A request whose tokens begin
// with the same blocks then takes them (MatchPrefix, one more reference each) instead of
// computing them again: the n choices of one prompt, and requests with a common prefix (a
// system prompt, the earlier turns of a chat). A published block whose last owner frees it
// stays cached: it counts as free, and Allocate reuses the least recently freed of them (and
// unpublishes it) only when no never-published block is left. A match compares the tokens
// themselves (and the chain of blocks before them), never only a hash. A shared block is never
// written again: its owners write only past the tokens they matched.
// The free blocks that are not cached, handed out lowest id first: a request's blocks then come
// in runs of adjacent ids wherever the pool has such gaps, and each run moves between instances
// as one copy, get or message (kvtransfer CoalesceCopies). Under churn (perf/block_runs_bench:
// requests of 8-256 blocks, one freed at random) the runs average 6.6-18.9 blocks at 98-13%
// pool load, where a stack of free ids gives 1.0-1.1. A bitmap: Take and Put scan words.
class FreeBlockSet {
 public:
  explicit FreeBlockSet(int num_blocks);  // every block free
  int size() const { return count_; }
  bool empty() const { return count_ == 0; }
  int32_t TakeLowest();      // requires !empty()
  void Put(int32_t block);   // requires block not in the set

 private:
  std::vector<uint64_t> words_;
  int count_ = 0;
  size_t first_word_ = 0;  // no free block below this word
};

class BlockManager {
 public:
  // block_size > 0 enables Publish/MatchPrefix.
  explicit BlockManager(int num_blocks, int block_size = 0);

  // Appends n fresh blocks (ref count 1) to *table. All or nothing: ResourceExhausted leaves
  // *table unchanged when fewer than n blocks are free.
  Status Allocate(int n, std::vector<int32_t>* table);
  // One more owner for a block that is in use (a shared prefix).
  void AddRef(int32_t block);
  // Drops one reference from each block; frees those that reach zero (a published one is
  // cached). Freeing a free block is a bug (TANDEM_CHECK).
  void Free(std::span<const int32_t> blocks);

  // Publishes `block` (in use, its KV computed) as holding `tokens` (block_size of them) after
  // the sequence of blocks ending in `parent` (-1: the first block of a sequence). A block
  // already published, or content already published in another block, is left as it is.
  void Publish(int32_t block, int32_t parent, std::span<const int32_t> tokens);
  // Appends to *table the published blocks that hold the leading full blocks of `tokens`, in
  // order, at most max_blocks, taking a reference on each (a cached one is in use again);
  // returns how many.
  int MatchPrefix(std::span<const int32_t> tokens, int max_blocks, std::vector<int32_t>* table);
  // What MatchPrefix would take now, taking nothing: how many blocks, and in *cached how many of
  // them are cached (taking one of those uses up a free block).
  int PeekPrefix(std::span<const int32_t> tokens, int max_blocks, int* cached) const;
  // Publishes blocks [first, last) of a sequence's block table, which hold `tokens` (the
  // sequence's, from its start), each after the one before it.
  void PublishRun(std::span<const int32_t> table, std::span<const int32_t> tokens, int first,
                  int last);
  int num_published() const { return static_cast<int>(index_.size()); }
  // A hash of a sequence's first block (block_size tokens of `tokens`), or 0 when `tokens` has
  // fewer: equal for requests that could share that block. For scheduling hints only.
  uint64_t FirstBlockKey(std::span<const int32_t> tokens) const;

  int num_blocks() const { return static_cast<int>(ref_counts_.size()); }
  // Blocks Allocate can hand out: never used or unpublished, plus cached ones.
  int num_free() const { return free_.size() + num_cached_; }
  int num_cached() const { return num_cached_; }  // published, owned by nobody
  // false: a published block is unpublished when its last owner frees it (sharing only among
  // owners at once). Drops what is cached now.
  void SetCaching(bool caching);
  int ref_count(int32_t block) const { return ref_counts_[block]; }
  int block_size() const { return block_size_; }

 private:
  uint64_t Key(int32_t parent, std::span<const int32_t> tokens) const;  // of parent's content now
  void Unpublish(int32_t block);
  // The published blocks that hold tokens' leading full blocks (at most max_blocks): how many,
  // how many of them are cached, appended to *found when it is not null.
  int WalkPrefix(std::span<const int32_t> tokens, int max_blocks, int* cached,
                 std::vector<int32_t>* found) const;
  // The cached blocks, least recently freed first: a list linked through prev_/next_.
  void CacheAppend(int32_t block);
  void CacheRemove(int32_t block);

  std::vector<int32_t> ref_counts_;
  FreeBlockSet free_;  // never used or unpublished
  int block_size_ = 0;
  // Per block, while published: its key, its parent (and the parent's generation when it was
  // published) and its tokens (num_blocks x block_size). A block's generation counts the times
  // Allocate handed it out: a cached child of a parent evicted and reused since never matches.
  std::vector<uint64_t> key_;  // 0: not published
  std::vector<int32_t> parent_;
  std::vector<uint32_t> parent_generation_;
  std::vector<uint32_t> generation_;
  std::vector<int32_t> tokens_;
  std::unordered_map<uint64_t, int32_t> index_;  // key -> published block
  std::vector<int32_t> prev_, next_;  // the cached list; -1 ends it
  int32_t cache_head_ = -1, cache_tail_ = -1;
  int num_cached_ = 0;
  bool caching_ = true;
};

// The bytes of a pool and what keeps them alive: `owner` frees them when its last copy goes (a
// KvCache holds one). A transport that can only do fast RMA on memory it allocated itself (UCX
// over shared memory) hands the pool one of these instead of the heap.
//
// Device memory (kind kCudaDevice: a CUDA backend's pool, common/engine/forward_backend.h) has
// the same layout; host code may compute addresses in it (BlockData) but never dereferences
// them, and its allocator zeroes it.
enum class KvMemoryKind : uint8_t { kHost, kCudaDevice };

struct KvPoolMemory {
  std::byte* base = nullptr;  // at least 64-byte aligned
  size_t bytes = 0;
  std::shared_ptr<void> owner;
  KvMemoryKind kind = KvMemoryKind::kHost;
};

// The KV dtype of every pool of a cluster (kv_cache.dtype, validated by LoadConfig): auto is
// bfloat16 when every instance that runs (prefill, decode, colocated) is on device cuda, else
// float32.
KvDType ResolvedKvDType(const ClusterConfig& config);

// Bytes a pool of `num_blocks` blocks per layer needs.
size_t KvPoolBytes(const KvLayout& layout, int num_blocks);

// The blocks that hold `tokens` tokens: ceil(tokens / block_size). The one place this is written.
inline int32_t BlocksForTokens(int64_t tokens, int32_t block_size) {
  return static_cast<int32_t>((tokens + block_size - 1) / block_size);
}

// The KV pool size (blocks per layer) of one instance of `section` (one of config's prefill,
// decode, colocated) for a model whose KV has `layout`: section.kv_blocks when set, else
// kv_cache.memory_fraction of `machine_bytes`, at most what section.max_batch_size requests of
// model.max_model_len need. InvalidArgument naming the field and where it was set when the pool
// holds less than one request of model.max_model_len, or takes more than kMaxKvMemoryShare of
// `machine_bytes` (0 = unknown: not checked).
StatusOr<int> KvPoolBlocks(const ClusterConfig& config, const InstanceSection& section,
                           const KvLayout& layout, uint64_t machine_bytes);
// Same, on this machine (MachineMemoryBytes, common/config/serving_config.h).
StatusOr<int> KvPoolBlocks(const ClusterConfig& config, const InstanceSection& section,
                           const KvLayout& layout);

// `bytes` of 4096-aligned heap memory. ResourceExhausted when it is not available.
StatusOr<KvPoolMemory> AllocateKvPoolMemory(size_t bytes);

class KvCache {
 public:
  // Allocates (and zeroes) the pool on the heap. ResourceExhausted when the memory is not
  // available.
  static StatusOr<std::unique_ptr<KvCache>> Create(const KvLayout& layout, int num_blocks);
  // Places the pool in `memory` (host memory: zeroes and touches it now) and keeps memory.owner
  // alive.
  // InvalidArgument when it is smaller than KvPoolBytes or misaligned.
  static StatusOr<std::unique_ptr<KvCache>> Create(const KvLayout& layout, int num_blocks,
                                                   KvPoolMemory memory);

  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvLayout& layout() const { return layout_; }
  int num_blocks() const { return num_blocks_; }
  size_t block_bytes() const { return layout_.block_bytes(); }
  size_t total_bytes() const { return block_bytes() * num_blocks_ * layout_.num_layers; }
  BlockManager& blocks() { return blocks_; }
  const BlockManager& blocks() const { return blocks_; }

  // The contiguous range of (layer, block); block_bytes() long.
  float* BlockData(int layer, int32_t block) {
    return base_ + (size_t{static_cast<size_t>(layer)} * num_blocks_ + block) * block_floats_;
  }
  const float* BlockData(int layer, int32_t block) const {
    return const_cast<KvCache*>(this)->BlockData(layer, block);
  }
  // K (kv = 0) or V (kv = 1) of one head in a block: [block_size][head_dim] (a float32 pool).
  float* HeadData(int layer, int32_t block, int kv, int head) {
    return BlockData(layer, block) +
           (size_t{static_cast<size_t>(kv)} * layout_.num_kv_heads + head) * layout_.block_size *
               layout_.head_dim;
  }
  const float* HeadData(int layer, int32_t block, int kv, int head) const {
    return const_cast<KvCache*>(this)->HeadData(layer, block, kv, head);
  }
  // Where the pool is: host memory, or a device's (then BlockData's addresses are the device's).
  KvMemoryKind memory_kind() const { return memory_kind_; }
  // Start of the whole pool (for registering it with a transport).
  std::byte* data() { return reinterpret_cast<std::byte*>(base_); }
  const std::byte* data() const { return reinterpret_cast<const std::byte*>(base_); }

 private:
  KvCache(const KvLayout& layout, int num_blocks);

  KvLayout layout_;
  int num_blocks_;
  size_t block_floats_;
  float* base_ = nullptr;
  std::shared_ptr<void> memory_owner_;  // keeps base_ alive
  KvMemoryKind memory_kind_ = KvMemoryKind::kHost;
  BlockManager blocks_;
};

// Bytes of a request's KV exported as raw bytes: num_layers * blocks * block_bytes.
size_t ExportedKvBytes(const KvLayout& layout, size_t num_blocks);

// Copies the blocks in `table` (in order) to `out`, layer-major: for each layer, for each
// block of the table, its block_bytes() range. InvalidArgument when out has the wrong size or a
// block id is out of range; FailedPrecondition for a pool in device memory.
Status ExportBlocks(const KvCache& cache, std::span<const int32_t> table, std::span<std::byte> out);
// The inverse: writes `in` (as produced by ExportBlocks from a pool of the same KvLayout) into
// the blocks of `table` in `cache`. InvalidArgument on a size mismatch, FailedPrecondition for a
// pool in device memory; nothing is written then.
Status ImportBlocks(KvCache& cache, std::span<const int32_t> table, std::span<const std::byte> in);

}  // namespace tandem
