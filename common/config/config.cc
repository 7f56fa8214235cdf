#include "common/config/config.h"

#include <arpa/inet.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "common/config/yaml_fields.h"

namespace tandem {
std::string StripBrackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    return host.substr(1, host.size() - 2);
  return host;
}

bool IsUnspecifiedAddress(const std::string& ip) { return ip == "0.0.0.0" || ip == "::"; }

bool IsLoopbackAddress(const std::string& ip) {
  return ip.rfind("127.", 0) == 0 || ip == "::1" || ip == "localhost";
}

std::string HostOfAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  return StripBrackets(colon == std::string::npos ? address : address.substr(0, colon));
}

namespace {

// root[section][key], or an undefined node when either is missing (messages then name the file).
YAML::Node At(const YAML::Node& root, const std::string& section, const char* key) {
  if (!root.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  YAML::Node sec = root[section];
  if (!sec.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  return sec[key];
}

const InstanceSection* SectionByName(const ClusterConfig* c, const std::string& name) {
  if (name == "prefill") return &c->prefill;
  if (name == "decode") return &c->decode;
  return &c->colocated;
}

bool IsIpAddress(const std::string& text) {
  in6_addr buffer{};
  return ::inet_pton(AF_INET, text.c_str(), &buffer) == 1 ||
         ::inet_pton(AF_INET6, text.c_str(), &buffer) == 1;
}

// S.host, S.advertise_host and S.addresses name IP addresses (and ports) peers can use.
void CheckAddresses(YamlErrors* v, const YAML::Node& node, const std::string& name,
                    const InstanceSection& s) {
  if (!IsIpAddress(s.host))
    v->Add(node["host"], name + ".host", "'" + s.host + "' is not an IP address");
  if (!s.advertise_host.empty() && !IsIpAddress(s.advertise_host))
    v->Add(node["advertise_host"], name + ".advertise_host",
           "'" + s.advertise_host + "' is not an IP address");
  if (IsUnspecifiedAddress(s.advertise_host))
    v->Add(node["advertise_host"], name + ".advertise_host",
           s.advertise_host + " is not an address peers can dial: name this host's IP address");
  if (!s.dns_name.empty()) {
    const size_t colon = s.dns_name.rfind(':');
    const std::string port = colon == std::string::npos ? "" : s.dns_name.substr(colon + 1);
    if (colon == 0 || port.empty() || port.size() > 5 ||
        port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
        std::stoi(port) > 65535)
      v->Add(node["dns_name"], name + ".dns_name",
             "'" + s.dns_name + "' is not NAME:PORT (the instances' control port)");
    if (!s.addresses.empty())
      v->Add(node["dns_name"], name + ".dns_name",
             "set either " + name + ".addresses or " + name + ".dns_name, not both");
  }
  for (const std::string& a : s.addresses) {
    const size_t colon = a.rfind(':');
    const std::string ip = colon == std::string::npos ? "" : a.substr(0, colon);
    const std::string port = colon == std::string::npos ? "" : a.substr(colon + 1);
    const bool port_ok = !port.empty() && port.size() <= 5 &&
                         port.find_first_not_of("0123456789") == std::string::npos &&
                         std::stoi(port) > 0 && std::stoi(port) <= 65535;
    if (!port_ok || !IsIpAddress(StripBrackets(ip)) || IsUnspecifiedAddress(StripBrackets(ip)))
      v->Add(node["addresses"], name + ".addresses",
             "'" + a + "' is not IP:PORT of an instance (an address it can be dialed at)");
  }
}

void ReadInstance(YamlErrors* v, YAML::Node node, const std::string& name, InstanceSection* s) {
  YamlFields sec(v, node, name);
  sec.Int("instances", &s->instances, 0, 1024);
  sec.Int("threads", &s->threads, 1, 1024);
  sec.String("device", &s->device, {"cpu", "cuda"});
  sec.StringList("cuda_devices", &s->cuda_devices);
  for (const std::string& d : s->cuda_devices) {
    const bool ordinal = !d.empty() && d.find_first_not_of("0123456789") == std::string::npos;
    const bool uuid = d.rfind("GPU-", 0) == 0 || d.rfind("MIG-", 0) == 0;
    if (!ordinal && !uuid) {
      v->Add(node["cuda_devices"], name + ".cuda_devices",
             "'" + d + "' is not a GPU (an ordinal such as 0, or a GPU-/MIG- UUID)");
      break;
    }
  }
  sec.Int("tensor_parallel", &s->tensor_parallel, 1, 64);
  sec.Int("pipeline_parallel", &s->pipeline_parallel, 1, 64);
  sec.Int("kv_blocks", &s->kv_blocks, 0, 1 << 24);
  sec.Int("max_batch_size", &s->max_batch_size, 1, 4096);
  sec.Int("token_budget", &s->token_budget, 1, 1 << 20);
  sec.Double("kv_usage_watermark", &s->kv_usage_watermark, 0.01, 1.0);
  sec.String("preemption", &s->preemption, {"recompute", "swap"});
  sec.Double("kv_hold_timeout_s", &s->kv_hold_timeout_s, 0.001, 86400);
  sec.String("scheduling", &s->scheduling, {"chunked", "prefill_first"});
  sec.Int("port", &s->port, 0, 65535);
  sec.Int("metrics_port", &s->metrics_port, 0, 65535);
  sec.String("host", &s->host);
  sec.String("advertise_host", &s->advertise_host);
  sec.StringList("addresses", &s->addresses);
  sec.String("dns_name", &s->dns_name);
  CheckAddresses(v, node, name, *s);
}

void ReadModelAndRouter(YamlErrors* v, YamlFields& top, ClusterConfig* c) {
  {
    YamlFields sec(v, top.Child("model"), "model");
    sec.String("path", &c->model.path);
    // Made random-weight presets, then the packaged real ones (common/model/packaged_model.cc).
    sec.String("preset", &c->model.preset, {"tiny", "small", "medium", "smollm2-135m-instruct"});
    sec.String("name", &c->model.name);
    // auto, none, or a Jinja file (relative to the config file; read by the router).
    sec.String("chat_template", &c->model.chat_template);
    sec.Int("max_model_len", &c->model.max_model_len, 16, 1 << 20);
    sec.String("dtype", &c->model.dtype, {"auto", "float32", "bfloat16", "float16"});
  }
  YAML::Node router = top.Child("router");
  YamlFields sec(v, router, "router");
  sec.String("host", &c->router.host);
  sec.Int("port", &c->router.port, 0, 65535);
  sec.String("policy", &c->router.policy, {"goodput", "least_loaded", "round_robin"});
  sec.Int("max_concurrent_requests", &c->router.max_concurrent_requests, 1, 1 << 20);
  sec.Int("max_body_bytes", &c->router.max_body_bytes, 1024, 1 << 30);
  sec.Double("request_timeout_s", &c->router.request_timeout_s, 0.001, 86400);
  sec.Int("http_threads", &c->router.http_threads, 1, 256);
  sec.Int("max_connections", &c->router.max_connections, 16, 1 << 20);
  sec.Int("tokenize_threads", &c->router.tokenize_threads, 1, 256);
  sec.String("latency_model", &c->router.latency_model);
  sec.String("api_keys_file", &c->router.api_keys_file);
  sec.Bool("metrics_require_api_key", &c->router.metrics_require_api_key);
  sec.Double("recommend_interval_s", &c->router.recommend_interval_s, 0, 86400);
  sec.Double("recommend_window_s", &c->router.recommend_window_s, 1, 86400);
  sec.Double("config_watch_interval_s", &c->router.config_watch_interval_s, 0, 3600);
  // The recommendation simulates the instances on the latency model: without one it could not
  // run, and an interval that does nothing is refused.
  if (c->router.recommend_interval_s > 0 && c->router.latency_model.empty() && router)
    v->Add(router["recommend_interval_s"], "router.recommend_interval_s",
           "needs router.latency_model (the replica recommendation simulates the instances on "
           "it; run tandem profile)");
}

void ReadSlo(YamlErrors* v, YamlFields& top, ClusterConfig* c) {
  YamlFields sec(v, top.Child("slo"), "slo");
  sec.Double("ttft_s", &c->slo.ttft_s, 1e-6, 3600);
  sec.Double("tpot_s", &c->slo.tpot_s, 1e-6, 3600);
  sec.Double("attainment_target", &c->slo.attainment_target, 0.0, 1.0);
  YAML::Node classes = sec.Child("classes");
  if (!classes || classes.IsNull()) return;
  if (!classes.IsSequence()) {
    v->Add(classes, "slo.classes", "must be a list, got " + DescribeYaml(classes));
    return;
  }
  std::set<std::string> names;
  for (size_t i = 0; i < classes.size(); ++i) {
    std::string prefix = "slo.classes[" + std::to_string(i) + "]";
    SloClass cls{"", c->slo.ttft_s, c->slo.tpot_s};
    YamlFields item(v, classes[i], prefix);
    item.String("name", &cls.name);
    item.Double("ttft_s", &cls.ttft_s, 1e-6, 3600);
    item.Double("tpot_s", &cls.tpot_s, 1e-6, 3600);
    if (cls.name.empty()) v->Add(classes[i], prefix + ".name", "is required");
    else if (!names.insert(cls.name).second)
      v->Add(classes[i], prefix + ".name", "duplicate class '" + cls.name + "'");
    c->slo.classes.push_back(cls);
  }
}

// transfer.ucx_tls: each comma-separated item a transport UCX knows.
void CheckUcxTls(YamlErrors* v, const YAML::Node& node, const std::string& tls) {
  const std::vector<std::string>& known = KnownUcxTransports();
  std::stringstream items(tls.size() > 0 && tls[0] == '^' ? tls.substr(1) : tls);
  int count = 0;
  for (std::string item; std::getline(items, item, ',');) {
    ++count;
    if (item.size() > 4 && item.compare(item.size() - 4, 4, ":aux") == 0)
      item.resize(item.size() - 4);
    if (std::find(known.begin(), known.end(), item) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      v->Add(node, "transfer.ucx_tls",
             "'" + item + "' is not a UCX transport (known: " + list + ")");
    }
  }
  if (count == 0 || tls.back() == ',')
    v->Add(node, "transfer.ucx_tls", "must name at least one UCX transport, got '" + tls + "'");
}

void ReadTransport(YamlErrors* v, YamlFields& top, const YAML::Node& root, ClusterConfig* c) {
  {
    YamlFields sec(v, top.Child("kv_cache"), "kv_cache");
    sec.Int("block_size", &c->kv_cache.block_size, 1, 1024);
    if (c->kv_cache.block_size & (c->kv_cache.block_size - 1))
      v->Add(At(root, "kv_cache", "block_size"), "kv_cache.block_size", "must be a power of two");
    sec.Double("memory_fraction", &c->kv_cache.memory_fraction, 0.0001, kMaxKvMemoryShare);
    sec.Bool("prefix_caching", &c->kv_cache.prefix_caching);
    sec.String("dtype", &c->kv_cache.dtype, {"auto", "float32", "bfloat16"});
  }
  {
    YamlFields sec(v, top.Child("transfer"), "transfer");
    sec.String("backend", &c->transfer.backend, {"ucx", "cuda_ipc", "nccl", "inproc"});
    sec.String("ucx_tls", &c->transfer.ucx_tls);
    sec.Double("timeout_s", &c->transfer.timeout_s, 0.001, 3600);
    sec.Int("max_inflight", &c->transfer.max_inflight, 1, 1 << 16);
    sec.Bool("layerwise", &c->transfer.layerwise);
    CheckUcxTls(v, At(root, "transfer", "ucx_tls"), c->transfer.ucx_tls);
  }
  {
    YamlFields sec(v, top.Child("control"), "control");
    sec.Double("heartbeat_interval_s", &c->control.heartbeat_interval_s, 0.001, 60);
    sec.Double("heartbeat_timeout_s", &c->control.heartbeat_timeout_s, 0.01, 3600);
    sec.Double("connect_timeout_s", &c->control.connect_timeout_s, 0.001, 3600);
    sec.String("secret_file", &c->control.secret_file);
    sec.Double("handshake_timeout_s", &c->control.handshake_timeout_s, 0.01, 600);
    sec.Int("max_connections", &c->control.max_connections, 4, 1 << 20);
    sec.Double("discovery_interval_s", &c->control.discovery_interval_s, 0.05, 3600);
    if (c->control.heartbeat_timeout_s < 3 * c->control.heartbeat_interval_s)
      v->Add(At(root, "control", "heartbeat_timeout_s"), "control.heartbeat_timeout_s",
             "must be at least 3 x control.heartbeat_interval_s, so that one late report fails "
             "nothing");
  }
}

void ReadConfig(YamlErrors* v, const YAML::Node& root, ClusterConfig* c) {
  YamlFields top(v, root, "");
  ReadModelAndRouter(v, top, c);
  ReadInstance(v, top.Child("prefill"), "prefill", &c->prefill);
  ReadInstance(v, top.Child("decode"), "decode", &c->decode);
  c->colocated.instances = 0;
  ReadInstance(v, top.Child("colocated"), "colocated", &c->colocated);
  ReadSlo(v, top, c);
  ReadTransport(v, top, root, c);
  {
    YamlFields sec(v, top.Child("launcher"), "launcher");
    sec.Double("health_interval_s", &c->launcher.health_interval_s, 0.01, 3600);
    sec.Double("health_timeout_s", &c->launcher.health_timeout_s, 0.01, 600);
    sec.Int("health_failures", &c->launcher.health_failures, 1, 1000);
    sec.Double("ready_timeout_s", &c->launcher.ready_timeout_s, 1, 86400);
  }
  {
    YamlFields sec(v, top.Child("logging"), "logging");
    sec.String("level", &c->logging.level, {"debug", "info", "warn", "error"});
    sec.String("format", &c->logging.format, {"text", "json"});
  }
  // bfloat16 KV only where no instance computes on the CPU.
  if (c->kv_cache.dtype == "bfloat16")
    for (const char* name : {"prefill", "decode", "colocated"}) {
      const InstanceSection& s = *SectionByName(c, name);
      if (s.instances > 0 && s.device != "cuda") {
        v->Add(At(root, "kv_cache", "dtype"), "kv_cache.dtype",
               "bfloat16 needs every instance on device cuda, and " + std::string(name) +
                   ".device is " + s.device + " (the CPU backend keeps KV in float32): set "
                   "float32 or auto");
        break;
      }
    }
  // An explicit pool of a section that runs instances must hold one request of
  // model.max_model_len, or such a request could never run (the default pool is checked where
  // its size is known, and every served pool again when it is made: KvPoolBlocks).
  const int64_t request_blocks =
      (int64_t{c->model.max_model_len} + c->kv_cache.block_size - 1) / c->kv_cache.block_size;
  for (const char* name : {"prefill", "decode", "colocated"}) {
    const InstanceSection& s = *SectionByName(c, name);
    if (s.instances > 0 && s.kv_blocks > 0 && s.kv_blocks < request_blocks)
      v->Add(At(root, name, "kv_blocks"), std::string(name) + ".kv_blocks",
             "holds " + std::to_string(s.kv_blocks) + " blocks, fewer than one request of "
             "model.max_model_len (" + std::to_string(c->model.max_model_len) + " tokens = " +
             std::to_string(request_blocks) + " blocks of " +
             std::to_string(c->kv_cache.block_size) + ")");
  }
}

// Applies "a.b.c=value" onto the tree; returns the dotted keys it set.
Status ApplyOverrides(YAML::Node& root, const std::vector<std::string>& overrides,
                      std::set<std::string>* overridden) {
  if (overrides.empty()) return Status::Ok();
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  // A file whose top level is not a mapping is refused by ReadConfig with its file and line;
  // there is nothing to override in it (and yaml-cpp throws on a key into a scalar).
  if (!root.IsMap()) return Status::Ok();
  for (const std::string& o : overrides) {
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      return InvalidArgument("config override '" + o + "' is not KEY=VALUE");
    std::string key = o.substr(0, eq);
    std::vector<std::string> parts;
    std::stringstream ss(key);
    for (std::string part; std::getline(ss, part, '.');) {
      if (part.empty()) return InvalidArgument("config override '" + o + "' has an empty key");
      parts.push_back(part);
    }
    YAML::Node value;
    try {
      value = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      return InvalidArgument("flag --" + key + ": cannot parse value: " + e.msg);
    }
    // Walk down, creating maps; yaml-cpp nodes are handles, so assign through a chain.
    std::vector<YAML::Node> chain{root};
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      YAML::Node next = chain.back()[parts[i]];
      if (!next.IsDefined() || next.IsNull()) {
        chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
        next = chain.back()[parts[i]];
      } else if (!next.IsMap()) {
        return InvalidArgument("flag --" + key + ": '" + parts[i] + "' is not a section");
      }
      chain.push_back(next);
    }
    chain.back()[parts.back()] = value;
    overridden->insert(key);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ClusterConfig> ParseConfig(const std::string& yaml_text, const std::string& source_name,
                                    const std::vector<std::string>& overrides) {
  TANDEM_ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(yaml_text, source_name));
  // Before the overrides: they replace a key, which would hide the second of two.
  YamlErrors duplicates(source_name);
  ReportDuplicateKeys(&duplicates, root, "");
  TANDEM_RETURN_IF_ERROR(duplicates.ToStatus());
  std::set<std::string> overridden;
  TANDEM_RETURN_IF_ERROR(ApplyOverrides(root, overrides, &overridden));
  ClusterConfig config;
  config.source = source_name;
  YamlErrors errors(source_name, overridden);
  ReadConfig(&errors, root, &config);
  TANDEM_RETURN_IF_ERROR(errors.ToStatus());
  config.where = errors.locations();
  return config;
}

std::string ClusterConfig::Where(const std::string& field) const {
  auto it = where.find(field);
  return it == where.end() ? source : it->second;
}

const std::vector<std::string>& KnownUcxTransports() {
  static const std::vector<std::string> known = {
      "all",      "self",     "tcp",      "sm",       "shm",      "mm",        "posix",
      "sysv",     "xpmem",    "cma",      "knem",     "ib",       "rc",        "rc_v",
      "rc_verbs", "rc_x",     "rc_mlx5",  "ud",       "ud_v",     "ud_verbs",  "ud_x",
      "ud_mlx5",  "dc",       "dc_x",     "dc_mlx5",  "rdmacm",   "sockcm",    "cuda",
      "cuda_copy", "cuda_ipc", "gdr_copy", "rocm",    "rocm_copy", "rocm_ipc", "rocm_gdr",
      "ze_copy",  "ugni",     "ugni_rdma", "ugni_udt", "ugni_smsg"};
  return known;
}

StatusOr<ClusterConfig> LoadConfig(const std::string& path,
                                   const std::vector<std::string>& overrides) {
  if (path.empty()) return ParseConfig("", "<defaults>", overrides);
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open config file");
  std::stringstream text;
  text << in.rdbuf();
  return ParseConfig(text.str(), path, overrides);
}

std::string ConfigToYaml(const ClusterConfig& c) {
  YAML::Emitter out;
  auto instance = [&out](const char* name, const InstanceSection& s) {
    out << YAML::Key << name << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "instances" << YAML::Value << s.instances;
    out << YAML::Key << "threads" << YAML::Value << s.threads;
    out << YAML::Key << "device" << YAML::Value << s.device;
    out << YAML::Key << "cuda_devices" << YAML::Value << YAML::Flow << s.cuda_devices;
    out << YAML::Key << "tensor_parallel" << YAML::Value << s.tensor_parallel;
    out << YAML::Key << "pipeline_parallel" << YAML::Value << s.pipeline_parallel;
    out << YAML::Key << "kv_blocks" << YAML::Value << s.kv_blocks;
    out << YAML::Key << "max_batch_size" << YAML::Value << s.max_batch_size;
    out << YAML::Key << "token_budget" << YAML::Value << s.token_budget;
    out << YAML::Key << "kv_usage_watermark" << YAML::Value << s.kv_usage_watermark;
    out << YAML::Key << "preemption" << YAML::Value << s.preemption;
    out << YAML::Key << "kv_hold_timeout_s" << YAML::Value << s.kv_hold_timeout_s;
    out << YAML::Key << "scheduling" << YAML::Value << s.scheduling;
    out << YAML::Key << "port" << YAML::Value << s.port;
    out << YAML::Key << "metrics_port" << YAML::Value << s.metrics_port;
    out << YAML::Key << "host" << YAML::Value << s.host;
    out << YAML::Key << "advertise_host" << YAML::Value << s.advertise_host;
    out << YAML::Key << "addresses" << YAML::Value << YAML::Flow << s.addresses;
    out << YAML::Key << "dns_name" << YAML::Value << s.dns_name;
    out << YAML::EndMap;
  };
  out << YAML::BeginMap;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "path" << YAML::Value << c.model.path;
  out << YAML::Key << "preset" << YAML::Value << c.model.preset;
  out << YAML::Key << "name" << YAML::Value << c.model.name;
  out << YAML::Key << "chat_template" << YAML::Value << c.model.chat_template;
  out << YAML::Key << "dtype" << YAML::Value << c.model.dtype;
  out << YAML::Key << "max_model_len" << YAML::Value << c.model.max_model_len;
  out << YAML::EndMap;
  out << YAML::Key << "router" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "host" << YAML::Value << c.router.host;
  out << YAML::Key << "port" << YAML::Value << c.router.port;
  out << YAML::Key << "policy" << YAML::Value << c.router.policy;
  out << YAML::Key << "max_concurrent_requests" << YAML::Value << c.router.max_concurrent_requests;
  out << YAML::Key << "max_body_bytes" << YAML::Value << c.router.max_body_bytes;
  out << YAML::Key << "request_timeout_s" << YAML::Value << c.router.request_timeout_s;
  out << YAML::Key << "http_threads" << YAML::Value << c.router.http_threads;
  out << YAML::Key << "max_connections" << YAML::Value << c.router.max_connections;
  out << YAML::Key << "tokenize_threads" << YAML::Value << c.router.tokenize_threads;
  out << YAML::Key << "latency_model" << YAML::Value << c.router.latency_model;
  out << YAML::Key << "api_keys_file" << YAML::Value << c.router.api_keys_file;
  out << YAML::Key << "metrics_require_api_key" << YAML::Value
      << c.router.metrics_require_api_key;
  out << YAML::Key << "recommend_interval_s" << YAML::Value << c.router.recommend_interval_s;
  out << YAML::Key << "recommend_window_s" << YAML::Value << c.router.recommend_window_s;
  out << YAML::Key << "config_watch_interval_s" << YAML::Value
      << c.router.config_watch_interval_s;
  out << YAML::EndMap;
  instance("prefill", c.prefill);
  instance("decode", c.decode);
  instance("colocated", c.colocated);
  out << YAML::Key << "slo" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "ttft_s" << YAML::Value << c.slo.ttft_s;
  out << YAML::Key << "tpot_s" << YAML::Value << c.slo.tpot_s;
  out << YAML::Key << "attainment_target" << YAML::Value << c.slo.attainment_target;
  out << YAML::Key << "classes" << YAML::Value << YAML::BeginSeq;
  for (const SloClass& cls : c.slo.classes) {
    out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << cls.name << YAML::Key
        << "ttft_s" << YAML::Value << cls.ttft_s << YAML::Key << "tpot_s" << YAML::Value
        << cls.tpot_s << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap;
  out << YAML::Key << "kv_cache" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "block_size" << YAML::Value << c.kv_cache.block_size;
  out << YAML::Key << "memory_fraction" << YAML::Value << c.kv_cache.memory_fraction;
  out << YAML::Key << "prefix_caching" << YAML::Value << c.kv_cache.prefix_caching;
  out << YAML::Key << "dtype" << YAML::Value << c.kv_cache.dtype << YAML::EndMap;
  out << YAML::Key << "transfer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "backend" << YAML::Value << c.transfer.backend;
  out << YAML::Key << "ucx_tls" << YAML::Value << c.transfer.ucx_tls;
  out << YAML::Key << "timeout_s" << YAML::Value << c.transfer.timeout_s;
  out << YAML::Key << "max_inflight" << YAML::Value << c.transfer.max_inflight;
  out << YAML::Key << "layerwise" << YAML::Value << c.transfer.layerwise << YAML::EndMap;
  out << YAML::Key << "control" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "heartbeat_interval_s" << YAML::Value << c.control.heartbeat_interval_s;
  out << YAML::Key << "heartbeat_timeout_s" << YAML::Value << c.control.heartbeat_timeout_s;
  out << YAML::Key << "connect_timeout_s" << YAML::Value << c.control.connect_timeout_s;
  out << YAML::Key << "secret_file" << YAML::Value << c.control.secret_file;
  out << YAML::Key << "handshake_timeout_s" << YAML::Value << c.control.handshake_timeout_s;
  out << YAML::Key << "max_connections" << YAML::Value << c.control.max_connections;
  out << YAML::Key << "discovery_interval_s" << YAML::Value << c.control.discovery_interval_s
      << YAML::EndMap;
  out << YAML::Key << "launcher" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "health_interval_s" << YAML::Value << c.launcher.health_interval_s;
  out << YAML::Key << "health_timeout_s" << YAML::Value << c.launcher.health_timeout_s;
  out << YAML::Key << "health_failures" << YAML::Value << c.launcher.health_failures;
  out << YAML::Key << "ready_timeout_s" << YAML::Value << c.launcher.ready_timeout_s
      << YAML::EndMap;
  out << YAML::Key << "logging" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "level" << YAML::Value << c.logging.level;
  out << YAML::Key << "format" << YAML::Value << c.logging.format << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace tandem
