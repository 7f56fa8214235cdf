#include "common/engine/kv_cache.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/config/serving_config.h"

namespace tandem {

const char* KvDTypeName(KvDType dtype) {
  return dtype == KvDType::kBFloat16 ? "bfloat16" : "float32";
}

std::string KvLayout::ToString() const {
  return "layers=" + std::to_string(num_layers) + " kv_heads=" + std::to_string(num_kv_heads) +
         " head_dim=" + std::to_string(head_dim) + " block_size=" + std::to_string(block_size) +
         (dtype == KvDType::kBFloat16 ? " bf16" : " fp32");
}

// ---- FreeBlockSet ----------------------------------------------------------------------------

FreeBlockSet::FreeBlockSet(int num_blocks)
    : words_((static_cast<size_t>(num_blocks) + 63) / 64, ~uint64_t{0}), count_(num_blocks) {
  if (num_blocks % 64 != 0) words_.back() = (uint64_t{1} << (num_blocks % 64)) - 1;
}

int32_t FreeBlockSet::TakeLowest() {
  TANDEM_CHECK(count_ > 0, "no free block to take");
  while (words_[first_word_] == 0) ++first_word_;
  uint64_t& word = words_[first_word_];
  const int bit = std::countr_zero(word);
  word &= word - 1;  // clears the lowest set bit
  --count_;
  return static_cast<int32_t>(first_word_ * 64 + bit);
}

void FreeBlockSet::Put(int32_t block) {
  const size_t w = static_cast<size_t>(block) / 64;
  const uint64_t bit = uint64_t{1} << (block % 64);
  TANDEM_CHECK((words_[w] & bit) == 0, "block " + std::to_string(block) + " freed twice");
  words_[w] |= bit;
  ++count_;
  first_word_ = std::min(first_word_, w);
}

// ---- BlockManager ----------------------------------------------------------------------------

BlockManager::BlockManager(int num_blocks, int block_size)
    : ref_counts_(num_blocks, 0), free_(num_blocks), block_size_(block_size) {
  if (block_size > 0) {
    key_.assign(num_blocks, 0);
    parent_.assign(num_blocks, -1);
    parent_generation_.assign(num_blocks, 0);
    generation_.assign(num_blocks, 0);
    tokens_.assign(static_cast<size_t>(num_blocks) * block_size, 0);
    index_.reserve(num_blocks);
    prev_.assign(num_blocks, -1);
    next_.assign(num_blocks, -1);
  }
}

Status BlockManager::Allocate(int n, std::vector<int32_t>* table) {
  TANDEM_CHECK(n >= 0);
  if (n > num_free())
    return ResourceExhausted("KV cache: " + std::to_string(n) + " blocks requested, " +
                             std::to_string(num_free()) + " free of " +
                             std::to_string(num_blocks()));
  for (int i = 0; i < n; ++i) {
    int32_t b = -1;
    if (!free_.empty()) {
      b = free_.TakeLowest();
    } else {  // evict the least recently freed cached block
      b = cache_head_;
      CacheRemove(b);
      Unpublish(b);
    }
    ref_counts_[b] = 1;
    if (block_size_ > 0) ++generation_[b];
    table->push_back(b);
  }
  return Status::Ok();
}

void BlockManager::AddRef(int32_t block) {
  TANDEM_CHECK(block >= 0 && block < num_blocks(), "block " + std::to_string(block));
  TANDEM_CHECK(ref_counts_[block] > 0, "AddRef on free block " + std::to_string(block));
  ++ref_counts_[block];
}

void BlockManager::Free(std::span<const int32_t> blocks) {
  // Last to first: cached, a sequence's tail is evicted before its head (which keeps the
  // prefix matchable longest).
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t b = *it;
    TANDEM_CHECK(b >= 0 && b < num_blocks(), "block " + std::to_string(b));
    TANDEM_CHECK(ref_counts_[b] > 0, "double free of block " + std::to_string(b));
    if (--ref_counts_[b] > 0) continue;
    if (block_size_ > 0 && key_[b] != 0 && caching_) {
      CacheAppend(b);
    } else {
      if (block_size_ > 0) Unpublish(b);
      free_.Put(b);
    }
  }
}

void BlockManager::SetCaching(bool caching) {
  caching_ = caching;
  if (caching) return;
  while (cache_head_ >= 0) {
    const int32_t b = cache_head_;
    CacheRemove(b);
    Unpublish(b);
    free_.Put(b);
  }
}

