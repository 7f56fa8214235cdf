#include "common/base/flags.h"

#include <charconv>
#include <cstdlib>
#include <sstream>

namespace tandem {
namespace {

bool ParseLong(const std::string& text, long* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end && !text.empty();
}

bool ParseDouble(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

}  // namespace

FlagParser::FlagParser(std::string usage, std::string summary)
    : usage_(std::move(usage)), summary_(std::move(summary)) {}

void FlagParser::AddString(const std::string& name, std::string default_value, std::string help) {
  flags_[name] = Flag{Kind::kString, std::move(default_value), std::move(help)};
  order_.push_back(name);
}

void FlagParser::AddInt(const std::string& name, long default_value, std::string help) {
  flags_[name] = Flag{Kind::kInt, std::to_string(default_value), std::move(help)};
  order_.push_back(name);
}

void FlagParser::AddDouble(const std::string& name, double default_value, std::string help) {
  std::ostringstream text;
  text << default_value;
  flags_[name] = Flag{Kind::kDouble, text.str(), std::move(help)};
  order_.push_back(name);
}

void FlagParser::AddBool(const std::string& name, std::string help) {
  flags_[name] = Flag{Kind::kBool, "false", std::move(help)};
  order_.push_back(name);
}

Status FlagParser::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      positional_.insert(positional_.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (name == "help" || name == "h") {
      help_requested_ = true;
      continue;
    }
    if (name.find('.') != std::string::npos && allow_overrides_) {
      if (!has_value) {
        if (i + 1 >= args.size()) return InvalidArgument("flag --" + name + " needs a value");
        value = args[++i];
      }
      overrides_.push_back(name + "=" + value);
      continue;
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) return InvalidArgument("unknown flag --" + name);
    Flag& flag = it->second;
    if (flag.kind == Kind::kBool) {
      if (!has_value) value = "true";
      if (value != "true" && value != "false")
        return InvalidArgument("flag --" + name + " takes true or false, got '" + value + "'");
    } else if (!has_value) {
      if (i + 1 >= args.size()) return InvalidArgument("flag --" + name + " needs a value");
      value = args[++i];
    }
    long as_long;
    double as_double;
    if (flag.kind == Kind::kInt && !ParseLong(value, &as_long))
      return InvalidArgument("flag --" + name + " takes an integer, got '" + value + "'");
    if (flag.kind == Kind::kDouble && !ParseDouble(value, &as_double))
      return InvalidArgument("flag --" + name + " takes a number, got '" + value + "'");
    flag.value = value;
    flag.set = true;
  }
  return Status::Ok();
}

std::string FlagParser::Help() const {
  std::ostringstream out;
  out << "usage: " << usage_ << "\n\n" << summary_ << "\n";
  if (!order_.empty()) out << "\nflags:\n";
  for (const std::string& name : order_) {
    const Flag& flag = flags_.at(name);
    std::string left = "  --";
    left += name;
    if (flag.kind != Kind::kBool) left += flag.kind == Kind::kString ? "=STR" : "=N";
    out << left;
    out << std::string(left.size() < 30 ? 30 - left.size() : 1, ' ') << flag.help;
    if (flag.kind != Kind::kBool && !flag.value.empty()) out << " (default " << flag.value << ")";
    out << "\n";
  }
  if (allow_overrides_)
    out << "  --SECTION.KEY=VALUE          override any config field, e.g. "
           "--decode.max_batch_size=32\n";
  out << "  --help                       show this help\n";
  return out.str();
}

const FlagParser::Flag& FlagParser::Find(const std::string& name, Kind kind) const {
  auto it = flags_.find(name);
  TANDEM_CHECK(it != flags_.end(), "flag --" + name + " was never declared");
  TANDEM_CHECK(it->second.kind == kind, "flag --" + name + " read as the wrong type");
  return it->second;
}

const std::string& FlagParser::GetString(const std::string& name) const {
  return Find(name, Kind::kString).value;
}
long FlagParser::GetInt(const std::string& name) const {
  return std::strtol(Find(name, Kind::kInt).value.c_str(), nullptr, 10);
}
double FlagParser::GetDouble(const std::string& name) const {
  return std::strtod(Find(name, Kind::kDouble).value.c_str(), nullptr);
}
bool FlagParser::GetBool(const std::string& name) const {
  return Find(name, Kind::kBool).value == "true";
}
bool FlagParser::IsSet(const std::string& name) const {
  auto it = flags_.find(name);
  return it != flags_.end() && it->second.set;
}

}  // namespace tandem
