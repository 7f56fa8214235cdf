#include <catch2/catch.hpp>

#include "common/config/config.h"
#include "common/engine/kv_cache.h"
#include "test_util.h"

using namespace tandem;

namespace {

// Parses text and returns the error message ("" when it loads).
std::string ErrorOf(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  StatusOr<ClusterConfig> config = ParseConfig(yaml, "cluster.yaml", overrides);
  return config.ok() ? "" : config.status().message();
}

}  // namespace

TEST_CASE("config: an empty file gives the documented defaults", "[config]") {
  StatusOr<ClusterConfig> config = ParseConfig("", "cluster.yaml");
  REQUIRE(config.ok());
  CHECK(config->router.port == 8000);
  CHECK(config->router.policy == "goodput");
  CHECK(config->kv_cache.block_size == 16);
  CHECK(config->transfer.timeout_s == 5.0);
  CHECK(config->transfer.layerwise);
  CHECK(config->kv_cache.prefix_caching);
  CHECK(config->router.api_keys_file.empty());  // no keys: the API is open
  CHECK_FALSE(config->router.metrics_require_api_key);
  CHECK(config->colocated.instances == 0);
  CHECK(config->prefill.instances == 1);
}

TEST_CASE("config: a valid file loads every section", "[config]") {
  test::TempDir dir;
  std::string path = dir.Write("cluster.yaml", R"(
model:
  preset: tiny
  name: tiny-llama
  chat_template: llama3
router:
  port: 9000
  policy: least_loaded
  tokenize_threads: 3
  api_keys_file: keys.txt
  metrics_require_api_key: true
prefill:
  instances: 2
  token_budget: 4096
decode:
  instances: 3
  max_batch_size: 32
  kv_usage_watermark: 0.9
slo:
  ttft_s: 0.5
  tpot_s: 0.05
  classes:
    - name: interactive
      ttft_s: 0.2
    - name: batch
      ttft_s: 10
      tpot_s: 1
kv_cache:
  block_size: 32
  prefix_caching: false
transfer:
  backend: inproc
  timeout_s: 2.5
  layerwise: false
colocated:
  scheduling: prefill_first
logging:
  format: json
)");
  StatusOr<ClusterConfig> config = LoadConfig(path);
  REQUIRE(config.ok());
  CHECK(config->model.preset == "tiny");
  CHECK(config->router.port == 9000);
  CHECK(config->router.tokenize_threads == 3);
  CHECK(config->router.api_keys_file == "keys.txt");
  CHECK(config->router.metrics_require_api_key);
  CHECK(config->prefill.instances == 2);
  CHECK(config->prefill.token_budget == 4096);
  CHECK(config->decode.instances == 3);
  CHECK(config->decode.kv_usage_watermark == Approx(0.9));
  REQUIRE(config->slo.classes.size() == 2);
  CHECK(config->slo.classes[0].name == "interactive");
  CHECK(config->slo.classes[0].ttft_s == Approx(0.2));
  CHECK(config->slo.classes[0].tpot_s == Approx(0.05));  // inherited from slo.tpot_s
  CHECK(config->slo.classes[1].tpot_s == Approx(1.0));
  CHECK(config->kv_cache.block_size == 32);
  CHECK_FALSE(config->kv_cache.prefix_caching);
  CHECK(config->transfer.backend == "inproc");
  CHECK_FALSE(config->transfer.layerwise);  // the default is true
  CHECK(config->colocated.scheduling == "prefill_first");
  CHECK(config->prefill.scheduling == "chunked");
  CHECK(config->logging.format == "json");
}

