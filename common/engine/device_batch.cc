#include "common/engine/device_batch.h"

#include <algorithm>

#include "common/base/status.h"
#include "common/engine/kv_cache.h"

namespace tandem {

void BuildDeviceBatch(std::span<const SequenceInput> batch, int32_t block_size,
                      int32_t max_blocks_per_seq, int32_t pad_to_seqs, int32_t tile_tokens,
                      DeviceBatch* out) {
  TANDEM_CHECK(block_size > 0 && tile_tokens > 0);
  const auto real = static_cast<int32_t>(batch.size());
  const int32_t seqs = std::max(real, pad_to_seqs);
  int32_t longest_blocks = 1;
  bool decode_only = true;
  for (const SequenceInput& seq : batch) {
    const int64_t end = int64_t{seq.start_position} + static_cast<int64_t>(seq.tokens.size());
    longest_blocks = std::max(longest_blocks, BlocksForTokens(end, block_size));
    decode_only = decode_only && seq.tokens.size() == 1;
  }
  TANDEM_CHECK(seqs == real || decode_only, "only decode batches are padded");
  if (max_blocks_per_seq == 0) max_blocks_per_seq = longest_blocks;
  TANDEM_CHECK(longest_blocks <= max_blocks_per_seq,
               "a sequence needs more blocks than the block table row holds");

  DeviceBatch& d = *out;
  d.num_seqs = seqs;
  d.real_seqs = real;
  d.max_blocks_per_seq = max_blocks_per_seq;
  d.decode_only = decode_only;
  d.max_context = 0;
  d.token_ids.clear();
  d.positions.clear();
  d.slot_mapping.clear();
  d.tiles.clear();
  d.block_tables.assign(static_cast<size_t>(seqs) * max_blocks_per_seq, 0);
  d.seq_lens.assign(seqs, 0);
  d.last_token.assign(seqs, 0);
  for (int32_t s = 0; s < seqs; ++s) {
    const bool padding = s >= real;
    const int32_t first = static_cast<int32_t>(d.token_ids.size());
    if (padding) {
      d.token_ids.push_back(0);
      d.positions.push_back(0);
      d.slot_mapping.push_back(-1);
      d.last_token[s] = first;
      d.tiles.insert(d.tiles.end(), {s, first, 1});
      continue;
    }
    const SequenceInput& seq = batch[s];
    const auto n = static_cast<int32_t>(seq.tokens.size());
    const int32_t end = seq.start_position + n;
    const int32_t blocks = BlocksForTokens(end, block_size);
    std::copy_n(seq.block_table.begin(), blocks,
                d.block_tables.begin() + static_cast<size_t>(s) * max_blocks_per_seq);
    for (int32_t i = 0; i < n; ++i) {
      const int32_t pos = seq.start_position + i;
      d.token_ids.push_back(seq.tokens[i]);
      d.positions.push_back(pos);
      d.slot_mapping.push_back(int64_t{seq.block_table[pos / block_size]} * block_size +
                               pos % block_size);
    }
    for (int32_t i = 0; i < n; i += tile_tokens)
      d.tiles.insert(d.tiles.end(), {s, first + i, std::min(tile_tokens, n - i)});
    d.seq_lens[s] = end;
    d.last_token[s] = first + n - 1;
    d.max_context = std::max(d.max_context, end);
  }
  d.num_tokens = static_cast<int32_t>(d.token_ids.size());
}

int32_t GraphBatchSize(std::span<const int32_t> sizes, int32_t num_seqs) {
  for (int32_t size : sizes)
    if (size >= num_seqs) return size;
  return 0;
}

std::vector<int32_t> DecodeGraphSizes(int32_t max_batch_sequences) {
  std::vector<int32_t> sizes;
  if (max_batch_sequences < 1) return sizes;
  for (int32_t size = 1; size <= max_batch_sequences;) {
    sizes.push_back(size);
    size = size < 8 ? size * 2 : size < 64 ? size + 8 : size + 32;
  }
  if (sizes.empty() || sizes.back() != max_batch_sequences) sizes.push_back(max_batch_sequences);
  return sizes;
}

DecodeGraphShape DecodeGraphShapeFor(int64_t max_context, int64_t max_model_len,
                                     int32_t block_size, int32_t partition_tokens) {
  TANDEM_CHECK(block_size > 0 && partition_tokens > 0 && max_context <= max_model_len);
  auto partitions_for = [&](int64_t tokens) {
    return std::max<int64_t>(1, (tokens + partition_tokens - 1) / partition_tokens);
  };
  const int64_t needed = partitions_for(max_context), most = partitions_for(max_model_len);
  int64_t partitions = 1;
  while (partitions < needed) partitions *= 2;
  partitions = std::min(partitions, most);
  const int64_t tokens =
      std::max<int64_t>(1, std::min(partitions * partition_tokens, max_model_len));
  return {static_cast<int32_t>(partitions), BlocksForTokens(tokens, block_size)};
}

}  // namespace tandem
