// Fuzzes the KV transfer wire decoders (kvtransfer/wire.h): DecodeKvWireHeader, DecodePeerInfo,
// DecodeKvDescriptor, DecodeTransferResult, the NCCL pull order (kvtransfer/nccl_protocol.h, what
// a prefill instance decodes from its control connections), and the UCX read request
// (kvtransfer/ucx_reads.h, what a publisher decodes from anyone who reaches its worker) on the
// same bytes. Properties:
// nothing crashes; a message that decodes has the type and size its header says; Encode of it
// decodes to an equal struct and is a fixed point (encode(decode(encode(x))) == encode(x)); a
// descriptor's total_bytes is the sum of its ranges; a read request that decodes re-encodes to
// the same bytes.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kvtransfer/nccl_protocol.h"
#include "kvtransfer/ucx_reads.h"
#include "kvtransfer/wire.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace tandem;

template <typename T, typename DecodeFn>
void RoundTrip(std::span<const uint8_t> input, KvWireType type, DecodeFn decode) {
  StatusOr<T> decoded = decode(input);
  if (!decoded.ok()) return;
  StatusOr<KvWireHeader> header = DecodeKvWireHeader(input);
  FUZZ_CHECK(header.ok() && header->type == type && header->message_bytes == input.size(),
             "a decoded message's header does not say its type and size");
  std::string encoded = Encode(*decoded);
  StatusOr<T> again = decode(AsBytes(encoded));
  FUZZ_CHECK(again.ok(), "the re-encoding of a decoded message does not decode");
  FUZZ_CHECK(*again == *decoded, "decode(encode(x)) != x");
  FUZZ_CHECK(Encode(*again) == encoded, "encode/decode is not a fixed point");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> input(data, size);
  StatusOr<KvWireHeader> header = DecodeKvWireHeader(input);
  if (header.ok()) {
    FUZZ_CHECK(header->message_bytes >= kKvWireHeaderBytes, "a message shorter than its header");
  }
  RoundTrip<PeerInfo>(input, KvWireType::kPeerInfo, DecodePeerInfo);
  RoundTrip<KvDescriptor>(input, KvWireType::kKvDescriptor, DecodeKvDescriptor);
  RoundTrip<TransferResult>(input, KvWireType::kTransferResult, DecodeTransferResult);
  RoundTrip<NcclPullOrder>(input, KvWireType::kNcclPullOrder, DecodeNcclPullOrder);
  StatusOr<NcclPullOrder> order = DecodeNcclPullOrder(input);
  if (order.ok()) {
    for (const NcclPairOrder& pair : order->pairs)
      FUZZ_CHECK(pair.unique_id.size() == kNcclUniqueIdBytes,
                 "a pull order with a unique id of the wrong size");
    FUZZ_CHECK(order->local_shape.Validate().ok(), "a pull order with an invalid pool shape");
    FUZZ_CHECK(order->first_layer < order->end_layer &&
                   order->end_layer <= order->descriptor.layers.size(),
               "a pull order for layers outside its request");
  }
  StatusOr<ucx_detail::ReadRequest> read = ucx_detail::DecodeReadRequest(input);
  if (read.ok()) {
    FUZZ_CHECK(ucx_detail::EncodeReadRequest(*read) ==
                   std::string(reinterpret_cast<const char*>(data), size),
               "a read request does not re-encode to its bytes");
  }
  StatusOr<KvDescriptor> descriptor = DecodeKvDescriptor(input);
  if (descriptor.ok()) {
    StatusOr<uint64_t> total = TotalBytes(descriptor->layers);
    FUZZ_CHECK(total.ok() && *total == descriptor->total_bytes,
               "a descriptor's total_bytes is not the sum of its ranges");
  }
  return 0;
}
