#include <catch2/catch.hpp>

#include <random>

#include "common/engine/latency_model.h"
#include "test_util.h"

using namespace tandem;

namespace {

LatencyModel Known() {
  LatencyModel m;
  m.model = "medium";
  m.threads = 2;
  m.c1 = 0.004;
  m.c2 = 0.0036;
  m.c3 = 1.0e-7;
  m.c4 = 0.030;
  m.c5 = 0.0011;
  m.c6 = 2.0e-7;
  m.kv_bytes_per_token = 24576;
  m.max_batch_size = 64;
  m.fit = FitQuality{0.998, 0.995, 0.06, 0.051};
  return m;
}

}  // namespace

TEST_CASE("latency model: fits recover known coefficients from noisy samples", "[latency_model]") {
  const LatencyModel truth = Known();
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0.0, 0.0005);  // 0.5 ms of timer/scheduler jitter
  std::vector<PrefillSample> prefill;
  for (int b : {1, 2, 4, 8})
    for (int l : {16, 64, 128, 256, 512, 1024, 1536}) {
      if (b * l > 2048) continue;
      double sum = b * l, sum_sq = static_cast<double>(b) * l * l;
      prefill.push_back({sum, sum_sq, truth.PrefillSeconds(sum, sum_sq) + noise(rng)});
    }
  std::vector<DecodeSample> decode;
  for (int b : {1, 2, 4, 8, 16, 32, 64})
    for (int ctx : {16, 256, 768, 1536}) {
      double sum_ctx = static_cast<double>(b) * ctx;
      decode.push_back({double(b), sum_ctx, truth.DecodeStepSeconds(b, sum_ctx) + noise(rng)});
    }
  LatencyModel fit;
  REQUIRE(FitPrefill(prefill, &fit).ok());
  REQUIRE(FitDecode(decode, &fit).ok());
  CHECK(fit.c1 == Approx(truth.c1).epsilon(0.05));
  CHECK(fit.c2 == Approx(truth.c2).epsilon(0.03));
  CHECK(fit.c3 == Approx(truth.c3).epsilon(0.05));
  CHECK(fit.c4 == Approx(truth.c4).epsilon(0.03));
  CHECK(fit.c5 == Approx(truth.c5).epsilon(0.05));
  CHECK(fit.c6 == Approx(truth.c6).epsilon(0.05));
  CHECK(fit.fit.prefill_r2 > 0.99);
  CHECK(fit.fit.decode_r2 > 0.99);
  CHECK(fit.fit.prefill_max_rel_error < 0.1);
  CHECK(fit.fit.decode_max_rel_error < 0.1);
}

TEST_CASE("latency model: the decode fit minimises relative error, so batch 1 is fitted as "
          "well as batch 64",
          "[latency_model]") {
  // A CPU-like line (21 ms + 3.5 ms / sequence + 4 us / context token) whose batch-64 steps
  // come out 20% below it. An ordinary fit lets those long steps tilt the line and overshoots
  // batch 1 by ~37% (max error 37%); the relative fit keeps batch 1-2 within ~4% (max 15%).
  LatencyModel truth;
  truth.c4 = 0.021;
  truth.c5 = 0.0035;
  truth.c6 = 4e-6;
  std::vector<DecodeSample> decode;
  for (int b : {1, 2, 4, 8, 16, 32, 64})
    for (int ctx : {16, 256, 768, 1536}) {
      double sum_ctx = static_cast<double>(b) * ctx;
      double t = truth.DecodeStepSeconds(b, sum_ctx) * (b == 64 ? 0.8 : 1.0);
      decode.push_back({double(b), sum_ctx, t});
    }
  LatencyModel fit;
  REQUIRE(FitDecode(decode, &fit).ok());
  for (int b : {1, 2})
    for (int ctx : {16, 1536}) {
      double sum_ctx = static_cast<double>(b) * ctx;
      CHECK(fit.DecodeStepSeconds(b, sum_ctx) ==
            Approx(truth.DecodeStepSeconds(b, sum_ctx)).epsilon(0.06));
    }
  CHECK(fit.fit.decode_max_rel_error < 0.2);
}