void BlockManager::CacheAppend(int32_t block) {
  prev_[block] = cache_tail_;
  next_[block] = -1;
  if (cache_tail_ >= 0) {
    next_[cache_tail_] = block;
  } else {
    cache_head_ = block;
  }
  cache_tail_ = block;
  ++num_cached_;
}

void BlockManager::CacheRemove(int32_t block) {
  const int32_t p = prev_[block], n = next_[block];
  if (p >= 0) {
    next_[p] = n;
  } else {
    cache_head_ = n;
  }
  if (n >= 0) {
    prev_[n] = p;
  } else {
    cache_tail_ = p;
  }
  prev_[block] = next_[block] = -1;
  --num_cached_;
}

uint64_t BlockManager::Key(int32_t parent, std::span<const int32_t> tokens) const {
  // FNV-1a over the parent id and the tokens; 0 is reserved for "not published".
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint32_t v) {
    for (int i = 0; i < 4; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<uint32_t>(parent));
  mix(parent < 0 ? 0 : generation_[parent]);
  for (int32_t t : tokens) mix(static_cast<uint32_t>(t));
  return h == 0 ? 1 : h;
}

uint64_t BlockManager::FirstBlockKey(std::span<const int32_t> tokens) const {
  if (block_size_ <= 0 || tokens.size() < static_cast<size_t>(block_size_)) return 0;
  return Key(-1, tokens.first(block_size_));
}

void BlockManager::Publish(int32_t block, int32_t parent, std::span<const int32_t> tokens) {
  if (block_size_ <= 0) return;
  TANDEM_CHECK(block >= 0 && block < num_blocks() && ref_counts_[block] > 0,
               "Publish of a block not in use: " + std::to_string(block));
  TANDEM_CHECK(tokens.size() == static_cast<size_t>(block_size_), "Publish of a partial block");
  if (key_[block] != 0) return;
  const uint64_t key = Key(parent, tokens);
  if (!index_.emplace(key, block).second) return;  // the same content (or a collision) is there
  key_[block] = key;
  parent_[block] = parent;
  parent_generation_[block] = parent < 0 ? 0 : generation_[parent];
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<long>(block) * block_size_);
}

void BlockManager::Unpublish(int32_t block) {
  if (key_[block] == 0) return;
  auto it = index_.find(key_[block]);
  if (it != index_.end() && it->second == block) index_.erase(it);
  key_[block] = 0;
}

int BlockManager::WalkPrefix(std::span<const int32_t> tokens, int max_blocks, int* cached,
                             std::vector<int32_t>* found) const {
  *cached = 0;
  if (block_size_ <= 0) return 0;
  const int full = static_cast<int>(tokens.size() / block_size_);
  int matched = 0;
  int32_t parent = -1;
  for (int k = 0; k < std::min(full, max_blocks); ++k) {
    const auto chunk = tokens.subspan(static_cast<size_t>(k) * block_size_, block_size_);
    auto it = index_.find(Key(parent, chunk));
    if (it == index_.end()) break;
    const int32_t b = it->second;
    const auto held = std::span<const int32_t>(tokens_).subspan(
        static_cast<size_t>(b) * block_size_, block_size_);
    if (parent_[b] != parent ||
        parent_generation_[b] != (parent < 0 ? 0 : generation_[parent]) ||
        !std::equal(held.begin(), held.end(), chunk.begin()))
      break;
    if (ref_counts_[b] == 0) ++*cached;
    if (found != nullptr) found->push_back(b);
    parent = b;
    ++matched;
  }
  return matched;
}

int BlockManager::PeekPrefix(std::span<const int32_t> tokens, int max_blocks, int* cached) const {
  return WalkPrefix(tokens, max_blocks, cached, nullptr);
}

int BlockManager::MatchPrefix(std::span<const int32_t> tokens, int max_blocks,
                              std::vector<int32_t>* table) {
  int cached = 0;
  const size_t first = table->size();
  const int matched = WalkPrefix(tokens, max_blocks, &cached, table);
  for (size_t i = first; i < table->size(); ++i) {
    const int32_t b = (*table)[i];
    if (ref_counts_[b] == 0) {  // cached: in use again
      CacheRemove(b);
      ref_counts_[b] = 1;
    } else {
      AddRef(b);
    }
  }
  return matched;
}

