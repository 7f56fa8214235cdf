#include "router/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/config/serving_config.h"

namespace tandem {
namespace {

constexpr char kField[] = "router.api_keys_file";

std::string_view Trim(std::string_view s) {
  const char* space = " \t\r\n\v\f";
  size_t begin = s.find_first_not_of(space);
  if (begin == std::string_view::npos) return {};
  size_t end = s.find_last_not_of(space);
  return s.substr(begin, end - begin + 1);
}

std::array<unsigned char, 32> Digest(std::string_view key) {
  std::array<unsigned char, 32> out{};
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), out.data());
  return out;
}

// "<where>: router.api_keys_file: <path>: <what>", as config errors read.
Status FileError(const ClusterConfig& config, const std::string& path, const std::string& what) {
  return InvalidArgument(config.Where(kField) + ": " + kField + ": " + path + ": " + what);
}

StatusOr<std::vector<std::string>> ReadKeyFile(const ClusterConfig& config,
                                               const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return FileError(config, path, std::string("cannot be read: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return FileError(config, path, "is not a regular file");
  // Like ssh with a private key: a key file others can read is not secret any more.
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return FileError(config, path,
                     std::string("is open to group or others (mode ") + mode +
                         "); make it private: chmod 600 " + path);
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return FileError(config, path, std::string("cannot be read: ") + std::strerror(errno));
  std::vector<std::string> keys = ParseApiKeyLines(text.str());
  if (keys.empty()) return FileError(config, path, "holds no key (one key per line)");
  return keys;
}

}  // namespace

ApiKeys::ApiKeys(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) digests_.push_back(Digest(key));
}

bool ApiKeys::Contains(std::string_view key) const {
  const std::array<unsigned char, 32> digest = Digest(key);
  // Every key is compared, and in constant time: no early exit to time.
  int found = 0;
  for (const auto& d : digests_) found |= CRYPTO_memcmp(d.data(), digest.data(), d.size()) == 0;
  return found != 0;
}

ApiKeyCheck ApiKeys::Check(std::string_view authorization) const {
  if (empty()) return ApiKeyCheck::kOk;
  std::string_view value = Trim(authorization);
  constexpr std::string_view kScheme = "bearer";
  if (value.size() <= kScheme.size()) return ApiKeyCheck::kMissing;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i])
      return ApiKeyCheck::kMissing;
  }
  if (value[kScheme.size()] != ' ' && value[kScheme.size()] != '\t') return ApiKeyCheck::kMissing;
  std::string_view key = Trim(value.substr(kScheme.size()));
  if (key.empty()) return ApiKeyCheck::kMissing;
  return Contains(key) ? ApiKeyCheck::kOk : ApiKeyCheck::kInvalid;
}

std::vector<std::string> ParseApiKeyLines(std::string_view text) {
  std::vector<std::string> keys;
  while (!text.empty()) {
    size_t end = text.find('\n');
    std::string_view line = Trim(text.substr(0, end));
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (!line.empty() && line[0] != '#') keys.emplace_back(line);
  }
  return keys;
}

std::vector<std::string> ParseApiKeyList(const char* value) {
  std::vector<std::string> keys;
  if (value == nullptr) return keys;
  std::string_view rest(value);
  while (true) {
    size_t comma = rest.find(',');
    std::string_view key = Trim(rest.substr(0, comma));
    if (!key.empty()) keys.emplace_back(key);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return keys;
}

std::string ApiKeysPath(const ClusterConfig& config) {
  // As router.latency_model: relative to the config file, when there is one.
  return ConfigRelativePath(config, config.router.api_keys_file);
}

StatusOr<ApiKeys> LoadApiKeys(const ClusterConfig& config, const char* env_value) {
  std::vector<std::string> keys = ParseApiKeyList(env_value);
  if (!config.router.api_keys_file.empty()) {
    StatusOr<std::vector<std::string>> from_file = ReadKeyFile(config, ApiKeysPath(config));
    if (!from_file.ok()) return from_file.status();
    keys.insert(keys.end(), from_file->begin(), from_file->end());
  }
  return ApiKeys(keys);
}

}  // namespace tandem
