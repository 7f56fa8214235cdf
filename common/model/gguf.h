// Reading GGUF files (llama.cpp's checkpoint format, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md),
// versions 2 and 3, little endian.
//
// Layout: magic "GGUF", uint32 version, uint64 tensor count, uint64 metadata count; the metadata
// (key string, uint32 value type, value); the tensor infos (name, uint32 n_dims, uint64 dims,
// uint32 ggml type, uint64 offset); padding to `general.alignment` (default 32); the data
// section, each tensor at its offset from the start of the section. Strings are uint64 length +
// bytes (no terminator). Dimension 0 is the contiguous one: a [rows, cols] matrix has dims
// {cols, rows}.
//
// GgufFile::Open maps the file read-only (RAII) and checks everything before handing anything
// out: a truncated file, a wrong magic, an unsupported version, an unknown value or tensor type,
// a count or length the file cannot hold, a duplicate key or tensor name, a dims product that
// overflows, a tensor outside the data section, misaligned or overlapping another is a DataLoss or
// InvalidArgument status whose message starts with the file's path and names the key or tensor.
// Nothing is allocated in proportion to a count before the file is known to hold that many
// bytes. Values and tensor data point into the mapping: they stay valid while the GgufFile lives.
// A GgufFile is immutable after Open; any thread may read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/model/safetensors.h"

namespace tandem {

// Metadata value types (gguf_type).
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint8", ..., "array"; "type N" for a value outside the enum.
std::string GgufValueTypeName(GgufValueType type);

// One metadata value: a scalar, a string, or a flat array of scalars or strings (GGUF allows
// nested arrays in principle; no writer emits them and llama.cpp refuses them, so do we).
class GgufValue {
 public:
  GgufValueType type() const { return type_; }
  // The element type of an array (meaningless otherwise).
  GgufValueType array_type() const { return array_type_; }
  bool is_array() const { return type_ == GgufValueType::kArray; }
  size_t array_size() const { return array_size_; }

  // The scalar as the asked-for kind; nullopt when the value is of another kind. AsInt accepts
  // every integer type (a uint64 above INT64_MAX is nullopt), AsFloat float32 and float64.
  std::optional<int64_t> AsInt() const;
  std::optional<double> AsFloat() const;
  std::optional<bool> AsBool() const;
  std::optional<std::string_view> AsString() const;

  // Element i (i < array_size()) of an array of that kind; nullopt as above.
  std::optional<int64_t> IntAt(size_t i) const;
  std::optional<double> FloatAt(size_t i) const;
  std::optional<std::string_view> StringAt(size_t i) const;

  // For people: 42, 1.5, true, "text" (escaped, cut after max_chars), [1, 2, ... (N items)].
  std::string ToString(size_t max_items = 8, size_t max_chars = 60) const;

 private:
  friend class GgufParser;
  GgufValueType type_ = GgufValueType::kUint8;
  GgufValueType array_type_ = GgufValueType::kUint8;
  size_t array_size_ = 0;
  const uint8_t* data_ = nullptr;             // the scalar, or the array's first element
  std::string_view string_;                   // a string scalar
  std::vector<std::string_view> strings_;     // a string array
};

// ggml tensor types (ggml_type); the ids are the file's.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15, kIQ2_XXS = 16,
  kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21, kIQ2_S = 22, kIQ4_XS = 23,
  kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kIQ1_M = 29, kBF16 = 30, kTQ1_0 = 34,
  kTQ2_0 = 35, kMXFP4 = 39,
};

struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;  // "Q4_K"
  uint32_t block_elements;  // elements per block (1 for plain types)
  uint32_t block_bytes;     // bytes per block
};

// The type's layout; nullptr for an id ggml does not define.
const GgmlTypeInfo* FindGgmlType(uint32_t id);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is contiguous
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;        // from the start of the data section
  uint64_t num_elements = 0;
  uint64_t size_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping; aligned to the file's alignment

  // Row-major shape, outermost first (dims reversed): what safetensors and PyTorch call shape.
  std::vector<int64_t> Shape() const;
};

class GgufFile {
 public:
  // Maps and checks PATH (see the header comment for what is checked). NotFound when it does
  // not exist.
  static StatusOr<GgufFile> Open(const std::string& path);
  // The same over bytes the caller keeps alive for the GgufFile's life (tests, fuzzing); `name`
  // stands for the path in messages.
  static StatusOr<GgufFile> FromBytes(const uint8_t* data, size_t size, std::string name);

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // where the data section starts
  uint64_t file_size() const { return size_; }

  // Metadata in file order, and by key.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* Find(std::string_view key) const;

  // Tensor infos in file order, and by name.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;

  // Typed metadata getters whose errors name the file and the key: "PATH: metadata key 'K'
  // is missing" / "... must be an integer, not string" / "... must be in [lo, hi]".
  // Optional ones return nullopt when the key is absent.
  StatusOr<int64_t> GetInt(std::string_view key, int64_t min_value, int64_t max_value) const;
  StatusOr<std::optional<int64_t>> GetOptionalInt(std::string_view key, int64_t min_value,
                                                  int64_t max_value) const;
  StatusOr<std::optional<double>> GetOptionalFloat(std::string_view key) const;
  StatusOr<std::optional<bool>> GetOptionalBool(std::string_view key) const;
  StatusOr<std::string> GetString(std::string_view key) const;
  StatusOr<std::optional<std::string>> GetOptionalString(std::string_view key) const;
  // InvalidArgument "PATH: metadata key 'K' WHAT".
  Status KeyError(std::string_view key, std::string_view what) const;

 private:
  friend class GgufParser;
  GgufFile() = default;

  std::unique_ptr<MappedFile> mapping_;  // null for FromBytes
  std::string path_;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace tandem
