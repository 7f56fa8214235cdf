// The cluster configuration: one YAML file for the router, the prefill and decode instances,
// the SLOs, the model and the KV transfer. Schema and defaults: README.md "Configuration".
//
// LoadConfig validates every field at load: types, ranges, allowed values, and unknown keys
// (a typo is an error, never silently ignored). Each error names the file, the line and the
// dotted field ("cluster.yaml:12:3: decode.max_batch_size: must be an integer in [1, 4096],
// got 'lots'"). Command-line overrides ("decode.max_batch_size=32") are applied before
// validation and are reported as "flag --decode.max_batch_size" when wrong. A key given twice in
// one mapping is an error. Cross-field checks that need nothing but the file run here too (an
// explicit kv_blocks holds one request of model.max_model_len; heartbeat timeout vs interval).
//
// LoadConfig accepts every value that some command can use: `tandem simulate` and `tandem plan`
// read GPU layouts (device cuda, tensor/pipeline parallel > 1) that no server here can run. The
// commands that serve load through LoadServingConfig (common/config/serving_config.h), which
// refuses those values with the same file:line:field messages.
#pragma once

#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/base/status.h"

namespace tandem {

struct ModelSection {
  std::string path;            // HF checkpoint directory; empty = the built-in model
  std::string preset = "medium";  // built-in model preset when path is empty
  std::string name;            // served model name (/v1/models); empty = derived from path
  // auto (the checkpoint's own template), none, or the path of a Jinja template file (relative
  // to the config file).
  std::string chat_template = "auto";
  int max_model_len = 4096;    // prompt + output tokens per request
  // Storage dtype of the weight matrices on CPU (arithmetic stays fp32): auto|float32|bfloat16|
  // float16; auto = the checkpoint's torch_dtype, float32 when it has none (Model::Load).
  std::string dtype = "auto";
};

struct RouterSection {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string policy = "goodput";  // goodput|least_loaded|round_robin
  int max_concurrent_requests = 1024;  // beyond this, 429
  int max_body_bytes = 8 << 20;        // beyond this, 413
  double request_timeout_s = 600;
  int http_threads = 2;
  // HTTP connections open at once; beyond it a new one gets 503 and is closed.
  int max_connections = 4096;
  // Threads that template, tokenize and submit requests, off the HTTP io threads.
  int tokenize_threads = 2;
  // Latency model YAML from `tandem profile` (common/engine/latency_model.h) for the goodput policy;
  // empty = predict from the instances' measured averages. A relative path is relative to the
  // config file's directory.
  std::string latency_model;
  // API keys (router/api_keys.h): one per line, '#' comments; a relative path is relative to the
  // config file's directory. With no key here nor in $TANDEM_API_KEYS the API is open.
  std::string api_keys_file;
  // Whether the router's /metrics asks for a key too (when keys are configured).
  bool metrics_require_api_key = false;
  // tandem_recommended_replicas (router/replica_advice.h): recomputed every this many seconds
  // (0 = off; > 0 needs latency_model) from the traffic of the last recommend_window_s.
  double recommend_interval_s = 0;
  double recommend_window_s = 60;
  // The router rereads its config file when its contents change, polled this often (a
  // Kubernetes ConfigMap edit reloads the SLOs and policy without a signal); 0 = SIGHUP only.
  double config_watch_interval_s = 5;
};

// Shared by prefill, decode and colocated instances.
struct InstanceSection {
  int instances = 1;
  int threads = 1;            // CPU threads for the forward pass
  std::string device = "cpu";  // cpu|cuda
  // device cuda: the GPUs of the instances, one entry each (instance i takes entry i modulo
  // the list's length: a CUDA_VISIBLE_DEVICES value, an ordinal or a GPU-/MIG- UUID). Empty:
  // every instance inherits the launcher's CUDA_VISIBLE_DEVICES (they share its first GPU).
  std::vector<std::string> cuda_devices;
  int tensor_parallel = 1;
  int pipeline_parallel = 1;  // pipeline stages (GPU planner output; CPU instances use 1)
  int kv_blocks = 0;          // 0 = kv_cache.memory_fraction of the machine's memory
  int max_batch_size = 64;    // sequences in one forward pass
  int token_budget = 2048;    // prefill: tokens in one batch
  double kv_usage_watermark = 0.95;  // decode: admit only below this KV usage
  std::string preemption = "recompute";  // decode: recompute (swap: refused for serving)
  double kv_hold_timeout_s = 30;  // prefill: free unpulled KV after this
  // colocated: "chunked" mixes prompt chunks into decode steps (vLLM today); "prefill_first"
  // runs waiting prompts whole, in prefill-only steps that pause every decode (vLLM 2023, the
  // baseline DistServe measured against).
  std::string scheduling = "chunked";
  int port = 0;               // control-plane port of the first instance; 0 = pick
  int metrics_port = 0;       // HTTP /metrics and /health port of the first instance; 0 = none
  // Where an instance listens (control, metrics, the UCX data plane): an IP address; 0.0.0.0
  // listens everywhere.
  std::string host = "127.0.0.1";
  // What peers dial to reach an instance (an IP address; empty = host). $TANDEM_ADVERTISE_HOST
  // wins when set (a Kubernetes pod passes status.podIP). Never 0.0.0.0; never loopback in a
  // cluster whose instances are on other machines.
  std::string advertise_host;
  // The router's static discovery: every instance of this role as "ip:port" (its control port).
  // Empty = the instances `tandem up` starts here (127.0.0.1, port + index).
  std::vector<std::string> addresses;
  // The router's DNS discovery: "name:port"; every A/AAAA record of the name is an instance (a
  // Kubernetes headless Service), resolved every control.discovery_interval_s. A new address
  // joins; one that vanished is drained (no new work; closed once its requests are done).
  std::string dns_name;
};

struct SloClass {
  std::string name;
  double ttft_s = 0;
  double tpot_s = 0;
};

struct SloSection {
  double ttft_s = 2.0;
  double tpot_s = 0.2;
  double attainment_target = 0.9;
  std::vector<SloClass> classes;  // per request class (the "x-tandem-slo-class" header)
};

// The KV pools of the instances on one machine take at most this share of its memory; the rest
// is for the weights, the activations and everything else.
inline constexpr double kMaxKvMemoryShare = 0.9;

struct KvCacheSection {
  int block_size = 16;  // tokens per block
  // The default KV pool of each instance (S.kv_blocks 0): this share of the machine's memory
  // (physical memory or the cgroup limit, whichever is lower), at most what S.max_batch_size
  // requests of model.max_model_len need.
  double memory_fraction = 0.05;
  // Keep the blocks of computed prompt prefixes after their requests end, for later requests
  // that begin the same way (common/engine/kv_cache.h). false: blocks are shared only while
  // their requests run (the n choices of one request still share their prompt). Cached
  // prefixes make a request that repeats another's prefix faster, which another tenant could
  // time: turn this off where tenants must not learn about each other's prompts.
  bool prefix_caching = true;
  // The type of the K and V values in every pool: auto|float32|bfloat16. One for the whole
  // cluster (a transfer moves the bytes as they are). bfloat16 halves a token's KV and needs
  // every instance on device cuda (the CPU backend keeps KV in float32); auto = bfloat16 where
  // every instance is on cuda, float32 otherwise (ResolvedKvDType, common/engine/kv_cache.h).
  std::string dtype = "auto";
};

struct TransferSection {
  std::string backend = "ucx";  // ucx|cuda_ipc|nccl|inproc (serving_config.h: where each runs)
  std::string ucx_tls = "tcp,sm,self";
  double timeout_s = 5.0;
  int max_inflight = 64;
  // Stream the KV layer by layer: prefill announces a request's KV before its last forward pass
  // and publishes each layer as it is computed; decode pulls layer l as soon as it is published
  // and starts its first step on layer 0 while later layers still arrive (nccl: decode orders
  // each batch of layers as prefill announces them).
  bool layerwise = true;
};

// The control plane between the router and the instances (common/net, common/serving).
struct ControlSection {
  // Every instance sends a LoadReport to each router connection this often.
  double heartbeat_interval_s = 0.1;
  // The router declares an instance down (fails the requests it holds and closes its session)
  // when no LoadReport arrived for this long. Must be several intervals, so that one late report
  // fails nothing.
  double heartbeat_timeout_s = 3.0;
  // Opening a control connection (TCP connect + Hello) gives up after this long.
  double connect_timeout_s = 2.0;
  // The cluster secret that every control peer proves it holds (common/net/control_auth.h): a
  // file (mode 0600 or stricter; relative to the config file), else TANDEM_CLUSTER_SECRET. `tandem
  // up` and `tandem serve` make one per cluster when neither is set.
  std::string secret_file;
  // A peer that has not proved membership within this long is closed.
  double handshake_timeout_s = 5.0;
  // Control connections an instance holds open at once; beyond, new ones are refused.
  int max_connections = 1024;
  // How often the router resolves S.dns_name again.
  double discovery_interval_s = 5.0;
};

// `tandem up`'s supervisor (cluster/launcher.h).
struct LauncherSection {
  // Every child's /health (instances: S.metrics_port + I; the router: router.port) is polled this
  // often; one poll gives up after health_timeout_s.
  double health_interval_s = 1.0;
  double health_timeout_s = 1.0;
  // A child that fails this many polls in a row is killed and restarted.
  int health_failures = 3;
  // Start-up: every child answers /health and the router /ready within this long, or `up` stops
  // with exit code 1.
  double ready_timeout_s = 600;
};

struct LoggingSection {
  std::string level = "info";   // debug|info|warn|error
  std::string format = "text";  // text|json
};

struct ClusterConfig {
  ModelSection model;
  RouterSection router;
  InstanceSection prefill;
  InstanceSection decode;
  InstanceSection colocated;
  SloSection slo;
  KvCacheSection kv_cache;
  TransferSection transfer;
  ControlSection control;
  LauncherSection launcher;
  LoggingSection logging;
  std::string source;  // where it came from, for messages ("cluster.yaml", "<defaults>")
  // Dotted field -> where it was set ("cluster.yaml:12:3", "flag --decode.threads"), for every
  // field the file or a flag set; checks made after load name the same place.
  std::map<std::string, std::string> where;

