// Real `tandem prefill`, `tandem decode` and `tandem colocated` processes, with this test acting
// as the router over the control plane: greedy tokens equal the engine alone (`tandem
// generate`), one Finish per request, LoadReports arrive, and kill -9 of the decode instance
// makes prefill free the KV it was holding.
#include <catch2/catch.hpp>

#include "tests/integration/instance_harness.h"

namespace tandem {
namespace {

using namespace test;  // NOLINT: the harness is this file's vocabulary
using namespace std::chrono_literals;

TEST_CASE("instances: prefill + decode stream the engine-alone tokens, decode kill frees prefill",
          "[instances]") {
  const bool layerwise = GENERATE(false, true);
  INFO("transfer.layerwise " << layerwise);
  Cluster cluster("  kv_blocks: 12\n  kv_usage_watermark: 0.1\n", layerwise);
  Child prefill(cluster.Args("prefill"), cluster.Log("prefill"));
  Child decode(cluster.Args("decode"), cluster.Log("decode"));
  FakeRouter router;
  const int p = router.Connect(cluster.prefill_port);
  const int d = router.Connect(cluster.decode_port);
  const std::string decode_address = "127.0.0.1:" + std::to_string(cluster.decode_port);
  Inbox& inbox = router.inbox;
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.load_count[p] > 2 && inbox.load_count[d] > 2; }));
  CHECK(router.hello(p).role == InstanceRole::kPrefill);
  CHECK_FALSE(router.hello(p).kv_peer_info.empty());
  CHECK(router.hello(d).role == InstanceRole::kDecode);
  CHECK(router.hello(p).model == "model");
  {
    std::string metrics = HttpGet(cluster.metrics_port, "/metrics");
    CHECK(metrics.find("HTTP/1.1 200") == 0);
    CHECK(metrics.find("tandem_num_requests_waiting{role=\"prefill\",model=\"model\"}") !=
          std::string::npos);
    CHECK(metrics.find("tandem_kv_cache_usage_ratio") != std::string::npos);
    CHECK(metrics.find("tandem_prefill_batch_seconds_bucket") != std::string::npos);
    CHECK(HttpGet(cluster.metrics_port, "/health").find("HTTP/1.1 200") == 0);
    CHECK(HttpGet(cluster.metrics_port, "/nope").find("HTTP/1.1 404") == 0);
  }

  const std::vector<int> lengths = {5, 16, 40, 70};  // 70 > token budget 32: chunked prefill
  const int max_tokens = 12;
  for (size_t i = 0; i < lengths.size(); ++i)
    router.Send(p, Greedy("r" + std::to_string(i), Prompt(lengths[i], i), max_tokens,
                          decode_address));
  REQUIRE(inbox.WaitFor(40s, [&] {
    for (size_t i = 0; i < lengths.size(); ++i)
      if (inbox.finishes["r" + std::to_string(i)].empty()) return false;
    return true;
  }));
  std::this_thread::sleep_for(300ms);  // a duplicate Finish would arrive by now
  for (size_t i = 0; i < lengths.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    std::vector<int32_t> expected = EngineAlone(cluster.model, Prompt(lengths[i], i), max_tokens);
    std::lock_guard<std::mutex> lock(inbox.mutex);
    INFO(id);
    CHECK(inbox.InRouterOrder(id, p) == expected);
    REQUIRE(inbox.finishes[id].size() == 1);
    CHECK(inbox.finishes[id][0].code == StatusCode::kOk);
    CHECK(inbox.finishes[id][0].completion_tokens == static_cast<int32_t>(expected.size()));
  }
  // A request that ends at its first token: prefill finishes it (layer-wise, after it has
  // announced the KV to decode, which pulls it and drops it without a Finish of its own).
  router.Send(p, Greedy("one", Prompt(30, 3), 1, decode_address));
  REQUIRE(inbox.WaitFor(20s, [&] { return !inbox.finishes["one"].empty(); }));
  std::this_thread::sleep_for(300ms);
  {
    std::lock_guard<std::mutex> lock(inbox.mutex);
    REQUIRE(inbox.finishes["one"].size() == 1);
    CHECK(inbox.finishes["one"][0].code == StatusCode::kOk);
    CHECK(inbox.finishes["one"][0].completion_tokens == 1);
    CHECK(inbox.tokens["one"].size() == 1);
  }
  // Every block is back on both sides.
  REQUIRE(inbox.WaitFor(5s, [&] {
    return inbox.last_load[p].free_kv_blocks == inbox.last_load[p].total_kv_blocks &&
           inbox.last_load[d].free_kv_blocks == inbox.last_load[d].total_kv_blocks;
  }));

  // kill -9 decode while prefill holds KV for it. To make "holds" deterministic, decode is
  // stopped (SIGSTOP) first: it accepts nothing more, so the KvReady for "held" waits in the
  // socket and prefill keeps the blocks until the connection dies.
  Submit a = Greedy("long-a", Prompt(20, 7), 150, decode_address);
  a.sampling.ignore_eos = true;
  router.Send(p, a);
  REQUIRE(inbox.WaitFor(20s, [&] { return inbox.tokens["long-a"].size() >= 2; }));
  decode.Signal(SIGSTOP);
  Submit b = Greedy("held", Prompt(40, 8), 20, decode_address);
  b.sampling.ignore_eos = true;
  router.Send(p, b);
  REQUIRE(inbox.WaitFor(20s, [&] {
    return inbox.tokens["held"].size() == 1 &&
           inbox.last_load[p].free_kv_blocks < inbox.last_load[p].total_kv_blocks;
  }));
  decode.Kill();
  REQUIRE(inbox.WaitFor(10s, [&] {
    return inbox.last_load[p].free_kv_blocks == inbox.last_load[p].total_kv_blocks &&
           inbox.last_load[p].waiting_requests == 0;
  }));

  // An unreachable decode instance: the request fails cleanly with Unavailable.
  router.Send(p, Greedy("orphan", Prompt(8, 9), 8, decode_address));
  REQUIRE(inbox.WaitFor(10s, [&] { return !inbox.finishes["orphan"].empty(); }));
  {
    std::lock_guard<std::mutex> lock(inbox.mutex);
    CHECK(inbox.finishes["orphan"][0].code == StatusCode::kUnavailable);
  }
  REQUIRE(inbox.WaitFor(5s, [&] {
    return inbox.last_load[p].free_kv_blocks == inbox.last_load[p].total_kv_blocks;
  }));
  // SIGTERM: prefill drains and exits 0.
  CHECK(prefill.Terminate(10s) == 0);
}

