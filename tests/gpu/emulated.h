// Whether the GPU checks run on the CUDA emulator (tests/cuda_emu), which runs them on the CPU
// in CI: there they take smaller sizes (a fiber per GPU thread is slow) and skip their timings,
// which would time the emulator. The emulator names its one device so.
#pragma once

#include <string>

#include "common/engine/cuda/cuda_util.h"

namespace tandem::cuda {

inline bool Emulated() {
  StatusOr<std::string> name = DeviceName();
  return name.ok() && name->rfind("CUDA emulator", 0) == 0;
}

}  // namespace tandem::cuda
