// The linear kernels of every ISA path against a double-precision reference, the bf16/f16
// conversions against the hardware's and torch's rounding, and whole forward passes over bf16
// and f16 weights against the same weights widened to fp32.
#include "common/engine/linear_kernels.h"

#include <catch2/catch.hpp>
#include <immintrin.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/engine/forward.h"
#include "common/model/make_model.h"
#include "common/model/model.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

std::vector<KernelIsa> SupportedIsas() {
  std::vector<KernelIsa> out;
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512})
    if (CpuSupports(isa)) out.push_back(isa);
  return out;
}

// Sets TANDEM_KERNEL_ISA for one scope.
class ScopedIsaEnv {
 public:
  explicit ScopedIsaEnv(const char* value) { ::setenv("TANDEM_KERNEL_ISA", value, 1); }
  ~ScopedIsaEnv() { ::unsetenv("TANDEM_KERNEL_ISA"); }
};

struct Weights {
  WeightDType dtype;
  std::vector<float> f32;       // the weights as the kernels see them (exactly representable)
  std::vector<uint16_t> half;   // storage for bf16/f16
  WeightMatrix matrix(int rows, int cols) const {
    return WeightMatrix{dtype, dtype == WeightDType::kF32 ? static_cast<const void*>(f32.data())
                                                          : static_cast<const void*>(half.data()),
                        rows, cols};
  }
};

Weights MakeWeights(WeightDType dtype, size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Weights w{dtype, std::vector<float>(n), {}};
  for (float& v : w.f32) v = dist(rng);
  if (dtype != WeightDType::kF32) {
    w.half.resize(n);
    ConvertFromF32(w.f32.data(), n, dtype, w.half.data());
    WeightRowsToF32(w.matrix(1, static_cast<int>(n)), 0, 1, w.f32.data());  // what is stored
  }
  return w;
}

