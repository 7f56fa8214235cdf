// The flat arrays a device forward pass reads for one batch: what the CPU pass works out in its
// own loops (each token's sequence, position and KV slot, each sequence's block table, context
// length and last token, the attention work list), laid out for kernels and built on the host.
// Shared host code of the CUDA backend (common/engine/cuda/cuda_forward.h), tested on the CPU.
//
// Padding (captured decode graphs replay a fixed batch size): sequences past the batch are one
// token each with token id 0, position 0, KV slot -1 (not written), context length 0 (a zero
// attention row) and a zero block table; their logits rows are ignored.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/engine/forward_backend.h"

namespace tandem {

struct DeviceBatch {
  int32_t num_tokens = 0;          // T, padding included
  int32_t num_seqs = 0;            // S, padding included
  int32_t real_seqs = 0;           // the batch's own sequences (the first ones)
  int32_t max_blocks_per_seq = 0;  // the row length of block_tables
  int32_t max_context = 0;         // the longest seq_lens entry
  bool decode_only = false;        // every sequence brings exactly one new token

  std::vector<int32_t> token_ids;     // [T]
  std::vector<int32_t> positions;     // [T]
  std::vector<int64_t> slot_mapping;  // [T] block * block_size + offset; -1: padding
  std::vector<int32_t> block_tables;  // [S][max_blocks_per_seq]; unused entries 0
  std::vector<int32_t> seq_lens;      // [S] cached tokens after the pass (start + new tokens)
  std::vector<int32_t> last_token;    // [S] index in [0, T) of each sequence's last new token
  // [num_tiles][3]: {sequence, first token, count}: up to tile_tokens consecutive new tokens of
  // one sequence, in order (the prefill attention work list).
  std::vector<int32_t> tiles;
  int32_t num_tiles() const { return static_cast<int32_t>(tiles.size() / 3); }
};

// Fills *out for `batch` (which ValidateForwardBatch accepted for a pool with this block size),
// reusing out's capacity. max_blocks_per_seq: the block table row length, 0 for the batch's
// own longest (a captured graph fixes it); it must cover every sequence (checked). pad_to_seqs
// (>= batch.size(), decode batches only): pads with one-token sequences up to that many.
void BuildDeviceBatch(std::span<const SequenceInput> batch, int32_t block_size,
                      int32_t max_blocks_per_seq, int32_t pad_to_seqs, int32_t tile_tokens,
                      DeviceBatch* out);

// The batch size a captured decode graph of `num_seqs` sequences is replayed at: the smallest
// of `sizes` (ascending) that holds num_seqs, or 0 when none does (run it eagerly).
int32_t GraphBatchSize(std::span<const int32_t> sizes, int32_t num_seqs);

// The decode batch sizes the CUDA backend captures graphs for: 1, 2, 4, 8, then every 8 up to
// 64, then every 32, up to max_batch_sequences.
std::vector<int32_t> DecodeGraphSizes(int32_t max_batch_sequences);

// The shape a decode graph is captured at (besides its batch size), for a batch whose longest
// context is max_context tokens: the split decode attention's partitions of partition_tokens
// each, rounded up to a power of two and at most what max_model_len needs, and block-table rows
// that hold those partitions' tokens (at most max_model_len's). A batch size then has a few
// graphs (log2 of max_model_len / partition_tokens, plus one), and a step over short contexts
// neither launches attention blocks for max_model_len's partitions (most of which would exit at
// once) nor uploads block-table rows of max_model_len.
struct DecodeGraphShape {
  int32_t partitions = 1;
  int32_t max_blocks_per_seq = 1;
  bool operator==(const DecodeGraphShape&) const = default;
};
DecodeGraphShape DecodeGraphShapeFor(int64_t max_context, int64_t max_model_len,
                                     int32_t block_size, int32_t partition_tokens);

}  // namespace tandem
