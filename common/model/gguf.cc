#include "common/model/gguf.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

namespace tandem {
namespace {

constexpr uint32_t kMaxDims = 4;             // GGML_MAX_DIMS
constexpr uint64_t kMaxKeyBytes = 65535;     // no real key comes near
constexpr uint64_t kMaxTensorNameBytes = 255;
constexpr uint64_t kMaxAlignment = 1u << 20;
constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();

constexpr GgmlTypeInfo kGgmlTypes[] = {
    {GgmlType::kF32, "F32", 1, 4},          {GgmlType::kF16, "F16", 1, 2},
    {GgmlType::kQ4_0, "Q4_0", 32, 18},      {GgmlType::kQ4_1, "Q4_1", 32, 20},
    {GgmlType::kQ5_0, "Q5_0", 32, 22},      {GgmlType::kQ5_1, "Q5_1", 32, 24},
    {GgmlType::kQ8_0, "Q8_0", 32, 34},      {GgmlType::kQ8_1, "Q8_1", 32, 40},
    {GgmlType::kQ2_K, "Q2_K", 256, 84},     {GgmlType::kQ3_K, "Q3_K", 256, 110},
    {GgmlType::kQ4_K, "Q4_K", 256, 144},    {GgmlType::kQ5_K, "Q5_K", 256, 176},
    {GgmlType::kQ6_K, "Q6_K", 256, 210},    {GgmlType::kQ8_K, "Q8_K", 256, 292},
    {GgmlType::kIQ2_XXS, "IQ2_XXS", 256, 66}, {GgmlType::kIQ2_XS, "IQ2_XS", 256, 74},
    {GgmlType::kIQ3_XXS, "IQ3_XXS", 256, 98}, {GgmlType::kIQ1_S, "IQ1_S", 256, 50},
    {GgmlType::kIQ4_NL, "IQ4_NL", 32, 18},  {GgmlType::kIQ3_S, "IQ3_S", 256, 110},
    {GgmlType::kIQ2_S, "IQ2_S", 256, 82},   {GgmlType::kIQ4_XS, "IQ4_XS", 256, 136},
    {GgmlType::kI8, "I8", 1, 1},            {GgmlType::kI16, "I16", 1, 2},
    {GgmlType::kI32, "I32", 1, 4},          {GgmlType::kI64, "I64", 1, 8},
    {GgmlType::kF64, "F64", 1, 8},          {GgmlType::kIQ1_M, "IQ1_M", 256, 56},
    {GgmlType::kBF16, "BF16", 1, 2},        {GgmlType::kTQ1_0, "TQ1_0", 256, 54},
    {GgmlType::kTQ2_0, "TQ2_0", 256, 66},   {GgmlType::kMXFP4, "MXFP4", 32, 17},
};

// Bytes of one scalar of a fixed-size type; 0 for string and array.
size_t ScalarBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64: return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray: return 0;
  }
  return 0;
}

bool KnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // the host is little endian, as the file (checked at build)
  return v;
}
static_assert(std::endian::native == std::endian::little, "GGUF reading assumes little endian");

std::optional<int64_t> IntAtPointer(GgufValueType type, const uint8_t* p) {
  switch (type) {
    case GgufValueType::kUint8: return Load<uint8_t>(p);
    case GgufValueType::kInt8: return Load<int8_t>(p);
    case GgufValueType::kUint16: return Load<uint16_t>(p);
    case GgufValueType::kInt16: return Load<int16_t>(p);
    case GgufValueType::kUint32: return Load<uint32_t>(p);
    case GgufValueType::kInt32: return Load<int32_t>(p);
    case GgufValueType::kInt64: return Load<int64_t>(p);
    case GgufValueType::kUint64: {
      uint64_t v = Load<uint64_t>(p);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(v);
    }
    default: return std::nullopt;
  }
}

std::optional<double> FloatAtPointer(GgufValueType type, const uint8_t* p) {
  if (type == GgufValueType::kFloat32) return Load<float>(p);
  if (type == GgufValueType::kFloat64) return Load<double>(p);
  return std::nullopt;
}