TEST_CASE("instances: colocated streams the engine-alone tokens under preemption, kill -9",
          "[instances]") {
  // Both colocated policies: chunked prompts in decode steps, and prefill_first (whole prompts,
  // two of them longer than the 24-token budget, which then run alone).
  const std::string scheduling = GENERATE(as<std::string>{}, "chunked", "prefill_first");
  INFO("colocated.scheduling " << scheduling);
  Cluster cluster;
  std::vector<std::string> args = cluster.Args("colocated");
  args.push_back("--colocated.scheduling=" + scheduling);
  Child colocated(args, cluster.Log("colocated"));
  FakeRouter router;
  const int c = router.Connect(cluster.colocated_port);
  Inbox& inbox = router.inbox;
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.load_count[c] > 2; }));
  CHECK(router.hello(c).role == InstanceRole::kColocated);

  const std::vector<int> lengths = {20, 25, 9, 30};
  const int max_tokens = 30;  // each needs 3-4 of the 6 blocks: preemption is certain
  for (size_t i = 0; i < lengths.size(); ++i) {
    Submit s = Greedy("c" + std::to_string(i), Prompt(lengths[i], 20 + i), max_tokens, "");
    s.sampling.ignore_eos = true;
    router.Send(c, s);
  }
  REQUIRE(inbox.WaitFor(40s, [&] {
    for (size_t i = 0; i < lengths.size(); ++i)
      if (inbox.finishes["c" + std::to_string(i)].empty()) return false;
    return true;
  }));
  std::this_thread::sleep_for(300ms);
  for (size_t i = 0; i < lengths.size(); ++i) {
    const std::string id = "c" + std::to_string(i);
    std::vector<int32_t> expected;
    {
      // generate stops at eos unless asked not to; the requests ignore eos.
      std::string ids;
      for (int32_t t : Prompt(lengths[i], 20 + i)) ids += (ids.empty() ? "" : ",") + std::to_string(t);
      std::string out = Run(std::string(test::TandemBinary()) + " generate --ignore-eos --model " +
                            cluster.model + " --prompt-ids " + ids + " --max-tokens " +
                            std::to_string(max_tokens) + " 2>/dev/null");
      size_t at = out.find("generated_ids:");
      REQUIRE(at != std::string::npos);
      std::istringstream line(out.substr(at + 14, out.find('\n', at) - at - 14));
      int32_t v;
      while (line >> v) expected.push_back(v);
    }
    std::lock_guard<std::mutex> lock(inbox.mutex);
    INFO(id);
    CHECK(inbox.tokens[id] == expected);
    REQUIRE(inbox.finishes[id].size() == 1);
    CHECK(inbox.finishes[id][0].finish_reason == "length");
  }
  REQUIRE(inbox.WaitFor(5s, [&] {
    return inbox.last_load[c].free_kv_blocks == inbox.last_load[c].total_kv_blocks;
  }));
  {
    // Six blocks for four requests of three blocks each: some were preempted and recomputed.
    std::string metrics = HttpGet(cluster.colocated_metrics_port, "/metrics");
    const std::string name = "tandem_preemptions_total{role=\"colocated\",model=\"model\"} ";
    size_t at = metrics.find(name);
    REQUIRE(at != std::string::npos);
    CHECK(std::stod(metrics.substr(at + name.size())) > 0);
  }
  // A submit to a prefill-only field is fine here; a cancelled request ends with one Finish.
  Submit longer = Greedy("cancel-me", Prompt(10, 3), 80, "");
  longer.sampling.ignore_eos = true;
  router.Send(c, longer);
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.tokens["cancel-me"].size() >= 2; }));
  router.Send(c, Cancel{"cancel-me"});
  REQUIRE(inbox.WaitFor(10s, [&] { return !inbox.finishes["cancel-me"].empty(); }));
  REQUIRE(inbox.WaitFor(5s, [&] {
    return inbox.last_load[c].free_kv_blocks == inbox.last_load[c].total_kv_blocks;
  }));

  // kill -9 mid-stream: the router sees the connection drop (its requests are its to fail).
  Submit s = Greedy("killed", Prompt(10, 4), 80, "");  // 90 tokens: all 6 blocks
  s.sampling.ignore_eos = true;
  router.Send(c, s);
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.tokens["killed"].size() >= 2; }));
  colocated.Kill();
  REQUIRE(inbox.WaitFor(5s, [&] { return inbox.closed[c]; }));
}

