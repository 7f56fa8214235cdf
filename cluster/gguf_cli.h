// `tandem gguf FILE`: what a GGUF file holds (version, metadata, tensor table) and whether Tandem
// can serve it (the model config it reads, or the reason it cannot); `--tensor NAME --out PATH`
// writes one tensor dequantized to fp32 (little endian, row-major, GGUF row order) for tools.
#pragma once

#include <string>
#include <vector>

namespace tandem {

// Entry point of the subcommand; args exclude "tandem gguf". Returns a process exit code.
int GgufMain(const std::vector<std::string>& args);

}  // namespace tandem
