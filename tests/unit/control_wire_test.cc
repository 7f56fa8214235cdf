#include <catch2/catch.hpp>

#include <random>

#include "common/net/control_wire.h"
#include "common/net/wire_codec.h"

using namespace tandem;

namespace {

std::vector<ControlMessage> Samples() {
  Hello hello{InstanceRole::kDecode, 42, "decode-1", "tandem-tiny", "127.0.0.1:7001",
              std::string("\x00\x01peer", 6), 16, 4096};
  LoadReport load;
  load.instance_id = 42;
  load.queued_prefill_tokens = 900;
  load.waiting_requests = 3;
  load.running_requests = 17;
  load.free_kv_blocks = 1000;
  load.total_kv_blocks = 4096;
  load.prefill_seconds_per_token = 1.5e-4;
  load.decode_step_seconds = 0.021;
  load.decode_forward_seconds = 0.019;
  load.decode_step_batch = 6.5;
  load.decode_step_context_tokens = 3100.25;
  load.context_tokens = 5120;
  load.last_submit_seq = 77;
  Submit submit;
  submit.request_id = "cmpl-1";
  submit.prompt = {1, 2, 3, 70000};
  submit.sampling.temperature = 0.7f;
  submit.sampling.top_k = 40;
  submit.sampling.seed = 1234;
  submit.sampling.max_tokens = 99;
  submit.sampling.stop_token_ids = {5, 6};
  submit.sampling.logprobs = true;
  submit.sampling.top_logprobs = 3;
  submit.decode_address = "127.0.0.1:7002";
  submit.seq = 78;
  Tokens tokens{"cmpl-1", {{7, -0.5f, {{7, -0.5f}, {8, -1.25f}}}, {9, -0.1f, {}}}};
  Finish finish{"cmpl-1", "", StatusCode::kUnavailable, "decode-1 died", 12};
  KvReady ready;
  ready.request_id = "cmpl-2";
  ready.prompt = {4, 5};
  ready.first_token = {11, -0.2f, {}};
  ready.sampling.temperature = 0;
  ready.kv_descriptor = "descriptor-bytes";
  ready.kv_peer_info = "peer-bytes";
  KvReady early = ready;  // layer-wise: before prefill's forward pass
  early.request_id = "cmpl-3";
  early.first_token.reset();
  early.layers_ready = 0;
  KvProgress progress{"cmpl-3", 5, std::nullopt, false};
  KvProgress last{"cmpl-3", kAllLayersReady, GeneratedToken{12, -0.3f, {{12, -0.3f}}}, false};
  KvProgress ended{"cmpl-4", 32, GeneratedToken{2, -0.01f, {}}, true};
  return {hello, load, submit, Cancel{"cmpl-1"}, tokens, finish, ready,
          KvReleased{"cmpl-2", StatusCode::kDeadlineExceeded, "pull timed out"},
          early, progress, last, ended,
          KvTransport{"cmpl-5", std::string("order\0bytes\xff", 12)}};
}

}  // namespace

TEST_CASE("control wire: every message round-trips", "[control_wire]") {
  for (const ControlMessage& message : Samples()) {
    std::string frame = EncodeControl(message);
    StatusOr<size_t> size = ControlFrameBytes(ByteSpan(frame).first(kFrameHeaderBytes));
    REQUIRE(size.ok());
    CHECK(*size == frame.size());
    StatusOr<ControlMessage> back = DecodeControl(ByteSpan(frame));
    REQUIRE(back.ok());
    REQUIRE(back->index() == message.index());
    // Re-encoding the decoded message gives the same bytes: every field survived.
    CHECK(EncodeControl(*back) == frame);
  }
  Submit submit = std::get<Submit>(*DecodeControl(ByteSpan(EncodeControl(Samples()[2]))));
  CHECK(submit.sampling.seed == 1234u);
  CHECK(submit.sampling.top_k == 40);
  CHECK(submit.prompt == std::vector<int32_t>{1, 2, 3, 70000});
  CHECK(submit.seq == 78u);
  LoadReport load = std::get<LoadReport>(*DecodeControl(ByteSpan(EncodeControl(Samples()[1]))));
  CHECK(load.last_submit_seq == 77u);
  CHECK(load.decode_forward_seconds == 0.019);
  CHECK(load.decode_step_batch == 6.5);
  CHECK(load.decode_step_context_tokens == 3100.25);
  CHECK(load.context_tokens == 5120);
  KvReady early = std::get<KvReady>(*DecodeControl(ByteSpan(EncodeControl(Samples()[8]))));
  CHECK_FALSE(early.first_token.has_value());
  CHECK(early.layers_ready == 0);
  KvProgress ended = std::get<KvProgress>(*DecodeControl(ByteSpan(EncodeControl(Samples()[11]))));
  CHECK(ended.finished);
  REQUIRE(ended.first_token.has_value());
  CHECK(ended.first_token->token_id == 2);
  CHECK(ended.layers_ready == 32);
}

