#include "kvtransfer/nccl_packing.h"

#include <algorithm>

#include "common/base/status.h"
#include "kvtransfer/nccl_protocol.h"

namespace tandem {

bool IsPacked(const OrderedLink::Message& msg, uint64_t staging_bytes) {
  if (msg.bytes == 0 || msg.rows == 0 || msg.bytes > staging_bytes) return false;
  return msg.rows > 1 || msg.bytes < kSmallMessageBytes;
}

LayerSends PlanLayerSends(std::span<const OrderedLink::Message> layer, uint64_t staging_bytes) {
  TANDEM_CHECK(staging_bytes > 0, "a staging buffer of no bytes");
  LayerSends plan;
  PackRound round;
  for (size_t m = 0; m < layer.size(); ++m) {
    const OrderedLink::Message& msg = layer[m];
    if (msg.bytes == 0 || msg.rows == 0) continue;  // nothing to move
    if (!IsPacked(msg, staging_bytes)) {
      plan.direct.push_back(m);
      continue;
    }
    uint64_t row = 0;
    while (row < msg.rows) {
      const uint64_t fit = (staging_bytes - round.bytes) / msg.bytes;
      if (fit == 0) {  // full: this round is done
        plan.rounds.push_back(std::move(round));
        round = PackRound();
        continue;
      }
      const uint64_t take = std::min(fit, msg.rows - row);
      round.parts.push_back({m, row, take, round.bytes});
      round.bytes += take * msg.bytes;
      row += take;
    }
  }
  if (round.bytes > 0) plan.rounds.push_back(std::move(round));
  return plan;
}

uint16_t MessageLayoutOf(std::span<const OrderedLink::Message> messages,
                         uint64_t staging_bytes) {
  for (const OrderedLink::Message& msg : messages)
    if (IsPacked(msg, staging_bytes)) return kNcclLayoutPacked;
  return kNcclLayoutPerRow;
}

std::vector<RowCopy> GatherCopies(const PackRound& round,
                                  std::span<const OrderedLink::Message> layer, void* staging) {
  std::vector<RowCopy> copies;
  copies.reserve(round.parts.size());
  for (const PackedRows& part : round.parts) {
    const OrderedLink::Message& msg = layer[part.message];
    copies.push_back({static_cast<const char*>(msg.data) + part.first_row * msg.stride,
                      static_cast<char*>(staging) + part.staging_offset, msg.stride, msg.bytes,
                      msg.bytes, part.rows});
  }
  return copies;
}

std::vector<RowCopy> ScatterCopies(const PackRound& round,
                                   std::span<const OrderedLink::Message> layer,
                                   const void* staging) {
  std::vector<RowCopy> copies;
  copies.reserve(round.parts.size());
  for (const PackedRows& part : round.parts) {
    const OrderedLink::Message& msg = layer[part.message];
    copies.push_back({static_cast<const char*>(staging) + part.staging_offset,
                      static_cast<char*>(msg.data) + part.first_row * msg.stride, msg.bytes,
                      msg.stride, msg.bytes, part.rows});
  }
  return copies;
}

size_t LayerSendCount(const std::vector<OrderedLink::Message>& messages, uint64_t staging_bytes) {
  size_t sends = 0;
  for (size_t begin = 0; begin < messages.size();) {
    size_t end = begin;
    while (end < messages.size() && messages[end].layer == messages[begin].layer) ++end;
    const LayerSends plan =
        PlanLayerSends(std::span(messages).subspan(begin, end - begin), staging_bytes);
    for (size_t m : plan.direct) sends += messages[begin + m].rows;
    sends += plan.rounds.size();
    begin = end;
  }
  return sends;
}

}  // namespace tandem