TEST_CASE("latency model: R^2 and max relative error are computed from the residuals",
          "[latency_model]") {
  // Exact data: R^2 = 1, error 0.
  std::vector<DecodeSample> exact = {{1, 0, 1.0}, {2, 0, 2.0}, {3, 10, 3.0}, {4, 10, 4.0}};
  LatencyModel m;
  REQUIRE(FitDecode(exact, &m).ok());
  CHECK(m.fit.decode_r2 == Approx(1.0));
  CHECK(m.fit.decode_max_rel_error == Approx(0.0).margin(1e-9));
  CHECK(m.c5 == Approx(1.0));
  // Three parameters, four points that no plane fits: check R^2 against its definition.
  std::vector<PrefillSample> samples = {{1, 1, 1.0}, {2, 4, 2.5}, {3, 9, 2.5}, {4, 16, 4.5}};
  REQUIRE(FitPrefill(samples, &m).ok());
  double mean = (1.0 + 2.5 + 2.5 + 4.5) / 4, ss_res = 0, ss_tot = 0, max_rel = 0;
  for (const PrefillSample& s : samples) {
    double p = m.PrefillSeconds(s.sum_tokens, s.sum_tokens_squared);
    ss_res += (p - s.seconds) * (p - s.seconds);
    ss_tot += (s.seconds - mean) * (s.seconds - mean);
    max_rel = std::max(max_rel, std::abs(p - s.seconds) / s.seconds);
  }
  CHECK(ss_res > 0);
  CHECK(m.fit.prefill_r2 == Approx(1 - ss_res / ss_tot));
  CHECK(m.fit.prefill_max_rel_error == Approx(max_rel));
}