void BlockManager::PublishRun(std::span<const int32_t> table, std::span<const int32_t> tokens,
                              int first, int last) {
  for (int k = first; k < last; ++k)
    Publish(table[k], k == 0 ? -1 : table[k - 1],
            tokens.subspan(static_cast<size_t>(k) * block_size_, block_size_));
}

// ---- KvCache ---------------------------------------------------------------------------------

KvCache::KvCache(const KvLayout& layout, int num_blocks)
    : layout_(layout),
      num_blocks_(num_blocks),
      block_floats_(layout.block_bytes() / sizeof(float)),
      blocks_(num_blocks, layout.block_size) {}

KvDType ResolvedKvDType(const ClusterConfig& config) {
  if (config.kv_cache.dtype == "bfloat16") return KvDType::kBFloat16;
  if (config.kv_cache.dtype == "float32") return KvDType::kFloat32;
  for (const InstanceSection* s : {&config.prefill, &config.decode, &config.colocated})
    if (s->instances > 0 && s->device != "cuda") return KvDType::kFloat32;
  return KvDType::kBFloat16;
}

size_t KvPoolBytes(const KvLayout& layout, int num_blocks) {
  return layout.block_bytes() * static_cast<size_t>(num_blocks) * layout.num_layers;
}

StatusOr<KvPoolMemory> AllocateKvPoolMemory(size_t bytes) {
  size_t rounded = (bytes + 4095) / 4096 * 4096;
  void* base = rounded == 0 ? nullptr : std::aligned_alloc(4096, rounded);
  if (base == nullptr)
    return ResourceExhausted("KV cache: cannot allocate " + std::to_string(bytes) + " bytes");
  KvPoolMemory memory;
  memory.base = static_cast<std::byte*>(base);
  memory.bytes = rounded;
  memory.owner = std::shared_ptr<void>(base, [](void* p) { std::free(p); });
  return memory;
}

namespace {
Status CheckLayout(const KvLayout& layout, int num_blocks) {
  if (layout.num_layers <= 0 || layout.num_kv_heads <= 0 || layout.head_dim <= 0 ||
      layout.block_size <= 0 || num_blocks <= 0)
    return InvalidArgument("KV cache: bad layout " + layout.ToString() + " with " +
                           std::to_string(num_blocks) + " blocks");
  return Status::Ok();
}
}  // namespace

StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvLayout& layout, int num_blocks) {
  TANDEM_RETURN_IF_ERROR(CheckLayout(layout, num_blocks));
  TANDEM_ASSIGN_OR_RETURN(KvPoolMemory memory,
                          AllocateKvPoolMemory(KvPoolBytes(layout, num_blocks)));
  return Create(layout, num_blocks, std::move(memory));
}

StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvLayout& layout, int num_blocks,
                                                   KvPoolMemory memory) {
  TANDEM_RETURN_IF_ERROR(CheckLayout(layout, num_blocks));
  const size_t bytes = KvPoolBytes(layout, num_blocks);
  if (memory.base == nullptr || memory.bytes < bytes)
    return InvalidArgument("KV cache: " + std::to_string(memory.bytes) + " bytes of memory for a " +
                           std::to_string(bytes) + "-byte pool");
  if (reinterpret_cast<uintptr_t>(memory.base) % 64 != 0)
    return InvalidArgument("KV cache: pool memory is not 64-byte aligned");
  if (memory.kind == KvMemoryKind::kHost && layout.dtype != KvDType::kFloat32)
    return InvalidArgument(std::string("KV cache: a ") + KvDTypeName(layout.dtype) +
                           " pool in host memory (the CPU backend keeps KV in float32)");
  auto cache = std::unique_ptr<KvCache>(new KvCache(layout, num_blocks));
  // Host: touch every page now, not in the first decode steps. A device pool is zeroed by its
  // allocator (the host cannot write it).
  if (memory.kind == KvMemoryKind::kHost) std::memset(memory.base, 0, bytes);
  cache->base_ = reinterpret_cast<float*>(memory.base);
  cache->memory_kind_ = memory.kind;
  cache->memory_owner_ = std::move(memory.owner);
  return cache;
}

// ---- export / import ---------------------------------------------------------------------------

size_t ExportedKvBytes(const KvLayout& layout, size_t num_blocks) {
  return layout.block_bytes() * num_blocks * layout.num_layers;
}

