// Fuzzes a checkpoint's config.json and generation_config.json parsing
// (common/model/model_config.h ParseModelConfig, ParseGenerationConfig) on text. Properties:
// nothing crashes or throws; an accepted config.json prints (ModelConfigToJson, what make-model
// writes) as JSON that parses again to a config that prints the same.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/model/model_config.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)ParseGenerationConfig(text, "generation_config.json");
  StatusOr<ModelConfig> config = ParseModelConfig(text, "config.json");
  if (!config.ok()) return 0;
  (void)config->NumParameters();
  std::string printed = ModelConfigToJson(*config);
  StatusOr<ModelConfig> again = ParseModelConfig(printed, "printed.json");
  if (!again.ok()) std::fprintf(stderr, "%s\n", again.status().ToString().c_str());
  FUZZ_CHECK(again.ok(), "the printed form of an accepted config.json is refused");
  FUZZ_CHECK(ModelConfigToJson(*again) == printed, "print/parse is not a fixed point");
  return 0;
}