std::string Quote(std::string_view s, size_t max_chars) {
  std::string out = "\"";
  size_t n = 0;
  for (char c : s) {
    if (n++ == max_chars) {
      out += "...";
      break;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string FormatScalar(GgufValueType type, const uint8_t* p) {
  if (type == GgufValueType::kBool) return Load<uint8_t>(p) ? "true" : "false";
  if (auto f = FloatAtPointer(type, p)) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.9g", *f);
    return buf;
  }
  if (type == GgufValueType::kUint64) return std::to_string(Load<uint64_t>(p));
  if (auto i = IntAtPointer(type, p)) return std::to_string(*i);
  return "?";
}

}  // namespace

std::string GgufValueTypeName(GgufValueType type) {
  static const char* const kNames[] = {"uint8", "int8",  "uint16", "int16",  "uint32",
                                       "int32", "float32", "bool", "string", "array",
                                       "uint64", "int64", "float64"};
  const uint32_t t = static_cast<uint32_t>(type);
  if (t < std::size(kNames)) return kNames[t];
  return "type " + std::to_string(t);
}

const GgmlTypeInfo* FindGgmlType(uint32_t id) {
  for (const GgmlTypeInfo& info : kGgmlTypes) {
    if (static_cast<uint32_t>(info.type) == id) return &info;
  }
  return nullptr;
}

std::optional<int64_t> GgufValue::AsInt() const {
  if (is_array() || type_ == GgufValueType::kString) return std::nullopt;
  return IntAtPointer(type_, data_);
}
std::optional<double> GgufValue::AsFloat() const {
  if (is_array()) return std::nullopt;
  return FloatAtPointer(type_, data_);
}
std::optional<bool> GgufValue::AsBool() const {
  if (type_ != GgufValueType::kBool) return std::nullopt;
  return Load<uint8_t>(data_) != 0;
}
std::optional<std::string_view> GgufValue::AsString() const {
  if (type_ != GgufValueType::kString) return std::nullopt;
  return string_;
}
std::optional<int64_t> GgufValue::IntAt(size_t i) const {
  if (!is_array() || i >= array_size_ || ScalarBytes(array_type_) == 0) return std::nullopt;
  return IntAtPointer(array_type_, data_ + i * ScalarBytes(array_type_));
}
std::optional<double> GgufValue::FloatAt(size_t i) const {
  if (!is_array() || i >= array_size_ || ScalarBytes(array_type_) == 0) return std::nullopt;
  return FloatAtPointer(array_type_, data_ + i * ScalarBytes(array_type_));
}
std::optional<std::string_view> GgufValue::StringAt(size_t i) const {
  if (!is_array() || array_type_ != GgufValueType::kString || i >= strings_.size())
    return std::nullopt;
  return strings_[i];
}

std::string GgufValue::ToString(size_t max_items, size_t max_chars) const {
  if (type_ == GgufValueType::kString) return Quote(string_, max_chars);
  if (!is_array()) return FormatScalar(type_, data_);
  std::string out = "[";
  for (size_t i = 0; i < array_size_ && i < max_items; ++i) {
    if (i > 0) out += ", ";
    out += array_type_ == GgufValueType::kString
               ? Quote(strings_[i], max_chars)
               : FormatScalar(array_type_, data_ + i * ScalarBytes(array_type_));
  }
  if (array_size_ > max_items) out += ", ...";
  return out + "] (" + std::to_string(array_size_) + " " + GgufValueTypeName(array_type_) +
         (array_size_ == 1 ? ")" : "s)");
}

std::vector<int64_t> GgufTensorInfo::Shape() const { return {dims.rbegin(), dims.rend()}; }

// Reads the file front to back. Every read checks the bytes left first; every count is checked
// against the bytes left (times the least an item can take) before anything is reserved.
class GgufParser {
 public:
  GgufParser(const uint8_t* data, size_t size, GgufFile* out)
      : data_(data), size_(size), out_(out) {}

  Status Parse() {
    const std::string& path = out_->path_;
    if (size_ < 4) return Truncated("the magic");
    if (std::memcmp(data_, "GGUF", 4) != 0) {
      std::string magic;
      for (int i = 0; i < 4; ++i) {
        const unsigned char c = data_[i];
        if (c >= 0x20 && c < 0x7f) {
          magic += static_cast<char>(c);
        } else {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", c);
          magic += buf;
        }
      }
      return InvalidArgument(path + ": not a GGUF file (magic '" + magic + "', expected 'GGUF')");
    }
    pos_ = 4;
    uint32_t version = 0;
    TANDEM_RETURN_IF_ERROR(ReadU32("the version", &version));
    if (version != 2 && version != 3) {
      std::string why = version == 1 ? " (version 1 files predate 64-bit counts; convert again)"
                        : (version & 0xffff) == 0 ? " (a big-endian file?)"
                                                  : "";
      return InvalidArgument(path + ": GGUF version " + std::to_string(version) +
                             " is not supported (supported: 2, 3)" + why);
    }
    out_->version_ = version;
    uint64_t tensor_count = 0, kv_count = 0;
    TANDEM_RETURN_IF_ERROR(ReadU64("the tensor count", &tensor_count));
    TANDEM_RETURN_IF_ERROR(ReadU64("the metadata count", &kv_count));
    // A metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at
    // least 8 + 4 + 4 + 8.
    if (kv_count > Left() / 13)
      return DataLoss(path + ": metadata count " + std::to_string(kv_count) +
                      " is more than the file's " + std::to_string(size_) + " bytes can hold");
    if (tensor_count > Left() / 24)
      return DataLoss(path + ": tensor count " + std::to_string(tensor_count) +
                      " is more than the file's " + std::to_string(size_) + " bytes can hold");

    out_->metadata_.reserve(kv_count);
    for (uint64_t i = 0; i < kv_count; ++i) TANDEM_RETURN_IF_ERROR(ParseKeyValue(i));
    TANDEM_RETURN_IF_ERROR(ParseAlignment());

    out_->tensors_.reserve(tensor_count);
    for (uint64_t i = 0; i < tensor_count; ++i) TANDEM_RETURN_IF_ERROR(ParseTensorInfo(i));

    const uint64_t align = out_->alignment_;
    const uint64_t data_offset = (pos_ + align - 1) / align * align;
    if (data_offset > size_ && !out_->tensors_.empty())
      return DataLoss(path + ": truncated: the data section would start at byte " +
                      std::to_string(data_offset) + ", past the end of the file (" +
                      std::to_string(size_) + " bytes)");
    out_->data_offset_ = data_offset;
    return CheckTensorPlacement();
  }

 private:
  uint64_t Left() const { return size_ - pos_; }

  Status Truncated(const std::string& what) const {
    return DataLoss(out_->path_ + ": truncated: " + what + " at byte " + std::to_string(pos_) +
                    " runs past the end of the file (" + std::to_string(size_) + " bytes)");
  }

  Status ReadBytes(const std::string& what, uint64_t n, const uint8_t** out) {
    if (n > Left()) return Truncated(what);
    *out = data_ + pos_;
    pos_ += n;
    return Status::Ok();
  }
  Status ReadU32(const std::string& what, uint32_t* out) {
    const uint8_t* p = nullptr;
    TANDEM_RETURN_IF_ERROR(ReadBytes(what, 4, &p));
    *out = Load<uint32_t>(p);
    return Status::Ok();
  }
  Status ReadU64(const std::string& what, uint64_t* out) {
    const uint8_t* p = nullptr;
    TANDEM_RETURN_IF_ERROR(ReadBytes(what, 8, &p));
    *out = Load<uint64_t>(p);
    return Status::Ok();
  }
  // `max_bytes` bounds names and keys; values are bounded by the file alone.
  Status ReadString(const std::string& what, uint64_t max_bytes, std::string_view* out) {
    uint64_t len = 0;
    TANDEM_RETURN_IF_ERROR(ReadU64("the length of " + what, &len));
    if (len > max_bytes)
      return DataLoss(out_->path_ + ": " + what + " has an implausible length " +
                      std::to_string(len) + " (at most " + std::to_string(max_bytes) + ")");
    const uint8_t* p = nullptr;
    TANDEM_RETURN_IF_ERROR(ReadBytes(what + " (" + std::to_string(len) + " bytes)", len, &p));
    *out = std::string_view(reinterpret_cast<const char*>(p), len);
    return Status::Ok();
  }

  Status ParseKeyValue(uint64_t index) {
    const std::string& path = out_->path_;
    std::string_view key;
    TANDEM_RETURN_IF_ERROR(ReadString("the key of metadata entry " + std::to_string(index),
                                      kMaxKeyBytes, &key));
    const std::string where = "metadata key '" + std::string(key) + "'";
    if (out_->metadata_index_.count(key) != 0)
      return InvalidArgument(path + ": " + where + " appears twice");
    uint32_t type = 0;
    TANDEM_RETURN_IF_ERROR(ReadU32("the type of " + where, &type));
    if (!KnownValueType(type))
      return InvalidArgument(path + ": " + where + " has unknown value type " +
                             std::to_string(type));
    GgufValue value;
    value.type_ = static_cast<GgufValueType>(type);
    if (value.type_ == GgufValueType::kArray) {
      uint32_t elem = 0;
      TANDEM_RETURN_IF_ERROR(ReadU32("the array element type of " + where, &elem));
      if (!KnownValueType(elem))
        return InvalidArgument(path + ": " + where + " is an array of unknown value type " +
                               std::to_string(elem));
      if (elem == static_cast<uint32_t>(GgufValueType::kArray))
        return InvalidArgument(path + ": " + where +
                               " is an array of arrays, which is not supported");
      value.array_type_ = static_cast<GgufValueType>(elem);
      uint64_t count = 0;
      TANDEM_RETURN_IF_ERROR(ReadU64("the array length of " + where, &count));
      const size_t elem_bytes = ScalarBytes(value.array_type_);
      const uint64_t least = elem_bytes == 0 ? 8 : elem_bytes;  // a string: its length at least
      if (count > Left() / least)
        return DataLoss(path + ": " + where + " is an array of " + std::to_string(count) + " " +
                        GgufValueTypeName(value.array_type_) +
                        "s, more than the rest of the file can hold");
      value.array_size_ = count;
      value.data_ = data_ + pos_;
      if (elem_bytes > 0) {
        pos_ += count * elem_bytes;  // fits: checked above
      } else {
        value.strings_.reserve(count);
        for (uint64_t i = 0; i < count; ++i) {
          std::string_view s;
          TANDEM_RETURN_IF_ERROR(
              ReadString("item " + std::to_string(i) + " of " + where, kNoLimit, &s));
          value.strings_.push_back(s);
        }
      }
    } else if (value.type_ == GgufValueType::kString) {
      TANDEM_RETURN_IF_ERROR(ReadString("the value of " + where, kNoLimit, &value.string_));
    } else {
      TANDEM_RETURN_IF_ERROR(ReadBytes("the value of " + where, ScalarBytes(value.type_),
                                       &value.data_));
      if (value.type_ == GgufValueType::kBool && *value.data_ > 1)
        return InvalidArgument(path + ": " + where + " is a bool of value " +
                               std::to_string(*value.data_) + " (must be 0 or 1)");
    }
    out_->metadata_index_.emplace(std::string(key), out_->metadata_.size());
    out_->metadata_.emplace_back(std::string(key), std::move(value));
    return Status::Ok();
  }

  Status ParseAlignment() {
    const GgufValue* v = out_->Find("general.alignment");
    if (v == nullptr) return Status::Ok();
    std::optional<int64_t> a = v->type() == GgufValueType::kUint32 ? v->AsInt() : std::nullopt;
    if (!a) return out_->KeyError("general.alignment", "must be a uint32, not " +
                                                           GgufValueTypeName(v->type()));
    if (*a == 0 || (*a & (*a - 1)) != 0 || static_cast<uint64_t>(*a) > kMaxAlignment)
      return out_->KeyError("general.alignment", "is " + std::to_string(*a) +
                                                     "; it must be a power of two up to " +
                                                     std::to_string(kMaxAlignment));
    out_->alignment_ = static_cast<uint64_t>(*a);
    return Status::Ok();
  }

  Status ParseTensorInfo(uint64_t index) {
    const std::string& path = out_->path_;
    std::string_view name;
    TANDEM_RETURN_IF_ERROR(ReadString("the name of tensor " + std::to_string(index),
                                      kMaxTensorNameBytes, &name));
    const std::string where = "tensor '" + std::string(name) + "'";
    if (out_->tensor_index_.count(name) != 0)
      return InvalidArgument(path + ": " + where + " appears twice");
    GgufTensorInfo t;
    t.name = std::string(name);
    uint32_t n_dims = 0;
    TANDEM_RETURN_IF_ERROR(ReadU32("the number of dimensions of " + where, &n_dims));
    if (n_dims > kMaxDims)
      return InvalidArgument(path + ": " + where + " has " + std::to_string(n_dims) +
                             " dimensions (at most " + std::to_string(kMaxDims) + ")");
    uint64_t elements = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      TANDEM_RETURN_IF_ERROR(ReadU64("dimension " + std::to_string(d) + " of " + where, &dim));
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return InvalidArgument(path + ": " + where + " has dimension " + std::to_string(d) +
                               " = " + std::to_string(dim) + ", too large");
      t.dims.push_back(static_cast<int64_t>(dim));
      if (dim != 0 && elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / dim)
        overflow = true;
      elements *= dim;
    }
    if (overflow)
      return InvalidArgument(path + ": " + where + " has dims " + DimsToString(t.dims) +
                             " whose product overflows");
    uint32_t type = 0;
    TANDEM_RETURN_IF_ERROR(ReadU32("the type of " + where, &type));
    const GgmlTypeInfo* info = FindGgmlType(type);
    if (info == nullptr)
      return InvalidArgument(path + ": " + where + " has unknown ggml type " +
                             std::to_string(type));
    t.type = info->type;
    // A tensor without dims is a scalar: one row of one element.
    const int64_t row = t.dims.empty() ? 1 : t.dims[0];
    if (row % info->block_elements != 0)
      return InvalidArgument(path + ": " + where + " of type " + std::string(info->name) +
                             " has a row of " + std::to_string(row) +
                             " elements, not a multiple of its block (" +
                             std::to_string(info->block_elements) + ")");
    t.num_elements = elements;
    const uint64_t blocks = elements / info->block_elements;
    if (blocks > std::numeric_limits<uint64_t>::max() / info->block_bytes)
      return InvalidArgument(path + ": " + where + " has dims " + DimsToString(t.dims) +
                             " whose size in bytes overflows");
    t.size_bytes = blocks * info->block_bytes;
    TANDEM_RETURN_IF_ERROR(ReadU64("the offset of " + where, &t.offset));
    out_->tensor_index_.emplace(t.name, out_->tensors_.size());
    out_->tensors_.push_back(std::move(t));
    return Status::Ok();
  }

  static std::string DimsToString(const std::vector<int64_t>& dims) {
    std::string s = "[";
    for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
  }

  Status CheckTensorPlacement() {
    const std::string& path = out_->path_;
    const uint64_t data_bytes = size_ - std::min<uint64_t>(size_, out_->data_offset_);
    std::vector<const GgufTensorInfo*> by_offset;
    by_offset.reserve(out_->tensors_.size());
    for (GgufTensorInfo& t : out_->tensors_) {
      const std::string where = path + ": tensor '" + t.name + "'";
      if (t.offset % out_->alignment_ != 0)
        return InvalidArgument(where + " has offset " + std::to_string(t.offset) +
                               ", not a multiple of the alignment " +
                               std::to_string(out_->alignment_));
      if (t.offset > data_bytes || t.size_bytes > data_bytes - t.offset)
        return DataLoss(where + " (" + std::to_string(t.size_bytes) + " bytes at offset " +
                        std::to_string(t.offset) + " of the data section) lies outside the file (" +
                        std::to_string(data_bytes) + " bytes of data)");
      t.data = data_ + out_->data_offset_ + t.offset;
      by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const GgufTensorInfo& prev = *by_offset[i - 1];
      const GgufTensorInfo& cur = *by_offset[i];
      if (prev.size_bytes > 0 && cur.size_bytes > 0 && prev.offset + prev.size_bytes > cur.offset)
        return InvalidArgument(path + ": tensor '" + cur.name + "' (offset " +
                               std::to_string(cur.offset) + ") overlaps tensor '" + prev.name +
                               "' (offset " + std::to_string(prev.offset) + ", " +
                               std::to_string(prev.size_bytes) + " bytes)");
    }
    return Status::Ok();
  }

  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  GgufFile* out_;
};

StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return errno == ENOENT ? NotFound(path + ": no such file")
                           : Unavailable(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
  TANDEM_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  GgufFile file;
  file.mapping_ = std::make_unique<MappedFile>(std::move(mapped));
  file.path_ = path;
  file.size_ = file.mapping_->size();
  GgufParser parser(file.mapping_->data(), file.mapping_->size(), &file);
  TANDEM_RETURN_IF_ERROR(parser.Parse());
  return file;
}

StatusOr<GgufFile> GgufFile::FromBytes(const uint8_t* data, size_t size, std::string name) {
  GgufFile file;
  file.path_ = std::move(name);
  file.size_ = size;
  GgufParser parser(data, size, &file);
  TANDEM_RETURN_IF_ERROR(parser.Parse());
  return file;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Status GgufFile::KeyError(std::string_view key, std::string_view what) const {
  return InvalidArgument(path_ + ": metadata key '" + std::string(key) + "' " + std::string(what));
}

StatusOr<std::optional<int64_t>> GgufFile::GetOptionalInt(std::string_view key, int64_t min_value,
                                                          int64_t max_value) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<int64_t>();
  std::optional<int64_t> x = v->AsInt();
  if (!x) {
    if (v->type() == GgufValueType::kUint64) return KeyError(key, "is too large");
    return KeyError(key, "must be an integer, not " +
                             (v->is_array() ? "an array" : GgufValueTypeName(v->type())));
  }
  if (*x < min_value || *x > max_value)
    return KeyError(key, "is " + std::to_string(*x) + "; it must be in [" +
                             std::to_string(min_value) + ", " + std::to_string(max_value) + "]");
  return x;
}

