#include "common/config/yaml_fields.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>

namespace tandem {
namespace {

std::string DescribeRange(double min, double max) {
  const bool has_min = std::isfinite(min), has_max = std::isfinite(max);
  if (has_min && has_max) return "a number in [" + YamlNumber(min) + ", " + YamlNumber(max) + "]";
  if (has_min) return "a number >= " + YamlNumber(min);
  if (has_max) return "a number <= " + YamlNumber(max);
  return "a number";
}

}  // namespace

std::string YamlNumber(double value) {
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  if (ec != std::errc()) return "0";
  return std::string(buffer, end);
}

StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return InvalidArgument(source + ":" + std::to_string(e.mark.line + 1) + ":" +
                           std::to_string(e.mark.column + 1) + ": invalid YAML: " + e.msg);
  }
}

std::string DescribeYaml(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

YamlErrors::YamlErrors(std::string source, std::set<std::string> overridden)
    : source_(std::move(source)), overridden_(std::move(overridden)) {}

std::string YamlErrors::Where(const YAML::Node& node, const std::string& field) const {
  if (overridden_.count(field)) return "flag --" + field;
  if (node.IsDefined() && !node.Mark().is_null())
    return source_ + ":" + std::to_string(node.Mark().line + 1) + ":" +
           std::to_string(node.Mark().column + 1);
  return source_;
}

void YamlErrors::Add(const YAML::Node& node, const std::string& field, const std::string& what) {
  errors_.push_back(Where(node, field) + ": " + field + ": " + what);
}

void YamlErrors::Record(const YAML::Node& node, const std::string& field) {
  locations_[field] = Where(node, field);
}

void ReportDuplicateKeys(YamlErrors* errors, const YAML::Node& node, const std::string& prefix) {
  auto join = [&prefix](const std::string& key) { return prefix.empty() ? key : prefix + "." + key; };
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i)
      ReportDuplicateKeys(errors, node[i], prefix + "[" + std::to_string(i) + "]");
    return;
  }
  if (!node.IsMap()) return;
  std::map<std::string, int> first_line;  // key -> line of its first occurrence (1-based)
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
    const int line = it->first.Mark().is_null() ? 0 : it->first.Mark().line + 1;
    auto [seen, inserted] = first_line.emplace(key, line);
    if (!inserted) {
      errors->Add(it->first, join(key),
                  "duplicate key" + (seen->second > 0
                                         ? " (first at line " + std::to_string(seen->second) + ")"
                                         : std::string()));
    }
    ReportDuplicateKeys(errors, it->second, join(key));
  }
}

Status YamlErrors::ToStatus() const {
  if (errors_.empty()) return Status::Ok();
  std::string message;
  for (const std::string& e : errors_) message += (message.empty() ? "" : "\n") + e;
  return InvalidArgument(message);
}

YamlFields::YamlFields(YamlErrors* errors, YAML::Node node, std::string prefix, bool must_exist)
    : errors_(errors), node_(std::move(node)), prefix_(std::move(prefix)) {
  const bool empty = !node_.IsDefined() || node_.IsNull();
  if ((empty && must_exist) || (!empty && !node_.IsMap())) {
    errors_->Add(node_, prefix_.empty() ? "<top level>" : prefix_,
                 "must be a mapping, got " + DescribeYaml(node_));
    valid_ = false;
  }
}

YamlFields::~YamlFields() {
  if (!valid_ || !node_.IsDefined() || !node_.IsMap()) return;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    std::string key = it->first.Scalar();
    if (!seen_.count(key)) errors_->Add(it->first, Field(key), "unknown key");
  }
}

std::string YamlFields::Field(const std::string& key) const {
  return prefix_.empty() ? key : prefix_ + "." + key;
}

YAML::Node YamlFields::Take(const char* key, bool required) {
  seen_.insert(key);
  if (!valid_) return YAML::Node(YAML::NodeType::Undefined);
  YAML::Node n = node_.IsMap() ? node_[key] : YAML::Node(YAML::NodeType::Undefined);
  if (!n.IsDefined() || n.IsNull()) {
    if (required) errors_->Add(node_, Field(key), "is required");
    return YAML::Node(YAML::NodeType::Undefined);
  }
  errors_->Record(n, Field(key));
  return n;
}

void YamlFields::Int(const char* key, int* out, long min, long max, bool required) {
  YAML::Node n = Take(key, required);
  if (!n) return;
  const std::string text = n.IsScalar() ? n.Scalar() : "";
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (!n.IsScalar() || text.empty() || *end != '\0' || value < min || value > max) {
    errors_->Add(n, Field(key),
                 "must be an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
                     "], got " + DescribeYaml(n));
    return;
  }
  *out = static_cast<int>(value);
}

void YamlFields::Double(const char* key, double* out, double min, double max, bool required) {
  YAML::Node n = Take(key, required);
  if (!n) return;
  const std::string text = n.IsScalar() ? n.Scalar() : "";
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (!n.IsScalar() || text.empty() || *end != '\0' || !std::isfinite(value) || value < min ||
      value > max) {
    errors_->Add(n, Field(key), "must be " + DescribeRange(min, max) + ", got " + DescribeYaml(n));
    return;
  }
  *out = value;
}

void YamlFields::Bool(const char* key, bool* out) {
  YAML::Node n = Take(key, false);
  if (!n) return;
  const std::string text = n.IsScalar() ? n.Scalar() : "";
  if (text != "true" && text != "false") {
    errors_->Add(n, Field(key), "must be true or false, got " + DescribeYaml(n));
    return;
  }
  *out = text == "true";
}

void YamlFields::String(const char* key, std::string* out,
                        const std::vector<std::string>& allowed, bool required) {
  YAML::Node n = Take(key, required);
  if (!n) return;
  if (!n.IsScalar()) {
    errors_->Add(n, Field(key), "must be a string, got " + DescribeYaml(n));
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
      errors_->Add(n, Field(key), "must be one of " + list + ", got " + DescribeYaml(n));
      return;
    }
  }
  *out = n.Scalar();
}

void YamlFields::StringList(const char* key, std::vector<std::string>* out) {
  YAML::Node n = Take(key, false);
  if (!n) return;
  std::vector<std::string> items;
  if (n.IsScalar()) {
    std::stringstream text(n.Scalar());
    for (std::string item; std::getline(text, item, ',');)
      if (!item.empty()) items.push_back(item);
  } else if (n.IsSequence()) {
    for (const YAML::Node& item : n) {
      if (!item.IsScalar()) {
        errors_->Add(item, Field(key), "must be a list of strings, got " + DescribeYaml(item));
        return;
      }
      items.push_back(item.Scalar());
    }
  } else {
    errors_->Add(n, Field(key), "must be a list of strings, got " + DescribeYaml(n));
    return;
  }
  *out = std::move(items);
}

YAML::Node YamlFields::Child(const char* key, bool required) { return Take(key, required); }

}  // namespace tandem
