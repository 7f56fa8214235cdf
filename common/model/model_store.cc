#include "common/model/model_store.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <system_error>

#include "common/base/log.h"
#include "common/model/gguf_checkpoint.h"
#include "common/model/make_model.h"
#include "common/model/packaged_model.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {

StatusOr<fs::path> CacheDir() {
  if (const char* dir = std::getenv("TANDEM_CACHE_DIR"); dir != nullptr && *dir != '\0')
    return fs::path(dir);
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0')
    return FailedPrecondition("neither TANDEM_CACHE_DIR nor HOME is set: no model cache");
  return fs::path(home) / ".cache" / "tandem";
}

}  // namespace

StatusOr<std::string> ResolveModelDir(const ModelSection& model) {
  if (!model.path.empty()) {
    std::error_code ec;
    if (IsGgufPath(model.path)) {
      if (!fs::is_regular_file(model.path, ec))
        return NotFound("model.path '" + model.path + "': no such file");
      return model.path;
    }
    if (fs::is_regular_file(model.path, ec))
      return InvalidArgument("model.path '" + model.path +
                             "' is a file but not a .gguf file (a Hugging Face checkpoint is the "
                             "directory holding config.json)");
    if (!fs::exists(fs::path(model.path) / "config.json", ec))
      return NotFound("model.path '" + model.path + "' has no config.json");
    return model.path;
  }
  if (const PackagedModel* packaged = FindPackagedModel(model.preset)) {
    return LocatePackagedModel(*packaged);
  }
  TANDEM_ASSIGN_OR_RETURN(fs::path cache, CacheDir());
  const fs::path models = cache / "models";
  const fs::path final_dir = models / (model.preset + "-llama");
  std::error_code ec;
  if (fs::exists(final_dir / "config.json", ec)) return final_dir.string();
  fs::create_directories(models, ec);
  if (ec) return Internal("cannot create " + models.string() + ": " + ec.message());

  std::random_device rd;
  const fs::path tmp = models / (".tmp-" + model.preset + "-" + std::to_string(getpid()) + "-" +
                                 std::to_string(rd()));
  TANDEM_LOG(kInfo) << "making the built-in '" << model.preset << "' model in " << final_dir
                    << " (first use)";
  MakeModelOptions options;
  options.preset = model.preset;
  if (Status made = MakeModel(options, tmp.string()); !made.ok()) {
    fs::remove_all(tmp, ec);
    return Internal("making the built-in model '" + model.preset + "' failed: " + made.message());
  }
  // rename(2) onto a missing directory is atomic; if another process won the race the target
  // exists (non-empty), the rename fails, and we use theirs.
  fs::rename(tmp, final_dir, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    if (!fs::exists(final_dir / "config.json", ignored))
      return Internal("cannot move the model into " + final_dir.string() + ": " + ec.message());
  }
  return final_dir.string();
}

std::string ServedModelName(const ModelSection& model) {
  if (!model.name.empty()) return model.name;
  if (model.path.empty()) {
    if (const PackagedModel* packaged = FindPackagedModel(model.preset)) {
      return std::string(packaged->served_name);
    }
    return "tandem-" + model.preset;
  }
  fs::path p = fs::path(model.path).lexically_normal();
  if (IsGgufPath(model.path)) {
    std::string stem = p.stem().string();
    std::transform(stem.begin(), stem.end(), stem.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    return stem;
  }
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

}  // namespace tandem
