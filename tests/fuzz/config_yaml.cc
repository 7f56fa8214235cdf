// Fuzzes the YAML configuration (common/config/config.h ParseConfig, then
// common/config/serving_config.h ValidateForServing) on text, no file. Lines that start with
// "#! " are also passed as command-line overrides ("decode.max_batch_size=32"); YAML reads them
// as comments. Properties: nothing crashes or throws; an accepted config prints (ConfigToYaml)
// as YAML that parses again to a config that prints the same; serving validation of an accepted
// config returns a status.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "common/config/config.h"
#include "common/config/serving_config.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  if (size > 16 << 10) return 0;  // a config is small; longer inputs only slow the search
  std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("#! ", 0) == 0) overrides.push_back(line.substr(3));
  }
  StatusOr<ClusterConfig> config = ParseConfig(text, "fuzz.yaml", overrides);
  if (!config.ok()) {
    FUZZ_CHECK(!config.status().message().empty(), "a refused config without a message");
    return 0;
  }
  (void)ValidateForServing(*config);
  std::string printed = ConfigToYaml(*config);
  StatusOr<ClusterConfig> again = ParseConfig(printed, "printed.yaml");
  if (!again.ok()) std::fprintf(stderr, "%s\n---\n%s\n", again.status().ToString().c_str(), printed.c_str());
  FUZZ_CHECK(again.ok(), "the printed form of an accepted config is refused");
  FUZZ_CHECK(ConfigToYaml(*again) == printed, "print/parse is not a fixed point");
  return 0;
}
