// API keys for the router's public HTTP API (`Authorization: Bearer <key>`).
//
// Where keys come from (LoadApiKeys), all of them valid together:
//   router.api_keys_file   one key per line; blank lines and lines starting with '#' are
//                          ignored, spaces around a key are trimmed. A relative path is relative
//                          to the config file's directory. The file must be readable and closed to
//                          group and others (mode & 077 == 0) and hold at least one key.
//   $TANDEM_API_KEYS       comma-separated keys (spaces trimmed, empty items ignored).
// With no key from either the API is open (the router warns once at start).
//
// Keys are held as SHA-256 digests and compared with CRYPTO_memcmp against every key, so the
// time a check takes says nothing about how much of a guess was right. Nothing here logs,
// counts or returns a key.
//
// Immutable once loaded; any thread.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/config/config.h"

namespace tandem {

// The environment variable with comma-separated keys.
inline constexpr char kApiKeysEnv[] = "TANDEM_API_KEYS";

// What a request's Authorization header says.
enum class ApiKeyCheck { kOk, kMissing, kInvalid };

class ApiKeys {
 public:
  ApiKeys() = default;  // no keys: every request passes
  explicit ApiKeys(const std::vector<std::string>& keys);

  bool empty() const { return digests_.empty(); }
  size_t size() const { return digests_.size(); }

  // Whether `key` is one of the keys, in time independent of which one and of how it differs.
  bool Contains(std::string_view key) const;

  // The value of an Authorization header ("" when absent): kOk for "Bearer <a key>" (scheme in
  // any case) or when there are no keys; kMissing when there is no bearer token; else kInvalid.
  ApiKeyCheck Check(std::string_view authorization) const;

 private:
  std::vector<std::array<unsigned char, 32>> digests_;
};

// The keys of a key file's text (see the top of this file).
std::vector<std::string> ParseApiKeyLines(std::string_view text);

// The keys of $TANDEM_API_KEYS' value (`value` may be null: unset).
std::vector<std::string> ParseApiKeyList(const char* value);

// router.api_keys_file as a path: absolute, or relative to the directory of config.source when
// that is a file ("" when unset).
std::string ApiKeysPath(const ClusterConfig& config);

// The keys of router.api_keys_file and of `env_value` ($TANDEM_API_KEYS; null when unset).
// InvalidArgument naming where the field was set, the field and the file when the file cannot be
// read, is open to group or others, or holds no key.
StatusOr<ApiKeys> LoadApiKeys(const ClusterConfig& config, const char* env_value);

}  // namespace tandem
