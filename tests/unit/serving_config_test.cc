// What the config refuses: values no server here can run (for serving only: simulate and plan
// read GPU layouts), duplicate keys, unknown UCX transports, and KV pools that cannot hold one
// request or do not fit the machine.
#include <catch2/catch.hpp>

#include "common/config/config.h"
#include "common/config/serving_config.h"
#include "common/engine/kv_cache.h"
#include "test_util.h"

using namespace tandem;

namespace {

std::string LoadError(const std::string& yaml) {
  StatusOr<ClusterConfig> config = ParseConfig(yaml, "cluster.yaml");
  return config.ok() ? "" : config.status().message();
}

// "" when the text loads and may be served; else the message of the step that refused it.
std::string ServingError(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  StatusOr<ClusterConfig> config = ParseConfig(yaml, "cluster.yaml", overrides);
  if (!config.ok()) return "load: " + config.status().message();
  Status s = ValidateForServing(*config);
  return s.ok() ? "" : s.message();
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

constexpr uint64_t kGiB = uint64_t{1} << 30;

}  // namespace

TEST_CASE("serving config: GPU layouts load for simulation and are refused for serving",
          "[config]") {
  const std::string gpu =
      "prefill:\n  device: cuda\n  tensor_parallel: 2\n"
      "decode:\n  pipeline_parallel: 4\n  preemption: swap\n";
  CHECK(LoadError(gpu).empty());  // tandem simulate / plan
  const std::string error = ServingError(gpu);
  CHECK(Has(error, BuiltWithCuda() ? "cluster.yaml:2:11: prefill.device: cuda on prefill instances "
                                      "keeps the KV in GPU memory, and the UCX at hand moves host "
                                      "memory only over transfer.ucx_tls 'tcp,sm,self'"
                                    : "cluster.yaml:2:11: prefill.device: cuda cannot be served by "
                                      "this build: it has no CUDA backend"));
  CHECK_FALSE(Has(error, "prefill.tensor_parallel"));  // cuda instances split over GPUs
  CHECK(Has(ServingError("decode:\n  tensor_parallel: 2\n"),
            "cluster.yaml:2:20: decode.tensor_parallel: 2 cannot be served on cpu: a CPU "
            "instance is one process (use decode.threads)"));
  // Colocated cuda instances split the model over their GPUs.
  const std::string colocated_tp =
      ServingError("prefill: {instances: 0}\ndecode: {instances: 0}\n"
                   "colocated: {instances: 1, device: cuda, tensor_parallel: 2}\n");
  CHECK_FALSE(Has(colocated_tp, "tensor_parallel"));
  if (BuiltWithCuda()) CHECK(colocated_tp.empty());
  // Each instance's GPUs: whole groups of distinct entries.
  CHECK(Has(ServingError("colocated: {instances: 1, device: cuda, tensor_parallel: 2, "
                         "cuda_devices: [0, 1, 2]}\n"),
            "colocated.cuda_devices: 3 entries are not whole groups of tensor_parallel 2 GPUs"));
  CHECK(Has(ServingError("colocated: {instances: 1, device: cuda, tensor_parallel: 2, "
                         "cuda_devices: [0, 0]}\n"),
            "colocated.cuda_devices: '0' twice among one instance's 2 GPUs"));
  // Prefill and decode at different degrees: cuda_ipc re-shards the KV between them.
  const std::string disaggregated_tp =
      ServingError("transfer: {backend: cuda_ipc}\n"
                   "prefill: {device: cuda, tensor_parallel: 2}\n"
                   "decode: {device: cuda, tensor_parallel: 4}\n");
  CHECK_FALSE(Has(disaggregated_tp, "tensor_parallel"));
  if (BuiltWithCuda()) CHECK(disaggregated_tp.empty());
  CHECK(Has(error, "cluster.yaml:5:22: decode.pipeline_parallel: 4 cannot be served"));
  CHECK(Has(error, "cluster.yaml:6:15: decode.preemption: swap is not implemented"));
  // A flag is named as the flag.
  CHECK(Has(ServingError("", {"decode.device=cuda"}), "flag --decode.device: decode.device"));
  // Colocated instances serve on cuda where the build has the backend.
  const std::string colocated_cuda =
      ServingError("prefill: {instances: 0}\ndecode: {instances: 0}\n"
                   "colocated: {instances: 1, device: cuda}\n");
  if (BuiltWithCuda()) {
    CHECK(colocated_cuda.empty());
  } else {
    CHECK(Has(colocated_cuda, "colocated.device: cuda cannot be served by this build"));
  }
  CHECK(ServingError("").empty());
  CHECK(ServingError("colocated: {instances: 1, scheduling: prefill_first}\n").empty());
  CHECK(Has(ServingError("decode: {scheduling: prefill_first}\n"),
            "cluster.yaml:1:22: decode.scheduling: 'prefill_first' has no effect on decode"));
}

TEST_CASE("serving config: the KV transports this build cannot serve are refused", "[config]") {
  // GPU pools on any machines: nccl, prefill and decode on cuda, one pool each.
  const std::string nccl_cpu = ServingError("transfer:\n  backend: nccl\n");
  const std::string nccl_gpus =
      ServingError("transfer: {backend: nccl}\nprefill: {device: cuda}\ndecode: {device: cuda}\n");
  const std::string nccl_tp = ServingError(
      "transfer: {backend: nccl}\nprefill: {device: cuda}\n"
      "decode: {device: cuda, tensor_parallel: 2}\n");
  if (BuiltWithCuda()) {
    CHECK(Has(nccl_cpu, "cluster.yaml:2:12: transfer.backend: nccl moves KV between GPU pools, "
                        "and prefill.device is cpu"));
    CHECK(nccl_gpus.empty());
    CHECK(nccl_tp.empty());  // NCCL re-shards between the degrees, as cuda_ipc does
  } else {
    CHECK(Has(nccl_cpu, "cluster.yaml:2:12: transfer.backend: nccl needs a build with CUDA"));
    CHECK(Has(nccl_gpus, "decode.device: cuda cannot be served by this build"));
  }
  // GPU pools on one machine: cuda_ipc, with prefill and decode both on cuda.
  const std::string gpu_pools =
      ServingError("transfer: {backend: cuda_ipc}\nprefill: {device: cuda}\ndecode: {device: cuda}\n");
  const std::string half =
      ServingError("transfer:\n  backend: cuda_ipc\nprefill: {device: cuda}\n");
  if (BuiltWithCuda()) {
    CHECK(gpu_pools.empty());
    CHECK(Has(half, "cluster.yaml:2:12: transfer.backend: cuda_ipc moves KV between GPU pools, "
                    "and decode.device is cpu: set it to cuda, or use ucx"));
  } else {
    CHECK(Has(gpu_pools, "transfer.backend: cuda_ipc needs a build with CUDA"));
    CHECK(Has(gpu_pools, "prefill.device: cuda cannot be served by this build"));
  }
  CHECK(Has(ServingError("prefill: {device: cuda}\ndecode: {device: cuda}\n"),
            BuiltWithCuda() ? "prefill.device: cuda on prefill instances keeps the KV in GPU "
                              "memory, and the UCX at hand moves host memory only over "
                              "transfer.ucx_tls 'tcp,sm,self' (a UCX built with CUDA would move "
                              "it): set transfer.backend: cuda_ipc (prefill and decode on one "
                              "machine) or nccl (on any machines)"
                            : "prefill.device: cuda cannot be served by this build"));
  CHECK(Has(ServingError("transfer: {backend: inproc}\n"), "transfer.backend: inproc moves KV"));
  // Colocated instances move no KV: any backend will do.
  CHECK(ServingError("transfer: {backend: inproc}\nprefill: {instances: 0}\n"
                     "decode: {instances: 0}\ncolocated: {instances: 1}\n")
            .empty());
}

// The probe the commands install (kvtransfer's ProbeUcx); here a double that says what it was
// asked.
namespace {
std::vector<std::string> probed_tls;
bool ucx_moves_cuda = false;
bool FakeUcxProbe(const std::string& tls) {
  probed_tls.push_back(tls);
  return ucx_moves_cuda;
}
}  // namespace

TEST_CASE("serving config: cuda instances over ucx where the UCX at hand moves GPU memory",
          "[config]") {
  SetUcxCudaProbe(&FakeUcxProbe);
  probed_tls.clear();
  const std::string over_ucx =
      "transfer: {backend: ucx, ucx_tls: 'cuda_copy,rc'}\n"
      "prefill: {device: cuda}\ndecode: {device: cuda}\n";
  ucx_moves_cuda = true;
  const std::string accepted = ServingError(over_ucx);
  const std::string tp = ServingError("transfer: {backend: ucx, ucx_tls: 'cuda_copy,rc'}\n"
                                      "prefill: {device: cuda}\n"
                                      "decode: {device: cuda, tensor_parallel: 2}\n");
  ucx_moves_cuda = false;
  const std::string refused = ServingError(over_ucx);
  SetUcxCudaProbe(nullptr);
  if (BuiltWithCuda()) {
    CHECK(accepted.empty());
    CHECK(Has(tp, "decode.tensor_parallel: 2 keeps a KV pool per GPU, and transfer.backend ucx "
                  "moves one pool an instance: use cuda_ipc or nccl"));
    CHECK(Has(refused, "cluster.yaml:2:19: prefill.device: cuda on prefill instances keeps the KV "
                       "in GPU memory, and the UCX at hand moves host memory only over "
                       "transfer.ucx_tls 'cuda_copy,rc'"));
    REQUIRE_FALSE(probed_tls.empty());
    CHECK(probed_tls[0] == "cuda_copy,rc");  // asked about the configured transports
  } else {
    // The build refuses cuda before any UCX is asked.
    CHECK(Has(accepted, "prefill.device: cuda cannot be served by this build"));
    CHECK(probed_tls.empty());
  }
}

TEST_CASE("serving config: cuda_ipc needs a KV hold of twice the pull margin", "[config]") {
  const std::string ipc = "transfer:\n  backend: cuda_ipc\n  timeout_s: 8\n"
                          "prefill: {device: cuda, kv_hold_timeout_s: 12}\n"
                          "decode: {device: cuda}\n";
  const std::string short_hold = ServingError(ipc);
  CHECK(Has(short_hold, "cluster.yaml:4:44: prefill.kv_hold_timeout_s: 12 s is too short for "
                        "transfer.backend cuda_ipc"));
  CHECK(Has(short_hold, "it stops starting a pull 8 s (transfer.timeout_s, at least 1 s) before"));
  CHECK(Has(short_hold, "raise it to 16 or more, or lower transfer.timeout_s"));
  CHECK_FALSE(Has(ServingError(ipc, {"prefill.kv_hold_timeout_s=16"}), "kv_hold_timeout_s"));
  // The default hold (30 s) over the default timeout (5 s); a timeout under 1 s keeps 1 s.
  CHECK_FALSE(Has(ServingError("transfer: {backend: cuda_ipc}\nprefill: {device: cuda}\n"
                               "decode: {device: cuda}\n"),
                  "kv_hold_timeout_s"));
  CHECK(Has(ServingError("transfer: {backend: cuda_ipc, timeout_s: 0.1}\n"
                         "prefill: {device: cuda, kv_hold_timeout_s: 1.5}\ndecode: {device: cuda}\n"),
            "raise it to 2 or more"));
  // The other transports are refused by the publisher or the header, whatever the hold.
  CHECK_FALSE(Has(ServingError("transfer: {timeout_s: 8}\nprefill: {kv_hold_timeout_s: 2}\n"),
                  "kv_hold_timeout_s"));
}

TEST_CASE("serving config: S.cuda_devices picks each instance's GPU, on cuda only", "[config]") {
  CHECK(Has(LoadError("decode:\n  cuda_devices: [0, 'GPU-1f2e', 'x1']\n"),
            "cluster.yaml:2:17: decode.cuda_devices: 'x1' is not a GPU"));
  CHECK(Has(ServingError("prefill:\n  cuda_devices: [1]\n"),
            "cluster.yaml:2:17: prefill.cuda_devices: has no effect on cpu instances"));
  // On cuda, threads are the host sampling's (BatchSampling).
  CHECK_FALSE(Has(ServingError("colocated:\n  device: cuda\n  threads: 4\n"), "threads"));
  InstanceSection s;
  s.device = "cuda";
  CHECK(CudaVisibleDevicesFor(s, 3).empty());  // no list: inherit the launcher's
  s.cuda_devices = {"2", "MIG-abc"};
  CHECK(CudaVisibleDevicesFor(s, 0) == "2");
  CHECK(CudaVisibleDevicesFor(s, 1) == "MIG-abc");
  CHECK(CudaVisibleDevicesFor(s, 2) == "2");  // more instances than GPUs: they share
  // tensor_parallel t: instance i takes entries i*t .. i*t+t-1, its ranks' GPUs 0..t-1.
  s.cuda_devices = {"0", "1", "2", "3"};
  s.tensor_parallel = 2;
  CHECK(CudaVisibleDevicesFor(s, 0) == "0,1");
  CHECK(CudaVisibleDevicesFor(s, 1) == "2,3");
  CHECK(CudaVisibleDevicesFor(s, 2) == "0,1");
  s.device = "cpu";
  CHECK(CudaVisibleDevicesFor(s, 0).empty());
}

TEST_CASE("serving config: LoadServingConfig refuses what ValidateForServing does", "[config]") {
  test::TempDir dir;
  const std::string path = dir.Write("c.yaml", "decode:\n  device: cuda\n");
  CHECK(LoadConfig(path).ok());
  StatusOr<ClusterConfig> served = LoadServingConfig(path);
  REQUIRE_FALSE(served.ok());
  CHECK(Has(served.status().message(), path + ":2:11: decode.device"));
  CHECK(LoadServingConfig("").ok());  // the defaults
}

TEST_CASE("config: a key given twice is an error naming both lines", "[config]") {
  CHECK(LoadError("decode:\n  threads: 2\n  max_batch_size: 8\n  threads: 4\n") ==
        "cluster.yaml:4:3: decode.threads: duplicate key (first at line 2)");
  CHECK(LoadError("router: {port: 1}\nrouter: {port: 2}\n") ==
        "cluster.yaml:2:1: router: duplicate key (first at line 1)");
  CHECK(Has(LoadError("slo:\n  classes:\n    - {name: a, ttft_s: 1, ttft_s: 2}\n"),
            "slo.classes[0].ttft_s: duplicate key"));
  // An override replaces a key: not a duplicate.
  CHECK(ParseConfig("decode: {threads: 2}\n", "c.yaml", {"decode.threads=3"}).ok());
}

TEST_CASE("config: transfer.ucx_tls names transports UCX knows", "[config]") {
  CHECK(LoadError("transfer: {ucx_tls: 'tcp,sm,self'}\n").empty());
  CHECK(LoadError("transfer: {ucx_tls: '^cuda_ipc,rc'}\n").empty());
  CHECK(LoadError("transfer: {ucx_tls: 'ud:aux,rc_x'}\n").empty());
  CHECK(LoadError("transfer: {ucx_tls: all}\n").empty());
  CHECK(Has(LoadError("transfer:\n  ucx_tls: tcp,shared_mem\n"),
            "cluster.yaml:2:12: transfer.ucx_tls: 'shared_mem' is not a UCX transport (known: "));
  CHECK(Has(LoadError("transfer: {ucx_tls: ''}\n"), "transfer.ucx_tls: "));
  CHECK(Has(LoadError("transfer: {ucx_tls: 'tcp,'}\n"), "must name at least one"));
}

TEST_CASE("config: an explicit KV pool holds one request of max_model_len", "[config]") {
  CHECK(LoadError("model: {max_model_len: 512}\ndecode: {kv_blocks: 32}\n").empty());
  CHECK(LoadError("model:\n  max_model_len: 512\ndecode:\n  kv_blocks: 31\n") ==
        "cluster.yaml:4:14: decode.kv_blocks: holds 31 blocks, fewer than one request of "
        "model.max_model_len (512 tokens = 32 blocks of 16)");
  CHECK(Has(LoadError("kv_cache: {block_size: 32}\nmodel: {max_model_len: 100}\n"
                      "colocated: {instances: 1, kv_blocks: 3}\n"),
            "colocated.kv_blocks: holds 3 blocks, fewer than one request"));
  // A section without instances runs nothing: its pool is checked when an instance makes it.
  CHECK(LoadError("model: {max_model_len: 512}\ncolocated: {kv_blocks: 3}\n").empty());
}

TEST_CASE("KvPoolBlocks: the default pool is a share of memory, capped by the batch", "[config]") {
  // 2 layers x 2 KV heads x 64 x 16 tokens x 2 x 4 bytes = 32 KiB per block.
  const KvLayout layout{2, 2, 64, 16};
  StatusOr<ClusterConfig> config = ParseConfig("model: {max_model_len: 1024}\n", "c.yaml");
  REQUIRE(config.ok());
  // 0.05 of 1 GiB = 51.2 MiB = 1638 blocks (the batch would take 64 x 64 = 4096).
  StatusOr<int> blocks = KvPoolBlocks(*config, config->decode, layout, kGiB);
  REQUIRE(blocks.ok());
  CHECK(*blocks == 1638);
  // A large machine: no more than max_batch_size requests of max_model_len use.
  blocks = KvPoolBlocks(*config, config->decode, layout, 1024 * kGiB);
  REQUIRE(blocks.ok());
  CHECK(*blocks == 64 * 64);
  // The old default (batch x max_model_len) of the medium model would take 6 GiB per instance:
  // now 5% of the machine.
  const KvLayout medium{12, 4, 64, 16};
  ClusterConfig defaults = *ParseConfig("", "c.yaml");
  blocks = KvPoolBlocks(defaults, defaults.decode, medium, 24 * kGiB);
  REQUIRE(blocks.ok());
  const double bytes = static_cast<double>(*blocks) * medium.block_bytes() * medium.num_layers;
  CHECK(bytes <= 0.05 * 24 * kGiB);
  CHECK(bytes > 0.049 * 24 * kGiB);
}

TEST_CASE("KvPoolBlocks: refuses a pool below one request or beyond the machine", "[config]") {
  const KvLayout layout{2, 2, 64, 16};  // 32 KiB per block
  StatusOr<ClusterConfig> small =
      ParseConfig("model: {max_model_len: 4096}\nkv_cache:\n  memory_fraction: 0.01\n", "c.yaml");
  REQUIRE(small.ok());
  // 1% of 512 MiB = 163 blocks < 256 for one request of 4096 tokens.
  StatusOr<int> blocks = KvPoolBlocks(*small, small->prefill, layout, kGiB / 2);
  REQUIRE_FALSE(blocks.ok());
  CHECK(Has(blocks.status().message(), "c.yaml:3:20: kv_cache.memory_fraction: the prefill KV "
                                       "pool holds 163 blocks"));
  CHECK(Has(blocks.status().message(), "fewer than one request of model.max_model_len (4096"));
  // An explicit pool larger than the machine.
  StatusOr<ClusterConfig> big = ParseConfig("decode:\n  kv_blocks: 100000\n", "c.yaml");
  REQUIRE(big.ok());
  blocks = KvPoolBlocks(*big, big->decode, layout, kGiB);
  REQUIRE_FALSE(blocks.ok());
  CHECK(Has(blocks.status().message(),
            "c.yaml:2:14: decode.kv_blocks: the decode KV pool (100000 blocks, 3.05 GiB) does not "
            "fit this machine's memory (1.00 GiB)"));
  blocks = KvPoolBlocks(*big, big->decode, layout, 8 * kGiB);
  REQUIRE(blocks.ok());
  CHECK(*blocks == 100000);
  CHECK(MachineMemoryBytes() > 0);
}

TEST_CASE("config: the snapshot round-trips the new sections", "[config]") {
  StatusOr<ClusterConfig> config = ParseConfig(
      "kv_cache: {memory_fraction: 0.125}\nlauncher: {health_interval_s: 0.5, "
      "health_failures: 5}\n",
      "a.yaml");
  REQUIRE(config.ok());
  StatusOr<ClusterConfig> again = ParseConfig(ConfigToYaml(*config), "b.yaml");
  REQUIRE(again.ok());
  CHECK(again->kv_cache.memory_fraction == 0.125);
  CHECK(again->launcher.health_interval_s == 0.5);
  CHECK(again->launcher.health_failures == 5);
  CHECK(ConfigToYaml(*again) == ConfigToYaml(*config));
  CHECK(config->Where("launcher.health_failures") == "a.yaml:2:53");
  CHECK(config->Where("router.port") == "a.yaml");
}
