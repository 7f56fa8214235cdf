// `tandem`: one binary, one subcommand per role or tool (DESIGN.md "Processes").
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cluster/launcher.h"
#include "cluster/planner.h"
#include "cluster/profile.h"
#include "cluster/replica_advisor.h"
#include "cluster/simulator.h"
#include "common/config/config.h"
#include "common/config/serving_config.h"
#include "common/base/flags.h"
#include "cluster/generate_cli.h"
#include "cluster/gguf_cli.h"
#include "cluster/make_model_cli.h"
#include "common/model/make_model.h"
#include "decode/colocated_server.h"
#include "decode/decode_server.h"
#include "kvtransfer/ucx_capabilities.h"
#if TANDEM_HAVE_CUDA
#include "common/engine/cuda/cuda_backend.h"
#include "kvtransfer/nccl/nccl_bootstrap_root.h"
#endif
#include "prefill/prefill_server.h"
#include "perf/bench.h"
#include "router/api_keys.h"
#include "router/cluster_backend.h"
#include "router/router_main.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "dev"
#endif

namespace tandem {
namespace {

int CheckConfigMain(const std::vector<std::string>& args) {
  FlagParser flags("tandem check-config CONFIG [--SECTION.KEY=VALUE ...]",
                   "Validates a cluster config file and prints the effective configuration.");
  flags.AllowConfigOverrides();
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "tandem check-config: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (flags.positional().size() != 1) {
    std::fprintf(stderr, "tandem check-config: expected one CONFIG file\n");
    return kExitUsage;
  }
  // What the serving commands would refuse is refused here too (check-config answers "would
  // `tandem up` accept this?").
  StatusOr<ClusterConfig> config =
      LoadServingConfig(flags.positional()[0], flags.config_overrides());
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return kExitFailure;
  }
  // The latency model file too: the router would refuse to start without it.
  if (StatusOr<RouterLatencyModels> models = LoadRouterLatencyModels(*config); !models.ok()) {
    std::fprintf(stderr, "%s\n", models.status().message().c_str());
    return kExitFailure;
  }
  // And the API key file (with $TANDEM_API_KEYS, as the router reads them).
  if (StatusOr<ApiKeys> keys = LoadApiKeys(*config, std::getenv(kApiKeysEnv)); !keys.ok()) {
    std::fprintf(stderr, "%s\n", keys.status().message().c_str());
    return kExitFailure;
  }
  std::fputs(ConfigToYaml(*config).c_str(), stdout);
  return kExitOk;
}

// The router with the planner's replica recommendation (router/replica_advice.h).
int RouterCommand(const std::vector<std::string>& args) { return RouterMain(args, RecommendReplicas); }

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

const Command kCommands[] = {
    {"serve", "start the default local cluster (SmolLM2-135M-Instruct, router on :8000)", ServeMain},
    {"up", "start and supervise a local cluster from a config file", UpMain},
    {"router", "run the OpenAI-compatible router in front of the instances", RouterCommand},
    {"make-model", "write a small HF checkpoint with seeded random weights", MakeModelMain},
    {"generate", "run the engine alone, greedily, on one prompt", GenerateMain},
    {"gguf", "print a GGUF file's metadata and tensors, and whether Tandem can serve it", GgufMain},
    {"check-config", "validate a cluster config and print the effective values", CheckConfigMain},
    {"prefill", "run a prefill instance (batches prompts, hands KV to decode)", PrefillMain},
    {"decode", "run a decode instance (pulls KV, continuous batching of decode)", DecodeMain},
    {"colocated", "run a colocated instance (prefill + decode in one engine)", ColocatedMain},
    {"bench", "load-test a running cluster over the OpenAI API; `bench sweep` finds goodput", BenchMain},
    {"profile", "measure prefill/decode step times here and fit the latency model", ProfileMain},
    {"simulate", "simulate a cluster config on a workload with a latency model", SimulateMain},
    {"plan", "choose prefill/decode parallelism and instance counts for a workload", PlanMain},
};

void PrintHelp(FILE* out) {
  std::fprintf(out,
               "usage: tandem <command> [flags]\n\n"
               "Tandem serves LLMs with disaggregated prefill and decode.\n\ncommands:\n");
  for (const Command& command : kCommands)
    std::fprintf(out, "  %-14s %s\n", command.name, command.summary);
  std::fprintf(out,
               "\nglobal flags:\n  --help         show this help (or `tandem <command> --help`)\n"
               "  --version      print the version\n");
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  using namespace tandem;
  // Whether a cuda instance's KV may go over ucx is this machine's UCX's to say.
  SetUcxCudaProbe([](const std::string& tls) {
    StatusOr<UcxCapabilities> ucx = ProbeUcx(tls);
    return ucx.ok() && ucx->cuda_memory;
  });
  if (argc < 2) {
    PrintHelp(stderr);
    return kExitUsage;
  }
  std::string first = argv[1];
  if (first == "--help" || first == "-h" || first == "help") {
    PrintHelp(stdout);
    return kExitOk;
  }
  if (first == "--version") {
    // The version, then what this binary and the libraries it runs with can do.
    std::printf("tandem %s\n", TANDEM_VERSION);
#if TANDEM_HAVE_CUDA
    std::printf("CUDA backend: compiled in (device cuda on every instance; KV between GPU pools "
                "over cuda_ipc or nccl, and ucx where the UCX below moves GPU memory); %s\n",
                cuda::DescribeCudaDevices().c_str());
    // NCCL KV pullers host their links' bootstrap roots in the helper beside this binary.
    const std::string roots = NcclRootHelperBeside("/proc/self/exe");
    std::printf("NCCL bootstrap roots: %s\n",
                roots.empty() ? "in the decode instance's process (no tandem-nccl-root beside "
                                "this binary)"
                              : ("in children, " + roots).c_str());
#else
    std::printf("CUDA backend: not built (cmake -DTANDEM_CUDA=ON on a machine with nvcc)\n");
#endif
    std::printf("%s\n", DescribeUcx(ProbeUcx()).c_str());
    return kExitOk;
  }
  for (const Command& command : kCommands) {
    if (first == command.name) return command.run(std::vector<std::string>(argv + 2, argv + argc));
  }
  bool is_flag = first.rfind("-", 0) == 0;
  std::fprintf(stderr, is_flag ? "tandem: unknown flag '%s' (see tandem --help)\n"
                               : "tandem: unknown command '%s' (see tandem --help)\n",
               first.c_str());
  return kExitUsage;
}