TEST_CASE("control wire: layers_ready out of range and bad flags are refused",
          "[control_wire]") {
  KvProgress p{"r", 3, std::nullopt, false};
  std::string frame = EncodeControl(p);
  // Body: u32 id length, id "r", i32 layers_ready, u8 has_token, u8 finished.
  const size_t at = 12 + 4 + 1;
  std::string negative = frame;
  negative[at] = static_cast<char>(0xfe);  // -2
  negative[at + 1] = negative[at + 2] = negative[at + 3] = static_cast<char>(0xff);
  CHECK_FALSE(DecodeControl(ByteSpan(negative)).ok());
  std::string flag = frame;
  flag[at + 5] = 2;  // finished must be 0 or 1
  CHECK_FALSE(DecodeControl(ByteSpan(flag)).ok());
  std::string token_flag = frame;
  token_flag[at + 4] = 1;  // claims a token that is not there
  CHECK_FALSE(DecodeControl(ByteSpan(token_flag)).ok());
  CHECK(DecodeControl(ByteSpan(frame)).ok());
}

TEST_CASE("control wire: truncated, extended and corrupted frames fail cleanly",
          "[control_wire]") {
  std::mt19937_64 rng(7);
  size_t failures = 0, cases = 0;
  for (const ControlMessage& message : Samples()) {
    std::string frame = EncodeControl(message);
    for (size_t cut = 0; cut < frame.size(); ++cut) {
      ++cases;
      failures += !DecodeControl(ByteSpan(frame.substr(0, cut))).ok();
    }
    ++cases;
    failures += !DecodeControl(ByteSpan(frame + "x")).ok();
    // Random byte flips: must never crash; most fail, some decode into other valid values.
    for (int i = 0; i < 2000; ++i) {
      std::string bad = frame;
      int flips = 1 + rng() % 4;
      for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] = static_cast<char>(rng());
      (void)DecodeControl(ByteSpan(bad));
    }
  }
  CHECK(failures == cases);  // every truncation and extension is rejected
}

TEST_CASE("control wire: random bytes and forged lengths never crash", "[control_wire]") {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 20000; ++i) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    if (i % 2 == 0 && bytes.size() >= 12) {  // a valid header over random bodies
      std::string header = EncodeControl(Cancel{"x"}).substr(0, 12);
      header[8] = static_cast<char>(bytes.size() - 12);
      header[9] = header[10] = header[11] = 0;
      header[6] = static_cast<char>(1 + rng() % 9);
      bytes.replace(0, 12, header);
    }
    (void)DecodeControl(ByteSpan(bytes));
  }
  // A header announcing more than the limit is refused before anything is read.
  std::string huge = EncodeControl(Cancel{"x"}).substr(0, 12);
  huge[11] = 0x7f;
  StatusOr<size_t> size = ControlFrameBytes(ByteSpan(huge));
  REQUIRE_FALSE(size.ok());
  CHECK(size.status().message().find("over the limit") != std::string::npos);
  // A count that claims more elements than bytes left.
  Submit s;
  s.request_id = "r";
  s.prompt = {1};
  std::string frame = EncodeControl(s);
  frame[12 + 4 + 1] = static_cast<char>(0xff);  // prompt count low byte
  frame[12 + 4 + 1 + 2] = 0x0f;
  CHECK_FALSE(DecodeControl(ByteSpan(frame)).ok());
}
