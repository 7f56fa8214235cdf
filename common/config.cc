#include "common/config.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <set>
#include <sstream>

namespace tandem {
namespace {

// Collects errors while walking the YAML tree; every message names location and field.
class Validator {
 public:
  Validator(std::string source, std::set<std::string> overridden)
      : source_(std::move(source)), overridden_(std::move(overridden)) {}

  void Error(const YAML::Node& node, const std::string& field, const std::string& what) {
    std::string where;
    if (overridden_.count(field)) {
      where = "flag --" + field;
    } else if (node.IsDefined() && !node.Mark().is_null()) {
      where = source_ + ":" + std::to_string(node.Mark().line + 1) + ":" +
              std::to_string(node.Mark().column + 1);
    } else {
      where = source_;
    }
    errors_.push_back(where + ": " + field + ": " + what);
  }

  const std::vector<std::string>& errors() const { return errors_; }

 private:
  std::string source_;
  std::set<std::string> overridden_;
  std::vector<std::string> errors_;
};

std::string Describe(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

// Reads the fields of one mapping; unknown keys are reported by Finish().
class Section {
 public:
  Section(Validator* v, YAML::Node node, std::string prefix)
      : v_(v), node_(std::move(node)), prefix_(std::move(prefix)) {
    if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
      v_->Error(node_, prefix_.empty() ? "<top level>" : prefix_,
                "must be a mapping, got " + Describe(node_));
      valid_ = false;
    }
  }
  ~Section() { Finish(); }

  void Int(const char* key, int* out, long min, long max) {
    YAML::Node n = Take(key);
    if (!n) return;
    long value;
    std::string text = n.IsScalar() ? n.Scalar() : "";
    char* end = nullptr;
    value = std::strtol(text.c_str(), &end, 10);
    if (!n.IsScalar() || text.empty() || *end != '\0' || value < min || value > max) {
      v_->Error(n, Field(key),
                "must be an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
                    "], got " + Describe(n));
      return;
    }
    *out = static_cast<int>(value);
  }

  void Double(const char* key, double* out, double min, double max) {
    YAML::Node n = Take(key);
    if (!n) return;
    std::string text = n.IsScalar() ? n.Scalar() : "";
    char* end = nullptr;
    double value = std::strtod(text.c_str(), &end);
    if (!n.IsScalar() || text.empty() || *end != '\0' || !(value >= min && value <= max)) {
      std::ostringstream range;
      range << "[" << min << ", " << max << "]";
      v_->Error(n, Field(key), "must be a number in " + range.str() + ", got " + Describe(n));
      return;
    }
    *out = value;
  }

  // YAML 1.2 booleans only (true/false), so that "yes" or "1" is reported, not guessed at.
  void Bool(const char* key, bool* out) {
    YAML::Node n = Take(key);
    if (!n) return;
    const std::string text = n.IsScalar() ? n.Scalar() : "";
    if (text != "true" && text != "false") {
      v_->Error(n, Field(key), "must be true or false, got " + Describe(n));
      return;
    }
    *out = text == "true";
  }

  // `allowed` empty = any string.
  void String(const char* key, std::string* out, std::vector<std::string> allowed = {}) {
    YAML::Node n = Take(key);
    if (!n) return;
    if (!n.IsScalar()) {
      v_->Error(n, Field(key), "must be a string, got " + Describe(n));
      return;
    }
    if (!allowed.empty()) {
      bool ok = false;
      std::string list;
      for (const std::string& a : allowed) {
        ok |= a == n.Scalar();
        list += (list.empty() ? "" : "|") + a;
      }
      if (!ok) {
        v_->Error(n, Field(key), "must be one of " + list + ", got " + Describe(n));
        return;
      }
    }
    *out = n.Scalar();
  }

  // A nested mapping; the caller reads it through another Section.
  YAML::Node Child(const char* key) {
    YAML::Node n = Take(key);
    return n ? n : YAML::Node();
  }

  std::string Field(const std::string& key) const {
    return prefix_.empty() ? key : prefix_ + "." + key;
  }
  Validator* validator() const { return v_; }

 private:
  YAML::Node Take(const char* key) {
    seen_.insert(key);
    if (!valid_ || !node_.IsDefined() || node_.IsNull()) return YAML::Node(YAML::NodeType::Undefined);
    YAML::Node n = node_[key];
    if (!n.IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
    return n;
  }

  void Finish() {
    if (!valid_ || !node_.IsDefined() || !node_.IsMap()) return;
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      std::string key = it->first.Scalar();
      if (!seen_.count(key)) v_->Error(it->first, Field(key), "unknown key");
    }
  }

  Validator* v_;
  YAML::Node node_;
  std::string prefix_;
  std::set<std::string> seen_;
  bool valid_ = true;
};

void ReadInstance(Validator* v, YAML::Node node, const std::string& name, InstanceSection* s) {
  Section sec(v, node, name);
  sec.Int("instances", &s->instances, 0, 1024);
  sec.Int("threads", &s->threads, 1, 1024);
  sec.String("device", &s->device, {"cpu", "cuda"});
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
}

void ReadConfig(Validator* v, const YAML::Node& root, ClusterConfig* c) {
  Section top(v, root, "");
  {
    Section sec(v, top.Child("model"), "model");
    sec.String("path", &c->model.path);
    sec.String("preset", &c->model.preset, {"tiny", "small", "medium"});
    sec.String("name", &c->model.name);
    sec.String("chat_template", &c->model.chat_template,
               {"auto", "llama3", "chatml", "mistral", "none"});
    sec.Int("max_model_len", &c->model.max_model_len, 16, 1 << 20);
  }
  {
    Section sec(v, top.Child("router"), "router");
    sec.String("host", &c->router.host);
    sec.Int("port", &c->router.port, 0, 65535);
    sec.String("policy", &c->router.policy, {"goodput", "least_loaded", "round_robin"});
    sec.Int("max_concurrent_requests", &c->router.max_concurrent_requests, 1, 1 << 20);
    sec.Int("max_body_bytes", &c->router.max_body_bytes, 1024, 1 << 30);
    sec.Double("request_timeout_s", &c->router.request_timeout_s, 0.001, 86400);
    sec.Int("http_threads", &c->router.http_threads, 1, 256);
    sec.String("latency_model", &c->router.latency_model);
  }
  ReadInstance(v, top.Child("prefill"), "prefill", &c->prefill);
  ReadInstance(v, top.Child("decode"), "decode", &c->decode);
  c->colocated.instances = 0;
  ReadInstance(v, top.Child("colocated"), "colocated", &c->colocated);
  {
    Section sec(v, top.Child("slo"), "slo");
    sec.Double("ttft_s", &c->slo.ttft_s, 1e-6, 3600);
    sec.Double("tpot_s", &c->slo.tpot_s, 1e-6, 3600);
    sec.Double("attainment_target", &c->slo.attainment_target, 0.0, 1.0);
    YAML::Node classes = sec.Child("classes");
    if (classes && !classes.IsNull()) {
      if (!classes.IsSequence()) {
        v->Error(classes, "slo.classes", "must be a list, got " + Describe(classes));
      } else {
        std::set<std::string> names;
        for (size_t i = 0; i < classes.size(); ++i) {
          std::string prefix = "slo.classes[" + std::to_string(i) + "]";
          SloClass cls{"", c->slo.ttft_s, c->slo.tpot_s};
          Section item(v, classes[i], prefix);
          item.String("name", &cls.name);
          item.Double("ttft_s", &cls.ttft_s, 1e-6, 3600);
          item.Double("tpot_s", &cls.tpot_s, 1e-6, 3600);
          if (cls.name.empty()) v->Error(classes[i], prefix + ".name", "is required");
          else if (!names.insert(cls.name).second)
            v->Error(classes[i], prefix + ".name", "duplicate class '" + cls.name + "'");
          c->slo.classes.push_back(cls);
        }
      }
    }
  }
  {
    Section sec(v, top.Child("kv_cache"), "kv_cache");
    sec.Int("block_size", &c->kv_cache.block_size, 1, 1024);
    if (c->kv_cache.block_size & (c->kv_cache.block_size - 1))
      v->Error(root["kv_cache"]["block_size"], "kv_cache.block_size", "must be a power of two");
  }
  {
    Section sec(v, top.Child("transfer"), "transfer");
    sec.String("backend", &c->transfer.backend, {"ucx", "nccl", "inproc"});
    sec.String("ucx_tls", &c->transfer.ucx_tls);
    sec.Double("timeout_s", &c->transfer.timeout_s, 0.001, 3600);
    sec.Int("max_inflight", &c->transfer.max_inflight, 1, 1 << 16);
    sec.Bool("layerwise", &c->transfer.layerwise);
  }
  {
    Section sec(v, top.Child("logging"), "logging");
    sec.String("level", &c->logging.level, {"debug", "info", "warn", "error"});
    sec.String("format", &c->logging.format, {"text", "json"});
  }
}

// Applies "a.b.c=value" onto the tree; returns the dotted keys it set.
Status ApplyOverrides(YAML::Node& root, const std::vector<std::string>& overrides,
                      std::set<std::string>* overridden) {
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
    if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
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
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return InvalidArgument(source_name + ":" + std::to_string(e.mark.line + 1) + ":" +
                           std::to_string(e.mark.column + 1) + ": invalid YAML: " + e.msg);
  }
  std::set<std::string> overridden;
  TANDEM_RETURN_IF_ERROR(ApplyOverrides(root, overrides, &overridden));
  ClusterConfig config;
  config.source = source_name;
  Validator validator(source_name, overridden);
  ReadConfig(&validator, root, &config);
  if (!validator.errors().empty()) {
    std::string message;
    for (const std::string& e : validator.errors()) message += (message.empty() ? "" : "\n") + e;
    return InvalidArgument(message);
  }
  return config;
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
    out << YAML::EndMap;
  };
  out << YAML::BeginMap;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "path" << YAML::Value << c.model.path;
  out << YAML::Key << "preset" << YAML::Value << c.model.preset;
  out << YAML::Key << "name" << YAML::Value << c.model.name;
  out << YAML::Key << "chat_template" << YAML::Value << c.model.chat_template;
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
  out << YAML::Key << "latency_model" << YAML::Value << c.router.latency_model;
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
  out << YAML::Key << "block_size" << YAML::Value << c.kv_cache.block_size << YAML::EndMap;
  out << YAML::Key << "transfer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "backend" << YAML::Value << c.transfer.backend;
  out << YAML::Key << "ucx_tls" << YAML::Value << c.transfer.ucx_tls;
  out << YAML::Key << "timeout_s" << YAML::Value << c.transfer.timeout_s;
  out << YAML::Key << "max_inflight" << YAML::Value << c.transfer.max_inflight;
  out << YAML::Key << "layerwise" << YAML::Value << c.transfer.layerwise << YAML::EndMap;
  out << YAML::Key << "logging" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "level" << YAML::Value << c.logging.level;
  out << YAML::Key << "format" << YAML::Value << c.logging.format << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace tandem