TEST_CASE("latency model: fits refuse too few or degenerate samples", "[latency_model]") {
  LatencyModel m;
  std::vector<PrefillSample> two = {{1, 1, 1}, {2, 4, 2}};
  CHECK(FitPrefill(two, &m).code() == StatusCode::kInvalidArgument);
  // Every sample the same batch: c4 and c5 cannot be told apart.
  std::vector<DecodeSample> same = {{4, 10, 1}, {4, 20, 2}, {4, 30, 3}};
  CHECK(FitDecode(same, &m).code() == StatusCode::kInvalidArgument);
  std::vector<DecodeSample> zero = {{1, 1, 0}, {2, 4, 2}, {3, 9, 3}};
  CHECK(FitDecode(zero, &m).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("latency model: YAML round trip is exact", "[latency_model]") {
  LatencyModelFile file;
  file.entries.push_back(Known());
  LatencyModel gpu = Known();
  gpu.model = "/models/Llama 3 \"8B\"";
  gpu.device = "h100";
  gpu.threads = 1;
  gpu.tensor_parallel = 4;
  gpu.pipeline_parallel = 2;
  gpu.c3 = -1.2345678901234567e-11;  // a fit may go negative
  gpu.c6 = 1.0 / 3.0;
  gpu.max_batch_size = 0;
  file.entries.push_back(gpu);
  file.transfer.latency_s = 0.0005;
  file.transfer.bytes_per_s = 2.0e9 / 3.0;
  std::string text = LatencyModelToYaml(file, "written by a test\nsecond line");
  CHECK(text.rfind("# written by a test\n# second line\n", 0) == 0);
  auto back = ParseLatencyModel(text, "lm.yaml");
  REQUIRE(back.ok());
  REQUIRE(back->entries.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const LatencyModel& a = file.entries[i];
    const LatencyModel& b = back->entries[i];
    CHECK(a.model == b.model);
    CHECK(a.device == b.device);
    CHECK(a.threads == b.threads);
    CHECK(a.tensor_parallel == b.tensor_parallel);
    CHECK(a.pipeline_parallel == b.pipeline_parallel);
    CHECK(a.c1 == b.c1);
    CHECK(a.c2 == b.c2);
    CHECK(a.c3 == b.c3);
    CHECK(a.c4 == b.c4);
    CHECK(a.c5 == b.c5);
    CHECK(a.c6 == b.c6);
    CHECK(a.kv_bytes_per_token == b.kv_bytes_per_token);
    CHECK(a.max_batch_size == b.max_batch_size);
    CHECK(a.fit.prefill_r2 == b.fit.prefill_r2);
    CHECK(a.fit.decode_max_rel_error == b.fit.decode_max_rel_error);
  }
  CHECK(back->transfer.latency_s == file.transfer.latency_s);
  CHECK(back->transfer.bytes_per_s == file.transfer.bytes_per_s);
  CHECK(LatencyModelToYaml(*back, "written by a test\nsecond line") == text);
  CHECK(back->Find("h100", 1, 4, 2) == &back->entries[1]);
  CHECK(back->Find("", 2) == &back->entries[0]);
  CHECK(back->Find("cpu", 3) == nullptr);
  // An instance configured as device cuda uses the GPU's entry whatever its name; a CPU
  // instance needs its thread count.
  CHECK(back->ForInstance("cuda", 8, 4, 2) == &back->entries[1]);
  CHECK(back->ForInstance("cuda", 1, 4, 1) == nullptr);
  CHECK(back->ForInstance("cpu", 2, 1, 1) == &back->entries[0]);
  CHECK(back->ForInstance("cpu", 3, 1, 1) == nullptr);

  test::TempDir dir;
  auto loaded = LoadLatencyModel(dir.Write("lm.yaml", text));
  REQUIRE(loaded.ok());
  CHECK(loaded->entries[1].c6 == gpu.c6);
  CHECK(LoadLatencyModel((dir.path() / "missing.yaml").string()).status().code() ==
        StatusCode::kNotFound);
}

TEST_CASE("latency model: an entry for a role wins over the shape's entry without one",
          "[latency_model]") {
  const std::string text =
      "latency_model:\n"
      "  - {model: medium, threads: 1, prefill: {c1: 1, c2: 0, c3: 0},\n"
      "     decode: {c4: 0.02, c5: 0, c6: 0}}\n"
      "  - {model: medium, threads: 1, role: colocated, prefill: {c1: 1, c2: 0, c3: 0},\n"
      "     decode: {c4: 0.03, c5: 0, c6: 0}}\n";
  auto file = ParseLatencyModel(text, "lm.yaml");
  REQUIRE(file.ok());
  CHECK(file->ForInstance("cpu", 1, 1, 1, "colocated")->c4 == 0.03);
  CHECK(file->ForInstance("cpu", 1, 1, 1, "decode")->c4 == 0.02);
  CHECK(file->ForInstance("cpu", 1, 1, 1)->c4 == 0.02);
  // Written back with its role.
  auto back = ParseLatencyModel(LatencyModelToYaml(*file), "lm.yaml");
  REQUIRE(back.ok());
  CHECK(back->entries[1].role == "colocated");
  CHECK(back->entries[0].role.empty());
  // A role entry alone serves only that role.
  auto only = ParseLatencyModel(
      "latency_model:\n"
      "  - {model: medium, threads: 1, role: decode, prefill: {c1: 1, c2: 0, c3: 0},\n"
      "     decode: {c4: 0.03, c5: 0, c6: 0}}\n",
      "lm.yaml");
  REQUIRE(only.ok());
  CHECK(only->ForInstance("cpu", 1, 1, 1, "decode") != nullptr);
  CHECK(only->ForInstance("cpu", 1, 1, 1, "prefill") == nullptr);
  // Two entries for one shape and role, and unknown roles, are errors.
  auto twice = ParseLatencyModel(text + "  - {model: medium, threads: 1, role: colocated, "
                                        "prefill: {c1: 1, c2: 0, c3: 0}, decode: {c4: 0.03, c5: 0, "
                                        "c6: 0}}\n",
                                 "lm.yaml");
  REQUIRE_FALSE(twice.ok());
  CHECK(twice.status().message().find("a second entry for device cpu, threads 1, "
                                      "tensor_parallel 1, pipeline_parallel 1, role colocated") !=
        std::string::npos);
  auto bad = ParseLatencyModel(
      "latency_model:\n"
      "  - {model: medium, threads: 1, role: router, prefill: {c1: 1, c2: 0, c3: 0},\n"
      "     decode: {c4: 0.03, c5: 0, c6: 0}}\n",
      "lm.yaml");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("latency_model[0].role: must be prefill|decode|colocated") !=
        std::string::npos);
}

TEST_CASE("latency model: bad files name the line and the field", "[latency_model]") {
  const std::string good_entry =
      "latency_model:\n"
      "  - model: medium\n"
      "    threads: 1\n"
      "    prefill: {c1: 0.004, c2: 0.0036, c3: 1.0e-7}\n"
      "    decode: {c4: 0.03, c5: 0.0011, c6: 2.0e-7}\n";
  REQUIRE(ParseLatencyModel(good_entry, "lm.yaml").ok());

  auto unknown = ParseLatencyModel(good_entry + "    colour: blue\n", "lm.yaml");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.status().message() == "lm.yaml:6:5: latency_model[0].colour: unknown key");

  auto wrong_type = ParseLatencyModel(
      "latency_model:\n"
      "  - model: medium\n"
      "    prefill: {c1: 0.004, c2: fast, c3: 1.0e-7}\n"
      "    decode: {c4: 0.03, c5: 0.0011, c6: 2.0e-7}\n"
      "    threads: [1]\n",
      "lm.yaml");
  REQUIRE_FALSE(wrong_type.ok());
  const std::string& m = wrong_type.status().message();
  CHECK(m.find("lm.yaml:3:30: latency_model[0].prefill.c2: must be a number, got 'fast'") !=
        std::string::npos);
  CHECK(m.find("lm.yaml:5:14: latency_model[0].threads: must be an integer") != std::string::npos);

  auto missing = ParseLatencyModel(
      "latency_model:\n  - model: medium\n    decode: {c4: 0.03, c5: 0.0011}\n", "lm.yaml");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("latency_model[0].prefill: is required") !=
        std::string::npos);
  CHECK(missing.status().message().find("lm.yaml:3:13: latency_model[0].decode.c6: is required") !=
        std::string::npos);

  auto top = ParseLatencyModel(good_entry + "transfer: {latency_s: -1}\nextra: 1\n", "lm.yaml");
  REQUIRE_FALSE(top.ok());
  CHECK(top.status().message().find("transfer.latency_s: must be a number >= 0, got '-1'") !=
        std::string::npos);
  CHECK(top.status().message().find("lm.yaml:7:1: extra: unknown key") != std::string::npos);

  auto duplicate = ParseLatencyModel(good_entry + good_entry.substr(good_entry.find("  -")),
                                     "lm.yaml");
  REQUIRE_FALSE(duplicate.ok());
  CHECK(duplicate.status().message().find("latency_model[1]: a second entry") != std::string::npos);

  auto syntax = ParseLatencyModel("latency_model: [\n", "lm.yaml");
  REQUIRE_FALSE(syntax.ok());
  CHECK(syntax.status().message().find("lm.yaml:") == 0);
  CHECK(ParseLatencyModel("", "lm.yaml").status().message().find("latency_model") !=
        std::string::npos);
}

TEST_CASE("latency model: the committed CPU profile of the medium model loads and fits",
          "[latency_model]") {
  auto file = LoadLatencyModel(std::string(TANDEM_SOURCE_DIR) + "/perf/latency/cpu-medium.yaml");
  REQUIRE(file.ok());
  for (int threads : {1, 2}) {
    const LatencyModel* m = file->Find("cpu", threads);
    REQUIRE(m != nullptr);
    CHECK(m->model == "medium");
    CHECK(m->fit.prefill_r2 > 0.95);
    CHECK(m->fit.decode_r2 > 0.95);
    CHECK(m->kv_bytes_per_token == 24576);
  }
}
