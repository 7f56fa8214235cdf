// Reading and writing safetensors checkpoints (https://github.com/huggingface/safetensors).
//
// File format: an 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the byte buffer; offsets are relative to the start of the buffer.
//
// SafetensorsReader maps the files read-only (mmap) and checks every header entry against the
// file before handing out a pointer: a truncated or malformed file is a DataLoss/InvalidArgument
// status naming the file and the tensor, never a crash. The reader owns its mappings (RAII);
// TensorView pointers stay valid while the reader lives. A reader is immutable after Open, so
// any thread may read from it concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/model/tensor_source.h"

namespace tandem {

enum class DType { kF32, kF16, kBF16 };

std::string_view DTypeName(DType dtype);  // "F32", "F16", "BF16"
size_t DTypeSize(DType dtype);

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping; not aligned in general
  size_t size_bytes = 0;
  std::string file;  // the file holding it (for error messages)

  int64_t NumElements() const;
};

// "[2048, 64]"
std::string ShapeToString(std::span<const int64_t> shape);

// One memory-mapped file. Owns the fd and the mapping; movable, not copyable.
class MappedFile {
 public:
  static StatusOr<MappedFile> Open(const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  void Reset();

  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

class SafetensorsReader : public TensorSource {
 public:
  // Opens DIR/model.safetensors, or the shards listed in DIR/model.safetensors.index.json.
  static StatusOr<SafetensorsReader> OpenDir(const std::string& dir);
  // Opens one .safetensors file.
  static StatusOr<SafetensorsReader> OpenFile(const std::string& path);

  // nullptr when absent.
  const TensorView* Find(const std::string& name) const;
  bool Has(const std::string& name) const override { return Find(name) != nullptr; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }

  // Converts tensor `name` to fp32 into `out` after checking that it exists and has exactly
  // `expected_shape`. Errors name the tensor, its file, and the expected and actual shapes.
  Status ReadF32(const std::string& name, std::span<const int64_t> expected_shape,
                 std::span<float> out) const override;

 private:
  Status AddFile(const std::string& path, const std::vector<std::string>* only_names);

  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

// Converts `count` elements of `dtype` at `src` (any alignment, little endian) to fp32.
void ConvertToF32(DType dtype, const uint8_t* src, size_t count, float* dst);
// fp32 -> bf16 / f16 with round-to-nearest-even (what torch does).
uint16_t F32ToBF16(float x);
uint16_t F32ToF16(float x);

struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> data;  // fp32 source; converted to `dtype` on write
  DType dtype = DType::kF32;
};

// Writes one safetensors file with metadata {"format": "pt"} (transformers requires it),
// tensors in the given order. Internal names the path on an I/O error.
Status WriteSafetensors(const std::string& path, std::span<const TensorToWrite> tensors);

}  // namespace tandem