namespace {
Status CheckTable(const KvCache& cache, std::span<const int32_t> table, size_t bytes) {
  if (cache.memory_kind() != KvMemoryKind::kHost)
    return FailedPrecondition("KV export/import: the pool is in device memory");
  size_t want = ExportedKvBytes(cache.layout(), table.size());
  if (bytes != want)
    return InvalidArgument("KV export/import: buffer has " + std::to_string(bytes) + " bytes, " +
                           std::to_string(table.size()) + " blocks of " +
                           cache.layout().ToString() + " need " + std::to_string(want));
  for (int32_t b : table) {
    if (b < 0 || b >= cache.num_blocks())
      return InvalidArgument("KV export/import: block id " + std::to_string(b) +
                             " outside the pool of " + std::to_string(cache.num_blocks()));
  }
  return Status::Ok();
}
}  // namespace

Status ExportBlocks(const KvCache& cache, std::span<const int32_t> table,
                    std::span<std::byte> out) {
  TANDEM_RETURN_IF_ERROR(CheckTable(cache, table, out.size()));
  const size_t bb = cache.block_bytes();
  std::byte* dst = out.data();
  for (int l = 0; l < cache.layout().num_layers; ++l) {
    for (int32_t b : table) {
      std::memcpy(dst, cache.BlockData(l, b), bb);
      dst += bb;
    }
  }
  return Status::Ok();
}

Status ImportBlocks(KvCache& cache, std::span<const int32_t> table, std::span<const std::byte> in) {
  TANDEM_RETURN_IF_ERROR(CheckTable(cache, table, in.size()));
  const size_t bb = cache.block_bytes();
  const std::byte* src = in.data();
  for (int l = 0; l < cache.layout().num_layers; ++l) {
    for (int32_t b : table) {
      std::memcpy(cache.BlockData(l, b), src, bb);
      src += bb;
    }
  }
  return Status::Ok();
}

StatusOr<int> KvPoolBlocks(const ClusterConfig& config, const InstanceSection& section,
                           const KvLayout& layout, uint64_t machine_bytes) {
  const char* name = &section == &config.prefill  ? "prefill"
                     : &section == &config.decode ? "decode"
                                                  : "colocated";
  // Bytes of one block across all layers: what a block of the pool costs.
  const uint64_t block_bytes = uint64_t{layout.block_bytes()} * layout.num_layers;
  const int64_t request_blocks = BlocksForTokens(config.model.max_model_len, layout.block_size);
  auto gib = [](double bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1 << 30));
    return std::string(text);
  };
  int64_t blocks = section.kv_blocks;
  std::string field = std::string(name) + ".kv_blocks";
  if (blocks <= 0) {
    field = "kv_cache.memory_fraction";
    const int64_t cap = request_blocks * section.max_batch_size;
    blocks = cap;
    if (machine_bytes > 0 && block_bytes > 0) {
      const double share = config.kv_cache.memory_fraction * static_cast<double>(machine_bytes);
      blocks = std::min<int64_t>(cap, static_cast<int64_t>(share / block_bytes));
    }
  }
  if (blocks < request_blocks)
    return InvalidArgument(
        config.Where(field) + ": " + field + ": the " + name + " KV pool holds " +
        std::to_string(blocks) + " blocks (" + gib(static_cast<double>(blocks) * block_bytes) +
        "), fewer than one request of model.max_model_len (" +
        std::to_string(config.model.max_model_len) + " tokens = " +
        std::to_string(request_blocks) + " blocks of " + gib(block_bytes) + "): raise it or "
        "lower model.max_model_len");
  const double pool_bytes = static_cast<double>(blocks) * block_bytes;
  if (machine_bytes > 0 && pool_bytes > kMaxKvMemoryShare * static_cast<double>(machine_bytes))
    return InvalidArgument(config.Where(field) + ": " + field + ": the " + name + " KV pool (" +
                           std::to_string(blocks) + " blocks, " + gib(pool_bytes) +
                           ") does not fit this machine's memory (" +
                           gib(static_cast<double>(machine_bytes)) + ")");
  if (blocks > std::numeric_limits<int32_t>::max())
    return InvalidArgument(config.Where(field) + ": " + field + ": too many blocks");
  return static_cast<int>(blocks);
}

StatusOr<int> KvPoolBlocks(const ClusterConfig& config, const InstanceSection& section,
                           const KvLayout& layout) {
  return KvPoolBlocks(config, section, layout, MachineMemoryBytes());
}

}  // namespace tandem
