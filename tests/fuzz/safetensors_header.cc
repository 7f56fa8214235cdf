// Fuzzes safetensors parsing (common/model/safetensors.h SafetensorsReader::OpenFile) on the
// bytes of a whole file: the 8-byte header length, the JSON header and the data section. The
// reader maps files, so the input is written to a memfd and opened by its /proc/self/fd path.
// Properties: nothing crashes; every tensor of an accepted file lies inside the file, has as many
// bytes as its shape and dtype say, and converts to fp32 (ReadF32 with its own shape).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/model/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  static const int fd = memfd_create("fuzz.safetensors", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  FUZZ_CHECK(fd >= 0, "memfd_create failed");
  FUZZ_CHECK(ftruncate(fd, 0) == 0 && pwrite(fd, data, size, 0) == static_cast<ssize_t>(size),
             "writing the memfd failed");
  StatusOr<SafetensorsReader> reader = SafetensorsReader::OpenFile(path);
  if (!reader.ok()) return 0;
  for (const auto& [name, view] : reader->tensors()) {
    FUZZ_CHECK(view.NumElements() >= 0, "negative element count");
    FUZZ_CHECK(view.size_bytes == static_cast<size_t>(view.NumElements()) * DTypeSize(view.dtype),
               "size_bytes does not match shape and dtype");
    FUZZ_CHECK(view.size_bytes + 8 <= size, "a tensor larger than the file");
    if (view.size_bytes > (1u << 20)) continue;  // the bytes are in the input: it is small
    std::vector<float> out(static_cast<size_t>(view.NumElements()));
    FUZZ_CHECK(reader->ReadF32(name, view.shape, out).ok(), "ReadF32 of a listed tensor failed");
  }
  return 0;
}
