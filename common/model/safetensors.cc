#include "common/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "common/model/model_config.h"

namespace tandem {
namespace {

using Json = nlohmann::json;

// A header larger than this is not a checkpoint header (the Rust reader uses 100 MB too).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

bool ParseDType(const std::string& text, DType* out) {
  if (text == "F32") *out = DType::kF32;
  else if (text == "F16") *out = DType::kF16;
  else if (text == "BF16") *out = DType::kBF16;
  else return false;
  return true;
}

float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "?";
}

size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// ---- MappedFile ----------------------------------------------------------------------------

StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  MappedFile file;
  file.path_ = path;
  file.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd_ < 0) {
    return errno == ENOENT ? NotFound(path + ": no such file")
                           : Unavailable(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(file.fd_, &st) != 0) return Internal(path + ": fstat: " + std::strerror(errno));
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, file.fd_, 0);
    if (p == MAP_FAILED) return Internal(path + ": mmap: " + std::strerror(errno));
    file.data_ = static_cast<const uint8_t*>(p);
  }
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = other.fd_;
    data_ = other.data_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
  size_ = 0;
}

// ---- reader ----------------------------------------------------------------------------------

Status SafetensorsReader::AddFile(const std::string& path,
                                  const std::vector<std::string>* only_names) {
  TANDEM_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  auto file = std::make_unique<MappedFile>(std::move(mapped));
  const size_t size = file->size();
  if (size < 8) return DataLoss(path + ": truncated (" + std::to_string(size) + " bytes; no header)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | file->data()[i];
  if (header_len > kMaxHeaderBytes)
    return DataLoss(path + ": header length " + std::to_string(header_len) + " is implausible");
  if (header_len > size - 8)
    return DataLoss(path + ": truncated (header says " + std::to_string(header_len) +
                    " bytes, file has " + std::to_string(size - 8) + " after the length)");
  const char* header = reinterpret_cast<const char*>(file->data() + 8);
  Json json = Json::parse(header, header + header_len, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object())
    return DataLoss(path + ": header is not a JSON object");
  const uint8_t* buffer = file->data() + 8 + header_len;
  const uint64_t buffer_size = size - 8 - header_len;

  for (auto it = json.begin(); it != json.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    std::string where = path + ": tensor '" + name + "'";
    if (tensors_.count(name)) return DataLoss(where + " appears in more than one file");
    const Json& entry = it.value();
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() ||
        !entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2)
      return DataLoss(where + ": entry needs dtype, shape and data_offsets [begin, end]");
    TensorView view;
    view.name = name;
    view.file = path;
    std::string dtype = entry["dtype"].get<std::string>();
    if (!ParseDType(dtype, &view.dtype))
      return InvalidArgument(where + ": dtype " + dtype + " is not supported (F32, F16, BF16)");
    uint64_t elements = 1;
    for (const Json& d : entry["shape"]) {
      if (!d.is_number_unsigned()) return DataLoss(where + ": shape must hold non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && elements > (uint64_t{1} << 48) / dim)
        return DataLoss(where + ": shape is implausibly large");
      elements *= dim;
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    const Json& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      return DataLoss(where + ": data_offsets must be non-negative integers");
    uint64_t begin = offsets[0].get<uint64_t>();
    uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end || end > buffer_size)
      return DataLoss(where + ": data_offsets [" + std::to_string(begin) + ", " +
                      std::to_string(end) + "] outside the " + std::to_string(buffer_size) +
                      "-byte data section (truncated file?)");
    if (end - begin != elements * DTypeSize(view.dtype))
      return DataLoss(where + ": " + std::to_string(end - begin) + " bytes for shape " +
                      ShapeToString(view.shape) + " of " + dtype);
    view.data = buffer + begin;
    view.size_bytes = end - begin;
    tensors_.emplace(name, std::move(view));
  }
  if (only_names != nullptr) {
    for (const std::string& name : *only_names) {
      if (!tensors_.count(name))
        return DataLoss(path + ": tensor '" + name + "' listed in the index is not in the file");
    }
  }
  files_.push_back(std::move(file));
  return Status::Ok();
}

StatusOr<SafetensorsReader> SafetensorsReader::OpenFile(const std::string& path) {
  SafetensorsReader reader;
  TANDEM_RETURN_IF_ERROR(reader.AddFile(path, nullptr));
  return reader;
}

StatusOr<SafetensorsReader> SafetensorsReader::OpenDir(const std::string& dir) {
  std::string index_path = dir + "/model.safetensors.index.json";
  StatusOr<std::string> index_text = ReadFileToString(index_path);
  if (!index_text.ok()) {
    std::string single = dir + "/model.safetensors";
    if (::access(single.c_str(), F_OK) != 0)
      return NotFound(dir + ": neither model.safetensors nor model.safetensors.index.json");
    return OpenFile(single);
  }
  Json index = Json::parse(*index_text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object())
    return InvalidArgument(index_path + ": expected an object with a 'weight_map' object");
  std::map<std::string, std::vector<std::string>> names_by_file;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      return InvalidArgument(index_path + ": weight_map['" + it.key() + "'] must be a file name");
    std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "..")
      return InvalidArgument(index_path + ": weight_map['" + it.key() + "'] = '" + file +
                             "' is not a file name in the checkpoint directory");
    names_by_file[file].push_back(it.key());
  }
  SafetensorsReader reader;
  for (const auto& [file, names] : names_by_file)
    TANDEM_RETURN_IF_ERROR(reader.AddFile(dir + "/" + file, &names));
  return reader;
}

