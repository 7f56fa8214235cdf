#include "common/model/safetensors.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "common/model/model_config.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

std::string ReadAll(const std::string& path) { return *ReadFileToString(path); }

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

// A file with a given header JSON and data section.
std::string MakeFile(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + std::string(data_bytes, '\0');
}

TEST_CASE("safetensors round trip in F32, BF16 and F16", "[safetensors]") {
  test::TempDir dir;
  std::vector<float> a = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 65504.0f};
  std::vector<float> b = {0.1f, 0.2f};
  std::string path = (dir.path() / "model.safetensors").string();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<TensorToWrite> tensors = {{"a", {2, 3}, a, dtype}, {"b", {2}, b, dtype}};
    REQUIRE(WriteSafetensors(path, tensors).ok());
    auto reader = SafetensorsReader::OpenDir(dir.path().string());
    REQUIRE(reader.ok());
    std::vector<float> out(6);
    REQUIRE(reader->ReadF32("a", std::vector<int64_t>{2, 3}, out).ok());
    for (size_t i = 0; i < a.size(); ++i) {
      float tol = dtype == DType::kF32 ? 0.0f : std::abs(a[i]) * (dtype == DType::kBF16 ? 4e-3f : 1e-3f);
      CHECK(std::abs(out[i] - a[i]) <= tol);
    }
    CHECK(reader->Find("b")->dtype == dtype);
    // Wrong shape and missing tensors name the tensor and the shapes.
    Status s = reader->ReadF32("a", std::vector<int64_t>{3, 2}, out);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("'a' has shape [2, 3], expected [3, 2]") != std::string::npos);
    s = reader->ReadF32("c", std::vector<int64_t>{2}, out);
    CHECK(s.code() == StatusCode::kNotFound);
    CHECK(s.message().find("'c'") != std::string::npos);
  }
}

TEST_CASE("F32 to BF16/F16 rounding matches torch", "[safetensors]") {
  CHECK(F32ToBF16(1.0f) == 0x3f80);
  CHECK(F32ToBF16(1.00390625f) == 0x3f80);  // halfway, rounds to even
  CHECK(F32ToBF16(1.01171875f) == 0x3f82);  // halfway, rounds to even (up)
  CHECK(F32ToF16(1.0f) == 0x3c00);
  CHECK(F32ToF16(65504.0f) == 0x7bff);
  CHECK(F32ToF16(1e6f) == 0x7c00);
  CHECK(F32ToF16(5.960464477539063e-08f) == 0x0001);  // smallest subnormal
  uint16_t h = F32ToF16(-0.333251953125f);
  float back;
  ConvertToF32(DType::kF16, reinterpret_cast<const uint8_t*>(&h), 1, &back);
  CHECK(back == -0.333251953125f);
}

TEST_CASE("truncated or garbage safetensors are clear errors", "[safetensors]") {
  test::TempDir dir;
  std::string path = (dir.path() / "model.safetensors").string();
  std::vector<float> a(64, 1.0f);
  std::vector<TensorToWrite> tensors = {{"model.norm.weight", {64}, a, DType::kF32}};
  REQUIRE(WriteSafetensors(path, tensors).ok());
  std::string good = ReadAll(path);

  auto open_error = [&](const std::string& contents) {
    WriteAll(path, contents);
    auto reader = SafetensorsReader::OpenFile(path);
    REQUIRE_FALSE(reader.ok());
    CHECK(reader.status().message().find(path) != std::string::npos);
    return reader.status();
  };

  // Cut in the data section: names the tensor and says truncated.
  Status s = open_error(good.substr(0, good.size() - 10));
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK(s.message().find("model.norm.weight") != std::string::npos);
  CHECK(s.message().find("truncated") != std::string::npos);
  // Cut in the header, in the length, empty file.
  CHECK(open_error(good.substr(0, 20)).code() == StatusCode::kDataLoss);
  CHECK(open_error(good.substr(0, 5)).code() == StatusCode::kDataLoss);
  CHECK(open_error("").code() == StatusCode::kDataLoss);
  // Garbage: a huge header length, a header that is not JSON.
  CHECK(open_error(std::string(8, '\xff') + "garbage").code() == StatusCode::kDataLoss);
  CHECK(open_error(MakeFile("{not json", 0)).code() == StatusCode::kDataLoss);
  // Offsets that disagree with the shape, offsets past the end, bad dtype, negative dims.
  s = open_error(MakeFile(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", 16));
  CHECK(s.message().find("'w'") != std::string::npos);
  CHECK(open_error(MakeFile(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 16))
            .code() == StatusCode::kDataLoss);
  CHECK(open_error(MakeFile(R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16))
            .code() == StatusCode::kInvalidArgument);
  CHECK(open_error(MakeFile(R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", 16))
            .code() == StatusCode::kDataLoss);
  CHECK(open_error(MakeFile(R"({"w":{"dtype":"F32","shape":[4]}})", 16)).code() ==
        StatusCode::kDataLoss);
  CHECK(open_error(MakeFile(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", 16))
            .code() == StatusCode::kDataLoss);
  // A missing file.
  CHECK(SafetensorsReader::OpenFile(path + ".nope").status().code() == StatusCode::kNotFound);
}

TEST_CASE("sharded checkpoints load through the index", "[safetensors]") {
  test::TempDir dir;
  std::vector<float> a = {1, 2, 3}, b = {4, 5};
  std::vector<TensorToWrite> t1 = {{"a", {3}, a, DType::kF32}};
  std::vector<TensorToWrite> t2 = {{"b", {2}, b, DType::kBF16}};
  REQUIRE(WriteSafetensors((dir.path() / "model-00001-of-00002.safetensors").string(), t1).ok());
  REQUIRE(WriteSafetensors((dir.path() / "model-00002-of-00002.safetensors").string(), t2).ok());
  dir.Write("model.safetensors.index.json",
            R"({"metadata":{"total_size":16},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
            R"("b":"model-00002-of-00002.safetensors"}})");
  auto reader = SafetensorsReader::OpenDir(dir.path().string());
  REQUIRE(reader.ok());
  std::vector<float> out(2);
  REQUIRE(reader->ReadF32("b", std::vector<int64_t>{2}, out).ok());
  CHECK(out[1] == 5.0f);
  // An index naming a tensor its shard lacks, or a path outside the directory, is an error.
  dir.Write("model.safetensors.index.json",
            R"({"weight_map":{"a":"model-00001-of-00002.safetensors","c":"model-00001-of-00002.safetensors"}})");
  auto bad = SafetensorsReader::OpenDir(dir.path().string());
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("'c'") != std::string::npos);
  dir.Write("model.safetensors.index.json", R"({"weight_map":{"a":"../x.safetensors"}})");
  CHECK(SafetensorsReader::OpenDir(dir.path().string()).status().code() ==
        StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