TEST_CASE("config: the effective YAML round-trips", "[config]") {
  StatusOr<ClusterConfig> config = ParseConfig(
      "decode: {max_batch_size: 7}\n"
      "router: {api_keys_file: /etc/tandem/keys, metrics_require_api_key: true}\n",
      "a.yaml");
  REQUIRE(config.ok());
  StatusOr<ClusterConfig> again = ParseConfig(ConfigToYaml(*config), "b.yaml");
  REQUIRE(again.ok());
  CHECK(again->decode.max_batch_size == 7);
  CHECK(again->router.api_keys_file == "/etc/tandem/keys");
  CHECK(again->router.metrics_require_api_key);
  CHECK(ConfigToYaml(*again) == ConfigToYaml(*config));
}

TEST_CASE("config: each kind of invalid file names file, line and field", "[config]") {
  SECTION("unknown key") {
    CHECK(ErrorOf("router:\n  port: 1\n  prot: 2\n") == "cluster.yaml:3:3: router.prot: unknown key");
  }
  SECTION("unknown section") {
    CHECK(ErrorOf("routr:\n  port: 1\n") == "cluster.yaml:1:1: routr: unknown key");
  }
  SECTION("wrong type") {
    CHECK(ErrorOf("decode:\n  max_batch_size: lots\n") ==
          "cluster.yaml:2:19: decode.max_batch_size: must be an integer in [1, 4096], got 'lots'");
  }
  SECTION("out of range") {
    CHECK(ErrorOf("router:\n  port: 70000\n") ==
          "cluster.yaml:2:9: router.port: must be an integer in [0, 65535], got '70000'");
  }
  SECTION("a float where an integer is needed") {
    CHECK(ErrorOf("prefill:\n  threads: 1.5\n").find("prefill.threads: must be an integer") !=
          std::string::npos);
  }
  SECTION("bad enum") {
    CHECK(ErrorOf("router:\n  policy: fastest\n") ==
          "cluster.yaml:2:11: router.policy: must be one of goodput|least_loaded|round_robin, "
          "got 'fastest'");
  }
  SECTION("a boolean must be true or false") {
    CHECK(ErrorOf("transfer:\n  layerwise: yes\n") ==
          "cluster.yaml:2:14: transfer.layerwise: must be true or false, got 'yes'");
  }
  SECTION("section is not a mapping") {
    CHECK(ErrorOf("slo: 3\n") == "cluster.yaml:1:6: slo: must be a mapping, got '3'");
  }
  SECTION("list expected") {
    CHECK(ErrorOf("slo:\n  classes: {a: 1}\n") ==
          "cluster.yaml:2:12: slo.classes: must be a list, got a mapping");
  }
  SECTION("class without a name, and a duplicate") {
    std::string error = ErrorOf("slo:\n  classes:\n    - ttft_s: 1\n    - name: a\n    - name: a\n");
    CHECK(error.find("cluster.yaml:3:7: slo.classes[0].name: is required") != std::string::npos);
    CHECK(error.find("slo.classes[2].name: duplicate class 'a'") != std::string::npos);
  }
  SECTION("block size must be a power of two") {
    CHECK(ErrorOf("kv_cache:\n  block_size: 12\n") ==
          "cluster.yaml:2:15: kv_cache.block_size: must be a power of two");
  }
  SECTION("bfloat16 KV needs every instance on cuda") {
    CHECK(ErrorOf("kv_cache:\n  dtype: bfloat16\n") ==
          "cluster.yaml:2:10: kv_cache.dtype: bfloat16 needs every instance on device cuda, and "
          "prefill.device is cpu (the CPU backend keeps KV in float32): set float32 or auto");
    CHECK(ErrorOf("kv_cache:\n  dtype: fp8\n") ==
          "cluster.yaml:2:10: kv_cache.dtype: must be one of auto|float32|bfloat16, got 'fp8'");
  }
  SECTION("number where a string is expected") {
    CHECK(ErrorOf("transfer:\n  ucx_tls: [tcp]\n") ==
          "cluster.yaml:2:12: transfer.ucx_tls: must be a string, got a list");
  }
  SECTION("broken YAML") {
    CHECK(ErrorOf("router:\n  port: [1, 2\n").rfind("cluster.yaml:", 0) == 0);
    CHECK(ErrorOf("router:\n  port: [1, 2\n").find("invalid YAML") != std::string::npos);
  }
  SECTION("all errors are reported, one per line") {
    std::string error = ErrorOf("router:\n  port: x\ndecode:\n  threads: 0\n");
    CHECK(error.find("router.port") != std::string::npos);
    CHECK(error.find("\ncluster.yaml:4:12: decode.threads") != std::string::npos);
  }
}