const TensorView* SafetensorsReader::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status SafetensorsReader::ReadF32(const std::string& name, std::span<const int64_t> expected_shape,
                                  std::span<float> out) const {
  const TensorView* view = Find(name);
  if (view == nullptr)
    return NotFound("tensor '" + name + "' (expected shape " + ShapeToString(expected_shape) +
                    ") is missing from the checkpoint");
  if (!std::equal(view->shape.begin(), view->shape.end(), expected_shape.begin(),
                  expected_shape.end()))
    return InvalidArgument(view->file + ": tensor '" + name + "' has shape " +
                           ShapeToString(view->shape) + ", expected " +
                           ShapeToString(expected_shape));
  TANDEM_CHECK(static_cast<int64_t>(out.size()) == view->NumElements(), name);
  ConvertToF32(view->dtype, view->data, out.size(), out.data());
  return Status::Ok();
}

void ConvertToF32(DType dtype, const uint8_t* src, size_t count, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, count * 4);
      return;
    case DType::kBF16:
      for (size_t i = 0; i < count; ++i) {
        uint32_t bits = static_cast<uint32_t>(src[2 * i] | src[2 * i + 1] << 8) << 16;
        std::memcpy(&dst[i], &bits, 4);
      }
      return;
    case DType::kF16:
      for (size_t i = 0; i < count; ++i)
        dst[i] = F16ToF32(static_cast<uint16_t>(src[2 * i] | src[2 * i + 1] << 8));
      return;
  }
}

uint16_t F32ToBF16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(bits >> 16 | 0x40);  // NaN
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

uint16_t F32ToF16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  uint32_t sign = (bits >> 16) & 0x8000;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal or zero in f16
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - exp;  // 14 - (exp - 127) + 13 - 1 ... aligns to f16 subnormal
    uint32_t half = mant >> (shift - 0);
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t out = ((abs - 0x38000000u) >> 13);
  uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (out & 1))) ++out;
  return static_cast<uint16_t>(sign | out);
}

// ---- writer ----------------------------------------------------------------------------------

Status WriteSafetensors(const std::string& path, std::span<const TensorToWrite> tensors) {
  Json header = Json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    int64_t elements = 1;
    for (int64_t d : t.shape) elements *= d;
    TANDEM_CHECK(elements == static_cast<int64_t>(t.data.size()), t.name + ": shape/data mismatch");
    uint64_t bytes = static_cast<uint64_t>(elements) * DTypeSize(t.dtype);
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // the buffer starts 8-aligned

  std::unique_ptr<FILE, int (*)(FILE*)> out(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!out) return Internal(path + ": cannot open for writing: " + std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, out.get()) == 8 &&
            std::fwrite(text.data(), 1, text.size(), out.get()) == text.size();
  std::vector<uint16_t> half;
  for (const TensorToWrite& t : tensors) {
    if (!ok) break;
    if (t.dtype == DType::kF32) {
      ok = std::fwrite(t.data.data(), 4, t.data.size(), out.get()) == t.data.size();
      continue;
    }
    half.resize(t.data.size());
    for (size_t i = 0; i < t.data.size(); ++i)
      half[i] = t.dtype == DType::kBF16 ? F32ToBF16(t.data[i]) : F32ToF16(t.data[i]);
    ok = std::fwrite(half.data(), 2, half.size(), out.get()) == half.size();
  }
  if (std::fclose(out.release()) != 0) ok = false;
  if (!ok) return Internal(path + ": write failed: " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace tandem
