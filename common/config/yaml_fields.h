// Validated reading of YAML files that people write by hand (the cluster config, latency models):
// every problem is collected, not just the first, and each message names where it is and which
// dotted field ("cluster.yaml:12:3: decode.max_batch_size: must be an integer in [1, 4096], got
// 'lots'"). Keys that nothing reads are errors ("unknown key"), and so is a key given twice in one
// mapping (yaml-cpp would keep one silently): a typo never passes silently.
//
//   YamlErrors errors("cluster.yaml");
//   {
//     YamlFields router(&errors, root["router"], "router");
//     router.Int("port", &config.port, 0, 65535);
//   }  // unknown keys of `router` are reported here
//   TANDEM_RETURN_IF_ERROR(errors.ToStatus());
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tandem {

// Parses YAML text; a syntax error is InvalidArgument "source:line:column: invalid YAML: ...".
StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& source);

// The shortest text that reads back as the same double (a written file round-trips exactly).
std::string YamlNumber(double value);

// "'value'" for a scalar, "a list", "a mapping", "nothing": how messages show what was found.
std::string DescribeYaml(const YAML::Node& node);

class YamlErrors {
 public:
  // `overridden`: dotted fields set by command-line flags; their errors say "flag --field"
  // instead of a file position.
  explicit YamlErrors(std::string source, std::set<std::string> overridden = {});

  void Add(const YAML::Node& node, const std::string& field, const std::string& what);
  // Where `field` was set: "flag --field", "source:line:column", or the source alone.
  std::string Where(const YAML::Node& node, const std::string& field) const;
  // Remembers where `field` was set (see locations()).
  void Record(const YAML::Node& node, const std::string& field);
  // Dotted field -> Where() of every field that a YamlFields reader found set.
  const std::map<std::string, std::string>& locations() const { return locations_; }
  const std::vector<std::string>& list() const { return errors_; }
  // OK, or InvalidArgument with every error, one per line.
  Status ToStatus() const;

 private:
  std::string source_;
  std::set<std::string> overridden_;
  std::vector<std::string> errors_;
  std::map<std::string, std::string> locations_;
};

// Reports every key that occurs twice in one mapping of `node` (recursively, lists included), at
// the second occurrence: "a.yaml:7:3: decode.threads: duplicate key (first at line 4)".
void ReportDuplicateKeys(YamlErrors* errors, const YAML::Node& node, const std::string& prefix);

// The fields of one mapping. Each reader leaves *out unchanged when the key is absent or null
// (and reports "is required" when `required`), and reports a value of the wrong type or range.
// The destructor reports the keys no reader asked for.
class YamlFields {
 public:
  // An absent or null node reads as an empty mapping, unless `must_exist` (then it is an error,
  // as is any node that is not a mapping).
  YamlFields(YamlErrors* errors, YAML::Node node, std::string prefix, bool must_exist = false);
  ~YamlFields();
  YamlFields(const YamlFields&) = delete;
  YamlFields& operator=(const YamlFields&) = delete;

  void Int(const char* key, int* out, long min, long max, bool required = false);
  // Finite numbers in [min, max]; pass +-infinity for an open end.
  void Double(const char* key, double* out, double min, double max, bool required = false);
  // YAML 1.2 booleans only (true/false), so that "yes" or "1" is reported, not guessed at.
  void Bool(const char* key, bool* out);
  // `allowed` empty = any string.
  void String(const char* key, std::string* out, const std::vector<std::string>& allowed = {},
              bool required = false);
  // A nested node (read it through another YamlFields), or an undefined node when absent.
  // A list of strings: a YAML sequence of scalars, or one scalar of comma-separated items (what a
  // --SECTION.KEY=a,b override gives).
  void StringList(const char* key, std::vector<std::string>* out);
  YAML::Node Child(const char* key, bool required = false);

  std::string Field(const std::string& key) const;
  // false when the node was not a mapping: nothing can be read from it.
  bool valid() const { return valid_; }

 private:
  YAML::Node Take(const char* key, bool required);

  YamlErrors* errors_;
  YAML::Node node_;
  std::string prefix_;
  std::set<std::string> seen_;
  bool valid_ = true;
};

}  // namespace tandem