TEST_CASE("config: missing file is NotFound", "[config]") {
  StatusOr<ClusterConfig> config = LoadConfig("/nonexistent/cluster.yaml");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().code() == StatusCode::kNotFound);
  CHECK(config.status().message().find("/nonexistent/cluster.yaml") != std::string::npos);
}

TEST_CASE("config: overrides win over the file and are validated", "[config]") {
  StatusOr<ClusterConfig> config =
      ParseConfig("decode:\n  max_batch_size: 8\n", "c.yaml",
                  {"decode.max_batch_size=32", "router.port=9100", "slo.ttft_s=0.25"});
  REQUIRE(config.ok());
  CHECK(config->decode.max_batch_size == 32);
  CHECK(config->router.port == 9100);
  CHECK(config->slo.ttft_s == Approx(0.25));

  CHECK(ErrorOf("", {"decode.max_batch_size=zero"}) ==
        "flag --decode.max_batch_size: decode.max_batch_size: must be an integer in [1, 4096], "
        "got 'zero'");
  CHECK(ErrorOf("", {"decode.max_btch=3"}) == "flag --decode.max_btch: decode.max_btch: unknown key");
  CHECK(ErrorOf("", {"novalue"}).find("is not KEY=VALUE") != std::string::npos);
  CHECK(ErrorOf("router: {port: 1}\n", {"router.port.x=3"}).find("'port' is not a section") !=
        std::string::npos);
  // A top level that is not a mapping is refused with its line, overrides or not (it threw).
  for (const char* top : {"just a scalar\n", "- a\n- b\n"}) {
    CHECK(ErrorOf(top, {"router.port=1"}) == ErrorOf(top));
    CHECK(ErrorOf(top, {"router.port=1"}).find("<top level>: must be a mapping") !=
          std::string::npos);
  }
}

TEST_CASE("config: kv_cache.dtype resolves to one KV dtype for the whole cluster", "[config]") {
  auto resolved = [](const std::string& yaml) {
    StatusOr<ClusterConfig> config = ParseConfig(yaml, "cluster.yaml");
    REQUIRE(config.ok());
    return ResolvedKvDType(*config);
  };
  const std::string gpus = "prefill: {device: cuda}\ndecode: {device: cuda}\n";
  // auto: bfloat16 only where no instance computes on the CPU.
  CHECK(resolved("") == KvDType::kFloat32);
  CHECK(resolved(gpus) == KvDType::kBFloat16);
  CHECK(resolved("prefill: {device: cpu}\ndecode: {device: cuda}\n") == KvDType::kFloat32);
  CHECK(resolved("prefill: {device: cpu, instances: 0}\ndecode: {device: cuda}\n") ==
        KvDType::kBFloat16);
  // Set: as set (bfloat16 with a CPU instance is refused, above).
  CHECK(resolved("kv_cache: {dtype: float32}\n" + gpus) == KvDType::kFloat32);
  CHECK(resolved("kv_cache: {dtype: bfloat16}\n" + gpus) == KvDType::kBFloat16);
  // The effective YAML keeps it.
  StatusOr<ClusterConfig> config = ParseConfig("kv_cache: {dtype: bfloat16}\n" + gpus, "a.yaml");
  REQUIRE(config.ok());
  StatusOr<ClusterConfig> again = ParseConfig(ConfigToYaml(*config), "b.yaml");
  REQUIRE(again.ok());
  CHECK(again->kv_cache.dtype == "bfloat16");
}
