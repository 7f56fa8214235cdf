#include <catch2/catch.hpp>

#include "common/base/log.h"

using namespace tandem;

TEST_CASE("log: levels and formats parse with clear errors", "[log]") {
  CHECK(*ParseLogLevel("warn") == LogLevel::kWarn);
  CHECK(*ParseLogFormat("json") == LogFormat::kJson);
  CHECK(ParseLogLevel("loud").status().message() ==
        "log level must be debug|info|warn|error, got 'loud'");
}

TEST_CASE("log: level filter", "[log]") {
  SetLogLevel(LogLevel::kWarn);
  CHECK_FALSE(LogEnabled(LogLevel::kInfo));
  CHECK(LogEnabled(LogLevel::kError));
  SetLogLevel(LogLevel::kInfo);
  CHECK(LogEnabled(LogLevel::kInfo));
}

TEST_CASE("log: JSON escaping", "[log]") {
  CHECK(JsonEscape("a\"b\\c\nd\x01") == "a\\\"b\\\\c\\nd\\u0001");
}