  // where[field], or `source` for a field left at its default.
  std::string Where(const std::string& field) const;
};

// The three instance sections of `config`, each with the name its keys start with: prefill,
// decode, colocated, in that order.
inline std::array<std::pair<const char*, const InstanceSection*>, 3> InstanceSections(
    const ClusterConfig& config) {
  return {{{"prefill", &config.prefill}, {"decode", &config.decode},
           {"colocated", &config.colocated}}};
}

// "[::1]" -> "::1"; anything else unchanged.
std::string StripBrackets(const std::string& host);
// 0.0.0.0 or :: (listen everywhere; not dialable).
bool IsUnspecifiedAddress(const std::string& ip);
// 127.0.0.0/8 or ::1.
bool IsLoopbackAddress(const std::string& ip);
// The IP part of "ip:port" / "[ip6]:port".
std::string HostOfAddress(const std::string& address);

// The transports UCX_TLS names (UCX 1.13+; `ucx_info -d` lists those this machine has), plus
// "all". transfer.ucx_tls is a comma-separated list of these; a leading "^" excludes them and a
// ":aux" suffix marks an auxiliary transport, as UCX reads them.
const std::vector<std::string>& KnownUcxTransports();

// Loads and validates a YAML file. `overrides` are "dotted.key=value" strings (from CLI flags);
// values are parsed as YAML scalars. On error returns InvalidArgument naming file:line and field
// (all errors found, one per line).
StatusOr<ClusterConfig> LoadConfig(const std::string& path,
                                   const std::vector<std::string>& overrides = {});

// Same, from YAML text; `source_name` stands in for the file name in messages.
StatusOr<ClusterConfig> ParseConfig(const std::string& yaml_text, const std::string& source_name,
                                    const std::vector<std::string>& overrides = {});

// The effective configuration as YAML (every field, defaults included).
std::string ConfigToYaml(const ClusterConfig& config);

}  // namespace tandem
