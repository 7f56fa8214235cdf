// Command-line flags for `tandem` subcommands.
//
// Flags are "--name=value", "--name value", or "--name" for booleans. A flag whose name contains
// a dot ("--decode.max_batch_size=32") is a config override: it is collected, not declared, and
// handed to LoadConfig, which validates it like a YAML field. Any other undeclared flag is an
// error (exit code 2 by convention). "--help" is always accepted.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tandem {

class FlagParser {
 public:
  // `usage` is the first help line, e.g. "tandem make-model [flags]".
  FlagParser(std::string usage, std::string summary);

  void AddString(const std::string& name, std::string default_value, std::string help);
  void AddInt(const std::string& name, long default_value, std::string help);
  void AddDouble(const std::string& name, double default_value, std::string help);
  void AddBool(const std::string& name, std::string help);  // defaults to false
  // Accept config overrides ("--section.key=value").
  void AllowConfigOverrides() { allow_overrides_ = true; }

  // Parses args (without the program and subcommand names). Returns InvalidArgument naming
  // the flag on an unknown flag, a missing value, or a value of the wrong type.
  Status Parse(const std::vector<std::string>& args);

  bool help_requested() const { return help_requested_; }
  std::string Help() const;

  const std::string& GetString(const std::string& name) const;
  long GetInt(const std::string& name) const;
  double GetDouble(const std::string& name) const;
  bool GetBool(const std::string& name) const;
  // True when the flag was given on the command line (not just defaulted).
  bool IsSet(const std::string& name) const;

  const std::vector<std::string>& positional() const { return positional_; }
  const std::vector<std::string>& config_overrides() const { return overrides_; }

 private:
  enum class Kind { kString, kInt, kDouble, kBool };
  struct Flag {
    Kind kind;
    std::string value;
    std::string help;
    bool set = false;
  };
  const Flag& Find(const std::string& name, Kind kind) const;

  std::string usage_;
  std::string summary_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
  std::vector<std::string> positional_;
  std::vector<std::string> overrides_;
  bool allow_overrides_ = false;
  bool help_requested_ = false;
};

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

}  // namespace tandem
