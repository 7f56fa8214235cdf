// The CUDA runtime and device-side constructs, as the CUDA emulator provides them.
#pragma once

#include "cuda_emu.h"
#include "cuda_runtime_api.h"