TEST_CASE("instances: decode preempts and recomputes when its pool runs out, tokens unchanged",
          "[instances]") {
  // Eight decode blocks (16 tokens each) for four requests that grow to five or six blocks
  // each: any two that overlap run the pool out. (With 30 output tokens, three or four blocks
  // each, a CI run under load once staggered them so that no step ran out.)
  const bool layerwise = GENERATE(false, true);
  INFO("transfer.layerwise " << layerwise);
  const int decode_metrics_port = FreePort();
  Cluster cluster("  kv_blocks: 8\n  kv_usage_watermark: 1.0\n  metrics_port: " +
                      std::to_string(decode_metrics_port) + "\n",
                  layerwise);
  Child prefill(cluster.Args("prefill"), cluster.Log("prefill"));
  Child decode(cluster.Args("decode"), cluster.Log("decode"));
  FakeRouter router;
  const int p = router.Connect(cluster.prefill_port);
  const int d = router.Connect(cluster.decode_port);
  const std::string decode_address = "127.0.0.1:" + std::to_string(cluster.decode_port);
  Inbox& inbox = router.inbox;
  const std::vector<int> lengths = {18, 22, 12, 26};
  const int max_tokens = 60;
  for (size_t i = 0; i < lengths.size(); ++i) {
    Submit s = Greedy("d" + std::to_string(i), Prompt(lengths[i], 40 + i), max_tokens,
                      decode_address);
    s.sampling.ignore_eos = true;
    router.Send(p, s);
  }
  REQUIRE(inbox.WaitFor(40s, [&] {
    for (size_t i = 0; i < lengths.size(); ++i)
      if (inbox.finishes["d" + std::to_string(i)].empty()) return false;
    return true;
  }));
  std::this_thread::sleep_for(300ms);
  for (size_t i = 0; i < lengths.size(); ++i) {
    const std::string id = "d" + std::to_string(i);
    std::vector<int32_t> expected =
        EngineAlone(cluster.model, Prompt(lengths[i], 40 + i), max_tokens, /*ignore_eos=*/true);
    std::lock_guard<std::mutex> lock(inbox.mutex);
    INFO(id);
    CHECK(inbox.InRouterOrder(id, p) == expected);
    REQUIRE(inbox.finishes[id].size() == 1);
    CHECK(inbox.finishes[id][0].finish_reason == "length");
    CHECK(inbox.finishes[id][0].completion_tokens == max_tokens);
  }
  REQUIRE(inbox.WaitFor(5s, [&] {
    return inbox.last_load[p].free_kv_blocks == inbox.last_load[p].total_kv_blocks &&
           inbox.last_load[d].free_kv_blocks == inbox.last_load[d].total_kv_blocks;
  }));
  {
    std::string metrics = HttpGet(decode_metrics_port, "/metrics");
    const std::string name = "tandem_preemptions_total{role=\"decode\",model=\"model\"} ";
    size_t at = metrics.find(name);
    REQUIRE(at != std::string::npos);
    CHECK(std::stod(metrics.substr(at + name.size())) > 0);
    CHECK(metrics.find("tandem_kv_transfer_bytes_total") != std::string::npos);
    CHECK(metrics.find("tandem_decode_step_seconds_bucket") != std::string::npos);
    // One handoff wait per request, layer-wise or not.
    CHECK(metrics.find("tandem_kv_handoff_wait_seconds_count{role=\"decode\",model=\"model\"} " +
                       std::to_string(lengths.size())) != std::string::npos);
  }
  // SIGTERM mid-stream: decode drains (the request completes), then exits 0.
  Submit last = Greedy("drained", Prompt(10, 5), 60, decode_address);
  last.sampling.ignore_eos = true;
  router.Send(p, last);
  REQUIRE(inbox.WaitFor(10s, [&] { return inbox.tokens["drained"].size() >= 2; }));
  CHECK(decode.Terminate(10s) == 0);
  {
    std::lock_guard<std::mutex> lock(inbox.mutex);
    REQUIRE(inbox.finishes["drained"].size() == 1);
    CHECK(inbox.finishes["drained"][0].finish_reason == "length");
    CHECK(inbox.tokens["drained"].size() == 60);
  }
  CHECK(prefill.Terminate(10s) == 0);
}

}  // namespace
}  // namespace tandem
