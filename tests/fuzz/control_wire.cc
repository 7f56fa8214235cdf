// Fuzzes the control plane's decoders (common/net/control_wire.h, common/net/control_auth.h):
// DecodeControl on whole frames, ControlFrameBytes on their headers, DecodeAuthChallenge on the
// handshake's challenge. Properties: nothing crashes; a frame that decodes is as long as its
// header says; its re-encoding decodes again and encodes to the same bytes (encode is a fixed
// point after one decode, which normalizes fields the decoder ignores); a challenge that decodes
// re-encodes to the same bytes but for its 2 reserved bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/net/control_auth.h"
#include "common/net/control_wire.h"
#include "common/net/wire_codec.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  std::span<const uint8_t> input(data, size);

  StatusOr<AuthNonce> nonce = DecodeAuthChallenge(input);
  if (nonce.ok()) {
    // Bytes 6-7 are reserved (sent as 0, not checked): the rest must re-encode the same.
    auto again = EncodeAuthChallenge(*nonce);
    FUZZ_CHECK(input.size() == again.size() && std::equal(again.begin(), again.begin() + 6, input.begin()) &&
                   std::equal(again.begin() + 8, again.end(), input.begin() + 8),
               "an accepted challenge re-encodes to other bytes");
  }

  StatusOr<size_t> frame_bytes = ControlFrameBytes(input.first(std::min(size, kFrameHeaderBytes)));
  StatusOr<ControlMessage> message = DecodeControl(input);
  if (!message.ok()) return 0;
  FUZZ_CHECK(frame_bytes.ok() && *frame_bytes == size,
             "a decoded frame's header does not give its size");
  std::string encoded = EncodeControl(*message);
  StatusOr<ControlMessage> again = DecodeControl(Bytes(encoded));
  FUZZ_CHECK(again.ok(), "the re-encoding of a decoded frame does not decode");
  FUZZ_CHECK(again->index() == message->index(), "the message type changed");
  FUZZ_CHECK(EncodeControl(*again) == encoded, "decode/encode is not a fixed point");
  return 0;
}