StatusOr<int64_t> GgufFile::GetInt(std::string_view key, int64_t min_value,
                                   int64_t max_value) const {
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> x, GetOptionalInt(key, min_value, max_value));
  if (!x) return KeyError(key, "is missing");
  return *x;
}

StatusOr<std::optional<double>> GgufFile::GetOptionalFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<double>();
  std::optional<double> x = v->AsFloat();
  if (!x) return KeyError(key, "must be a float32 or float64, not " +
                                   (v->is_array() ? "an array" : GgufValueTypeName(v->type())));
  if (!std::isfinite(*x)) return KeyError(key, "must be finite");
  return x;
}

StatusOr<std::optional<bool>> GgufFile::GetOptionalBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<bool>();
  std::optional<bool> x = v->AsBool();
  if (!x) return KeyError(key, "must be a bool, not " +
                                   (v->is_array() ? "an array" : GgufValueTypeName(v->type())));
  return x;
}

StatusOr<std::optional<std::string>> GgufFile::GetOptionalString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<std::string>();
  std::optional<std::string_view> x = v->AsString();
  if (!x) return KeyError(key, "must be a string, not " +
                                   (v->is_array() ? "an array" : GgufValueTypeName(v->type())));
  return std::optional<std::string>(std::string(*x));
}

StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> x, GetOptionalString(key));
  if (!x) return KeyError(key, "is missing");
  return *x;
}

}  // namespace tandem