TEST_CASE("every kernel path matches a double-precision reference within the fp32 summation bound",
          "[linear_kernels]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int kRows = 21;  // weight rows; outputs [n0, n1) = [1, 19): odd edges on both sides
  const int n0 = 1, n1 = 19;
  for (WeightDType dtype : {WeightDType::kF32, WeightDType::kBF16, WeightDType::kF16}) {
    for (int k : {1, 7, 8, 15, 16, 17, 33, 64, 100, 576}) {
      const Weights w = MakeWeights(dtype, static_cast<size_t>(kRows) * k, rng);
      for (int m : {1, 2, 3, 4, 5, 7, 9, 17, 64}) {
        std::vector<float> x(static_cast<size_t>(m) * k);
        for (float& v : x) v = dist(rng);
        const int ldy = kRows + 3;
        std::vector<float> y0(static_cast<size_t>(m) * ldy);
        for (float& v : y0) v = dist(rng);
        for (float beta : {0.0f, 1.0f}) {
          for (KernelIsa isa : SupportedIsas()) {
            INFO("isa " << KernelIsaName(isa) << " dtype " << WeightDTypeName(dtype) << " m " << m
                        << " k " << k << " beta " << beta);
            std::vector<float> y = y0;
            LinearRows(isa, x.data(), m, w.matrix(kRows, k), n0, n1, y.data(), ldy, beta);
            for (int r = 0; r < m; ++r) {
              for (int j = 0; j < ldy; ++j) {
                const float got = y[static_cast<size_t>(r) * ldy + j];
                const float before = y0[static_cast<size_t>(r) * ldy + j];
                if (j < n0 || j >= n1) {  // outside the range: untouched
                  REQUIRE(std::memcmp(&got, &before, sizeof(float)) == 0);
                  continue;
                }
                double exact = 0, magnitude = 0;
                for (int i = 0; i < k; ++i) {
                  const double p = double{x[static_cast<size_t>(r) * k + i]} *
                                   w.f32[static_cast<size_t>(j) * k + i];
                  exact += p;
                  magnitude += std::fabs(p);
                }
                exact += beta * before;
                const double bound = (k + 1) * std::ldexp(1.0, -24) *
                                         (magnitude + std::fabs(beta * before)) +
                                     1e-30;
                REQUIRE(std::fabs(got - exact) <= bound);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("widening rows gives the stored values on every path", "[linear_kernels]") {
  std::mt19937 rng(3);
  for (WeightDType dtype : {WeightDType::kF32, WeightDType::kBF16, WeightDType::kF16}) {
    const int rows = 5, cols = 37;
    const Weights w = MakeWeights(dtype, rows * cols, rng);
    for (KernelIsa isa : SupportedIsas()) {
      std::vector<float> out(3 * cols, -1.0f);
      WidenRows(isa, w.matrix(rows, cols), 1, 4, out.data());
      REQUIRE(std::memcmp(out.data(), w.f32.data() + cols, out.size() * sizeof(float)) == 0);
    }
  }
}

[[gnu::target("f16c")]] uint16_t HardwareF16(float v) {
  return static_cast<uint16_t>(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
[[gnu::target("f16c")]] float HardwareF32(uint16_t v) { return _cvtsh_ss(v); }

float Bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST_CASE("f16 and bf16 conversions round to nearest even as the hardware and torch do",
          "[linear_kernels]") {
  if (__builtin_cpu_supports("f16c")) {
    for (uint32_t h = 0; h < 65536; ++h) {  // every f16 widens as F16C does
      const float a = F16ToF32(static_cast<uint16_t>(h)), b = HardwareF32(static_cast<uint16_t>(h));
      REQUIRE((std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b))));
    }
    std::mt19937 rng(5);
    std::uniform_int_distribution<uint32_t> any;
    for (int i = 0; i < 2000000; ++i) {  // random fp32 bit patterns, every exponent
      const float v = Bits(any(rng));
      if (std::isnan(v)) {
        REQUIRE(std::isnan(F16ToF32(F32ToF16(v))));
        continue;
      }
      INFO("value " << v);
      REQUIRE(F32ToF16(v) == HardwareF16(v));
    }
    for (float v : {65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.9802322e-08f, -0.0f, 5.9604645e-08f,
                    std::numeric_limits<float>::infinity()})
      REQUIRE(F32ToF16(v) == HardwareF16(v));
  }
  // bf16: ties go to even, overflow to inf, NaN stays NaN.
  REQUIRE(F32ToBF16(1.0f) == 0x3f80);
  REQUIRE(F32ToBF16(Bits(0x3f808000)) == 0x3f80);  // 1 + 2^-8: a tie, down to even
  REQUIRE(F32ToBF16(Bits(0x3f818000)) == 0x3f82);  // 1 + 3 * 2^-8: a tie, up to even
  REQUIRE(F32ToBF16(Bits(0x3f808001)) == 0x3f81);  // just above the tie
  REQUIRE(F32ToBF16(std::numeric_limits<float>::max()) == 0x7f80);
  REQUIRE(std::isnan(BF16ToF32(F32ToBF16(std::numeric_limits<float>::quiet_NaN()))));
  REQUIRE(std::isnan(BF16ToF32(F32ToBF16(Bits(0x7f800001)))));  // a signalling NaN stays NaN
  REQUIRE(BF16ToF32(0xbf80) == -1.0f);
}

TEST_CASE("TANDEM_KERNEL_ISA forces a path and names what is wrong", "[linear_kernels]") {
  {
    ScopedIsaEnv env("scalar");
    auto isa = KernelIsaFromEnv();
    REQUIRE(isa.ok());
    REQUIRE(*isa == KernelIsa::kScalar);
  }
  {
    ScopedIsaEnv env("sse9");
    auto isa = KernelIsaFromEnv();
    REQUIRE(!isa.ok());
    REQUIRE(isa.status().message().find("TANDEM_KERNEL_ISA='sse9'") != std::string::npos);
  }
  for (KernelIsa want : {KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    ScopedIsaEnv env(std::string(KernelIsaName(want)).c_str());
    auto isa = KernelIsaFromEnv();
    REQUIRE(isa.ok() == CpuSupports(want));
    if (!isa.ok()) REQUIRE(isa.status().message().find("cannot run") != std::string::npos);
  }
  auto best = KernelIsaFromEnv();
  REQUIRE(best.ok());
  REQUIRE(*best == BestKernelIsa());
}

// Logits of a prompt (prefill through sgemm: 70 tokens > the kernels' 64 rows), then of two
// decode steps (the kernels), concatenated.
std::vector<float> PrefillAndDecode(const Model& model, int threads) {
  ForwardOptions options;
  options.num_threads = threads;
  auto engine = CpuForward::Create(model, options);
  REQUIRE(engine.ok());
  auto cache = KvCache::Create((*engine)->MakeKvLayout(), 8);
  REQUIRE(cache.ok());
  std::vector<int32_t> table;
  REQUIRE((*cache)->blocks().Allocate(8, &table).ok());
  std::vector<int32_t> prompt(70);
  for (int i = 0; i < 70; ++i) prompt[i] = (i * 7919 + 13) % model.config().vocab_size;
  std::vector<float> all;
  SequenceInput seq{prompt, 0, table};
  auto out = (*engine)->Forward({&seq, 1}, **cache);
  REQUIRE(out.ok());
  all.insert(all.end(), out->begin(), out->end());
  for (int s = 0; s < 2; ++s) {
    int32_t token = (s * 31 + 5) % model.config().vocab_size;
    SequenceInput step{{&token, 1}, 70 + s, table};
    out = (*engine)->Forward({&step, 1}, **cache);
    REQUIRE(out.ok());
    all.insert(all.end(), out->begin(), out->end());
  }
  return all;
}

TEST_CASE("bf16 and f16 weights give the logits of the same weights in fp32, on every path",
          "[linear_kernels][forward]") {
  test::TempDir dir;
  for (DType file_dtype : {DType::kBF16, DType::kF16}) {
    MakeModelOptions options;
    options.seed = 4;
    options.with_tokenizer = false;
    options.dtype = file_dtype;  // the checkpoint holds values exact in both storages
    const std::string path = (dir.path() / (file_dtype == DType::kBF16 ? "bf16" : "f16")).string();
    REQUIRE(MakeModel(options, path).ok());
    auto wide = Model::Load(path, {WeightDType::kF32});
    auto narrow = Model::Load(path);  // auto: the checkpoint's torch_dtype
    REQUIRE(wide.ok());
    REQUIRE(narrow.ok());
    const WeightDType want = file_dtype == DType::kBF16 ? WeightDType::kBF16 : WeightDType::kF16;
    REQUIRE((*narrow)->dtype() == want);
    REQUIRE((*narrow)->step_weight_bytes() < (*wide)->step_weight_bytes() * 0.55);
    const std::vector<float> reference = PrefillAndDecode(**wide, 1);
    for (KernelIsa isa : SupportedIsas()) {
      ScopedIsaEnv env(std::string(KernelIsaName(isa)).c_str());
      for (int threads : {1, 2}) {
        const std::vector<float> got = PrefillAndDecode(**narrow, threads);
        REQUIRE(got.size() == reference.size());
        float diff = 0, scale = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          diff = std::max(diff, std::fabs(got[i] - reference[i]));
          scale = std::max(scale, std::fabs(reference[i]));
        }
        INFO("isa " << KernelIsaName(isa) << " threads " << threads);
        REQUIRE(diff <= 1e-4f * scale);  // fp32 summation order only
      }
    }
  }
}

TEST_CASE("model.dtype float16 refuses a weight beyond float16's range, naming the tensor",
          "[linear_kernels]") {
  REQUIRE(ResolveWeightDType(std::nullopt, "bfloat16") == WeightDType::kBF16);
  REQUIRE(ResolveWeightDType(std::nullopt, "") == WeightDType::kF32);
  REQUIRE(ResolveWeightDType(std::nullopt, "int8") == WeightDType::kF32);
  REQUIRE(ResolveWeightDType(WeightDType::kF16, "bfloat16") == WeightDType::kF16);
  test::TempDir dir;
  MakeModelOptions options;
  options.with_tokenizer = false;
  const std::string path = (dir.path() / "m").string();
  REQUIRE(MakeModel(options, path).ok());
  REQUIRE(Model::Load(path, {WeightDType::kF16}).ok());
  // Put 1e6 into the first element of one layer's down_proj (fp32 file: 8-byte header length,
  // JSON header, data).
  const std::string file = path + "/model.safetensors";
  auto bytes = ReadFileToString(file);
  REQUIRE(bytes.ok());
  uint64_t header_len;
  std::memcpy(&header_len, bytes->data(), 8);
  const auto header = nlohmann::json::parse(bytes->substr(8, header_len));
  const std::string name = "model.layers.1.mlp.down_proj.weight";
  const size_t offset = 8 + header_len + header[name]["data_offsets"][0].get<size_t>();
  const float big = 1e6f;
  std::memcpy(bytes->data() + offset, &big, 4);
  REQUIRE(WriteStringToFile(file, *bytes).ok());
  auto refused = Model::Load(path, {WeightDType::kF16});
  REQUIRE(!refused.ok());
  REQUIRE(refused.status().message().find(name) != std::string::npos);
  REQUIRE(refused.status().message().find("float16") != std::string::npos);
  REQUIRE(Model::Load(path, {WeightDType::kBF16}).ok());  // bf16 has fp32's range
}

}  // namespace
}  // namespace tandem
