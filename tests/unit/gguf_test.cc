#include "common/model/gguf.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/model/checkpoint.h"
#include "common/model/gguf_checkpoint.h"
#include "common/model/gguf_quants.h"
#include "common/model/model.h"
#include "common/model/model_store.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

// Writes GGUF bytes field by field, so that tests can build valid files and break them.
class GgufBuilder {
 public:
  uint32_t version = 3;
  uint64_t alignment = 32;  // the layout; add general.alignment yourself when not 32
  std::optional<uint64_t> tensor_count, kv_count;  // overrides of the real counts

  static void U32(std::string* s, uint32_t v) { s->append(reinterpret_cast<char*>(&v), 4); }
  static void U64(std::string* s, uint64_t v) { s->append(reinterpret_cast<char*>(&v), 8); }
  static void Str(std::string* s, const std::string& v) {
    U64(s, v.size());
    s->append(v);
  }

  // A metadata entry with a raw value payload.
  void Raw(const std::string& key, uint32_t type, const std::string& payload) {
    Str(&kv_, key);
    U32(&kv_, type);
    kv_ += payload;
    ++kvs_;
  }
  void Uint32(const std::string& key, uint32_t v) {
    std::string p;
    U32(&p, v);
    Raw(key, 4, p);
  }
  void Float32(const std::string& key, float v) {
    Raw(key, 6, std::string(reinterpret_cast<char*>(&v), 4));
  }
  void String(const std::string& key, const std::string& v) {
    std::string p;
    Str(&p, v);
    Raw(key, 8, p);
  }
  void Bool(const std::string& key, bool v) { Raw(key, 7, std::string(1, v ? 1 : 0)); }
  void Strings(const std::string& key, const std::vector<std::string>& v) {
    std::string p;
    U32(&p, 8);
    U64(&p, v.size());
    for (const std::string& s : v) Str(&p, s);
    Raw(key, 9, p);
  }
  void Int32s(const std::string& key, const std::vector<int32_t>& v) {
    std::string p;
    U32(&p, 5);
    U64(&p, v.size());
    p.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    Raw(key, 9, p);
  }

  // A tensor placed after the previous one (aligned), or at `offset` when given.
  void Tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type,
              const std::string& bytes, std::optional<uint64_t> offset = std::nullopt) {
    const uint64_t at = offset.value_or((data_.size() + alignment - 1) / alignment * alignment);
    Str(&infos_, name);
    U32(&infos_, static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(&infos_, d);
    U32(&infos_, type);
    U64(&infos_, at);
    if (data_.size() < at + bytes.size()) data_.resize(at + bytes.size(), '\0');
    std::memcpy(data_.data() + at, bytes.data(), bytes.size());
    ++tensors_;
  }
  void F32Tensor(const std::string& name, const std::vector<uint64_t>& dims,
                 const std::vector<float>& values) {
    Tensor(name, dims, 0, std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  }

  std::string Bytes() const {
    std::string s = "GGUF";
    U32(&s, version);
    U64(&s, tensor_count.value_or(tensors_));
    U64(&s, kv_count.value_or(kvs_));
    s += kv_ + infos_;
    s.resize((s.size() + alignment - 1) / alignment * alignment, '\0');
    return s + data_;
  }

 private:
  std::string kv_, infos_, data_;
  uint64_t kvs_ = 0, tensors_ = 0;
};

StatusOr<GgufFile> Parse(const std::string& bytes) {
  return GgufFile::FromBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "t.gguf");
}

std::string ErrorOf(const std::string& bytes) {
  StatusOr<GgufFile> f = Parse(bytes);
  return f.ok() ? "(ok)" : f.status().message();
}

TEST_CASE("gguf reads every metadata type and the tensor table", "[gguf]") {
  GgufBuilder b;
  b.alignment = 64;
  b.Uint32("general.alignment", 64);
  b.Raw("u8", 0, std::string(1, '\xff'));
  b.Raw("i8", 1, std::string(1, '\xff'));
  b.Raw("u16", 2, std::string("\x34\x12", 2));
  b.Raw("i16", 3, std::string("\xfe\xff", 2));
  b.Raw("i32", 5, std::string("\xff\xff\xff\xff", 4));
  b.Float32("f32", 1.5f);
  b.Bool("yes", true);
  b.String("s", "hi \"there\"");
  std::string u64;
  GgufBuilder::U64(&u64, 1ull << 40);
  b.Raw("u64", 10, u64);
  b.Raw("i64", 11, u64);
  double two = 2.25;
  b.Raw("f64", 12, std::string(reinterpret_cast<char*>(&two), 8));
  b.Strings("names", {"a", "", "c"});
  b.Int32s("ints", {1, -2, 3});
  b.F32Tensor("w", {3, 2}, {1, 2, 3, 4, 5, 6});
  b.F32Tensor("v", {4}, {7, 8, 9, 10});
  const std::string bytes = b.Bytes();
  StatusOr<GgufFile> f = Parse(bytes);
  REQUIRE(f.ok());
  CHECK(f->version() == 3);
  CHECK(f->alignment() == 64);
  CHECK(f->data_offset() % 64 == 0);
  CHECK(f->metadata().size() == 14);
  CHECK(f->Find("u8")->AsInt() == 255);
  CHECK(f->Find("i8")->AsInt() == -1);
  CHECK(f->Find("u16")->AsInt() == 0x1234);
  CHECK(f->Find("i16")->AsInt() == -2);
  CHECK(f->Find("i32")->AsInt() == -1);
  CHECK(f->Find("f32")->AsFloat() == 1.5);
  CHECK(f->Find("f32")->AsInt() == std::nullopt);
  CHECK(f->Find("yes")->AsBool() == true);
  CHECK(f->Find("s")->AsString() == "hi \"there\"");
  CHECK(f->Find("s")->ToString() == "\"hi \\\"there\\\"\"");
  CHECK(f->Find("u64")->AsInt() == (1ll << 40));
  CHECK(f->Find("i64")->AsInt() == (1ll << 40));
  CHECK(f->Find("f64")->AsFloat() == 2.25);
  const GgufValue* names = f->Find("names");
  REQUIRE(names->is_array());
  CHECK(names->array_size() == 3);
  CHECK(names->StringAt(2) == "c");
  CHECK(names->StringAt(3) == std::nullopt);
  CHECK(names->ToString(2) == "[\"a\", \"\", ...] (3 strings)");
  CHECK(f->Find("ints")->IntAt(1) == -2);
  CHECK(f->Find("missing") == nullptr);

  REQUIRE(f->tensors().size() == 2);
  const GgufTensorInfo* w = f->FindTensor("w");
  REQUIRE(w != nullptr);
  CHECK(w->Shape() == std::vector<int64_t>{2, 3});
  CHECK(w->num_elements == 6);
  CHECK(w->size_bytes == 24);
  CHECK((w->data - reinterpret_cast<const uint8_t*>(bytes.data())) % 64 == 0);
  float x;
  std::memcpy(&x, w->data + 20, 4);
  CHECK(x == 6.0f);
  CHECK(f->FindTensor("v")->offset == 64);

  // Typed getters name the key.
  CHECK(f->GetInt("s", 0, 10).status().message() ==
        "t.gguf: metadata key 's' must be an integer, not string");
  CHECK(f->GetInt("u16", 0, 10).status().message() ==
        "t.gguf: metadata key 'u16' is 4660; it must be in [0, 10]");
  CHECK(f->GetString("nope").status().message() == "t.gguf: metadata key 'nope' is missing");
  CHECK(f->GetOptionalBool("names").status().message() ==
        "t.gguf: metadata key 'names' must be a bool, not an array");
}

TEST_CASE("gguf refuses malformed headers with the file and what is wrong", "[gguf]") {
  CHECK(ErrorOf("") == "t.gguf: truncated: the magic at byte 0 runs past the end of the file (0 bytes)");
  CHECK(ErrorOf("GGML\x03\0\0\0") == "t.gguf: not a GGUF file (magic 'GGML', expected 'GGUF')");
  CHECK(ErrorOf(std::string("\x89PNG", 4)) ==
        "t.gguf: not a GGUF file (magic '\\x89PNG', expected 'GGUF')");
  GgufBuilder b;
  b.version = 1;
  CHECK(ErrorOf(b.Bytes()) ==
        "t.gguf: GGUF version 1 is not supported (supported: 2, 3) (version 1 files predate "
        "64-bit counts; convert again)");
  b.version = 0x03000000;
  CHECK(ErrorOf(b.Bytes()) ==
        "t.gguf: GGUF version 50331648 is not supported (supported: 2, 3) (a big-endian file?)");
  b.version = 2;
  CHECK(ErrorOf(b.Bytes()) == "(ok)");

  GgufBuilder counts;
  counts.tensor_count = 1ull << 60;
  CHECK(ErrorOf(counts.Bytes()) ==
        "t.gguf: tensor count 1152921504606846976 is more than the file's 32 bytes can hold");
  counts.tensor_count = std::nullopt;
  counts.kv_count = ~0ull;
  CHECK(ErrorOf(counts.Bytes()) ==
        "t.gguf: metadata count 18446744073709551615 is more than the file's 32 bytes can hold");
}

TEST_CASE("gguf refuses malformed metadata naming the key", "[gguf]") {
  {
    GgufBuilder b;
    b.Raw("general.name", 13, "xxxx");
    CHECK(ErrorOf(b.Bytes()) == "t.gguf: metadata key 'general.name' has unknown value type 13");
  }
  {
    GgufBuilder b;
    std::string p;
    GgufBuilder::U32(&p, 9);
    GgufBuilder::U64(&p, 0);
    b.Raw("nested", 9, p);
    CHECK(ErrorOf(b.Bytes()) ==
          "t.gguf: metadata key 'nested' is an array of arrays, which is not supported");
  }
  {
    GgufBuilder b;
    std::string p;
    GgufBuilder::U32(&p, 4);
    GgufBuilder::U64(&p, 1ull << 62);
    b.Raw("tokenizer.ggml.token_type", 9, p);
    CHECK(ErrorOf(b.Bytes()) ==
          "t.gguf: metadata key 'tokenizer.ggml.token_type' is an array of 4611686018427387904 "
          "uint32s, more than the rest of the file can hold");
  }
  {
    GgufBuilder b;
    std::string p;
    GgufBuilder::U64(&p, 1ull << 50);
    b.Raw("general.name", 8, p + "abc");
    CHECK(ErrorOf(b.Bytes()) ==
          "t.gguf: truncated: the value of metadata key 'general.name' (1125899906842624 bytes) "
          "at byte 56 runs past the end of the file (64 bytes)");
  }
  {
    GgufBuilder b;
    b.String("a", "x");
    b.String("a", "y");
    CHECK(ErrorOf(b.Bytes()) == "t.gguf: metadata key 'a' appears twice");
  }
  {
    GgufBuilder b;
    b.Raw("flag", 7, std::string(1, '\x02'));
    CHECK(ErrorOf(b.Bytes()) == "t.gguf: metadata key 'flag' is a bool of value 2 (must be 0 or 1)");
  }
  {
    GgufBuilder b;
    b.Uint32("general.alignment", 48);
    CHECK(ErrorOf(b.Bytes()) ==
          "t.gguf: metadata key 'general.alignment' is 48; it must be a power of two up to 1048576");
  }
  {
    GgufBuilder b;
    b.String("general.alignment", "32");
    CHECK(ErrorOf(b.Bytes()) ==
          "t.gguf: metadata key 'general.alignment' must be a uint32, not string");
  }
}

TEST_CASE("gguf refuses malformed tensor infos naming the tensor", "[gguf]") {
  auto one = [](const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                size_t bytes, std::optional<uint64_t> offset = std::nullopt) {
    GgufBuilder b;
    b.Tensor(name, dims, type, std::string(bytes, '\0'), offset);
    return ErrorOf(b.Bytes());
  };
  CHECK(one("w", {4}, 99, 16) == "t.gguf: tensor 'w' has unknown ggml type 99");
  CHECK(one("w", {1, 1, 1, 1, 1}, 0, 4) == "t.gguf: tensor 'w' has 5 dimensions (at most 4)");
  CHECK(one("w", {1ull << 40, 1ull << 40}, 0, 0) ==
        "t.gguf: tensor 'w' has dims [1099511627776, 1099511627776] whose product overflows");
  CHECK(one("w", {1ull << 63}, 0, 0) ==
        "t.gguf: tensor 'w' has dimension 0 = 9223372036854775808, too large");
  CHECK(one("w", {1ull << 61}, 28, 0) ==
        "t.gguf: tensor 'w' has dims [2305843009213693952] whose size in bytes overflows");
  CHECK(one("w", {48}, 8, 34) ==
        "t.gguf: tensor 'w' of type Q8_0 has a row of 48 elements, not a multiple of its "
        "block (32)");
  CHECK(one("w", {}, 8, 34) ==  // a scalar: one element (a fuzz find)
        "t.gguf: tensor 'w' of type Q8_0 has a row of 1 elements, not a multiple of its "
        "block (32)");
  CHECK(one("w", {1024}, 0, 16) ==
        "t.gguf: tensor 'w' (4096 bytes at offset 0 of the data section) lies outside the file "
        "(16 bytes of data)");
  CHECK(one("w", {4}, 0, 16, 8) ==
        "t.gguf: tensor 'w' has offset 8, not a multiple of the alignment 32");
  CHECK(one(std::string(300, 'x'), {4}, 0, 16) ==
        "t.gguf: the name of tensor 0 has an implausible length 300 (at most 255)");
  {
    GgufBuilder b;
    b.F32Tensor("a", {16}, std::vector<float>(16));
    b.Tensor("b", {4}, 0, std::string(16, '\0'), 32);
    CHECK(ErrorOf(b.Bytes()) ==
          "t.gguf: tensor 'b' (offset 32) overlaps tensor 'a' (offset 0, 64 bytes)");
  }
  {
    GgufBuilder b;
    b.F32Tensor("a", {4}, std::vector<float>(4));
    b.F32Tensor("a", {4}, std::vector<float>(4));
    CHECK(ErrorOf(b.Bytes()) == "t.gguf: tensor 'a' appears twice");
  }
}

TEST_CASE("gguf: every truncation of a valid file is an error, never a crash", "[gguf]") {
  GgufBuilder b;
  b.String("general.architecture", "llama");
  b.Strings("tokenizer.ggml.tokens", {"a", "b", "c"});
  b.F32Tensor("w", {8}, std::vector<float>(8, 1.0f));
  const std::string bytes = b.Bytes();
  REQUIRE(Parse(bytes).ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    // A copy of exactly n bytes, so that ASan sees any read past it.
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<long>(n));
    StatusOr<GgufFile> f = GgufFile::FromBytes(prefix.data(), prefix.size(), "t.gguf");
    INFO("length " << n);
    REQUIRE_FALSE(f.ok());
    CHECK(f.status().message().rfind("t.gguf: ", 0) == 0);
  }
  std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + 58);
  CHECK(GgufFile::FromBytes(cut.data(), cut.size(), "t.gguf").status().message() ==
        "t.gguf: truncated: the length of the value of metadata key 'general.architecture' at "
        "byte 56 runs past the end of the file (58 bytes)");
}

TEST_CASE("gguf dequantizes known blocks as ggml does", "[gguf]") {
  std::vector<float> out(32);
  // Q8_0: d = 0.5 (fp16 0x3800), q = -16..15.
  std::string q8 = std::string("\x00\x38", 2);
  for (int i = 0; i < 32; ++i) q8 += static_cast<char>(i - 16);
  DequantizeToF32(GgmlType::kQ8_0, reinterpret_cast<const uint8_t*>(q8.data()), 32, out.data());
  CHECK(out[0] == -8.0f);
  CHECK(out[31] == 7.5f);
  // Q4_0: d = 2, byte i holds element i (low nibble) and i + 16 (high nibble).
  std::string q4 = std::string("\x00\x40", 2);
  for (int i = 0; i < 16; ++i) q4 += static_cast<char>(i | (15 - i) << 4);
  DequantizeToF32(GgmlType::kQ4_0, reinterpret_cast<const uint8_t*>(q4.data()), 32, out.data());
  CHECK(out[0] == -16.0f);
  CHECK(out[15] == 14.0f);
  CHECK(out[16] == 14.0f);
  CHECK(out[31] == -16.0f);
  // Q4_1: d = 1, m = -1 (fp16 0xbc00).
  std::string q41 = std::string("\x00\x3c\x00\xbc", 4);
  for (int i = 0; i < 16; ++i) q41 += static_cast<char>(i | i << 4);
  DequantizeToF32(GgmlType::kQ4_1, reinterpret_cast<const uint8_t*>(q41.data()), 32, out.data());
  CHECK(out[0] == -1.0f);
  CHECK(out[31] == 14.0f);
  CHECK(CanDequantize(GgmlType::kQ6_K));
  CHECK_FALSE(CanDequantize(GgmlType::kQ5_0));
  CHECK(DequantizableTypeNames() == "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K");
}

// A tiny llama (hidden 8, 2 query heads and 1 KV head of 4, 1 layer, vocab 16) written as
// llama.cpp's converter would: Q and K rows permuted, no output.weight (tied).
struct TinyGguf {
  std::vector<float> q, k, embd;  // HF order
  GgufBuilder builder;
};

std::vector<float> Permute(const std::vector<float>& w, int heads, int cols) {
  const int rows = static_cast<int>(w.size()) / cols, hd = rows / heads, half = hd / 2;
  std::vector<float> out(w.size());
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < half; ++i)
        std::copy_n(&w[(h * hd + j * half + i) * cols], cols, &out[(h * hd + 2 * i + j) * cols]);
  return out;
}

TinyGguf MakeTiny(const std::string& arch = "llama") {
  TinyGguf t;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
  };
  GgufBuilder& b = t.builder;
  b.String("general.architecture", arch);
  b.Uint32(arch + ".block_count", 1);
  b.Uint32(arch + ".embedding_length", 8);
  b.Uint32(arch + ".feed_forward_length", 16);
  b.Uint32(arch + ".attention.head_count", 2);
  b.Uint32(arch + ".attention.head_count_kv", 1);
  b.Uint32(arch + ".context_length", 64);
  b.Uint32(arch + ".rope.dimension_count", 4);
  b.Float32(arch + ".rope.freq_base", 100000.0f);
  b.Float32(arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
  b.String("tokenizer.ggml.model", "gpt2");
  std::vector<std::string> tokens;
  for (int i = 0; i < 16; ++i) tokens.push_back("t" + std::to_string(i));
  b.Strings("tokenizer.ggml.tokens", tokens);
  b.Uint32("tokenizer.ggml.bos_token_id", 1);
  b.Uint32("tokenizer.ggml.eos_token_id", 2);
  b.String("tokenizer.chat_template", "{{ messages }}");
  t.embd = random(16 * 8);
  t.q = random(8 * 8);
  t.k = random(4 * 8);
  const bool permuted = arch == "llama";
  b.F32Tensor("token_embd.weight", {8, 16}, t.embd);
  b.F32Tensor("blk.0.attn_norm.weight", {8}, random(8));
  b.F32Tensor("blk.0.attn_q.weight", {8, 8}, permuted ? Permute(t.q, 2, 8) : t.q);
  b.F32Tensor("blk.0.attn_k.weight", {8, 4}, permuted ? Permute(t.k, 1, 8) : t.k);
  b.F32Tensor("blk.0.attn_v.weight", {8, 4}, random(32));
  if (arch == "qwen2") {
    b.F32Tensor("blk.0.attn_q.bias", {8}, random(8));
    b.F32Tensor("blk.0.attn_k.bias", {4}, random(4));
    b.F32Tensor("blk.0.attn_v.bias", {4}, random(4));
  }
  b.F32Tensor("blk.0.attn_output.weight", {8, 8}, random(64));
  b.F32Tensor("blk.0.ffn_norm.weight", {8}, random(8));
  b.F32Tensor("blk.0.ffn_gate.weight", {8, 16}, random(128));
  b.F32Tensor("blk.0.ffn_up.weight", {8, 16}, random(128));
  b.F32Tensor("blk.0.ffn_down.weight", {16, 8}, random(128));
  b.F32Tensor("output_norm.weight", {8}, random(8));
  return t;
}

TEST_CASE("gguf llama loads as a Model with Q/K rows in HF order", "[gguf]") {
  TinyGguf tiny = MakeTiny();
  test::TempDir dir;
  const std::string path = (dir.path() / "Tiny-Llama.Q8.GGUF").string();
  std::ofstream(path, std::ios::binary) << tiny.builder.Bytes();

  StatusOr<ModelConfig> config = LoadModelConfig(path);
  REQUIRE(config.ok());
  CHECK(config->architecture == "LlamaForCausalLM");
  CHECK(config->num_layers == 1);
  CHECK(config->hidden_size == 8);
  CHECK(config->num_kv_heads == 1);
  CHECK(config->head_dim == 4);
  CHECK(config->vocab_size == 16);
  CHECK(config->max_position_embeddings == 64);
  CHECK(config->rope_theta == 100000.0);
  CHECK(config->tie_word_embeddings);
  CHECK_FALSE(config->qkv_bias);
  CHECK(config->bos_token_id == 1);
  CHECK(config->eos_token_ids == std::vector<int>{2});

  StatusOr<std::unique_ptr<Model>> model = Model::Load(path);
  REQUIRE(model.ok());
  REQUIRE((*model)->layer(0).qkv_proj.dtype == WeightDType::kF32);  // auto: GGUF stays float32
  const auto* qkv = static_cast<const float*>((*model)->layer(0).qkv_proj.data);
  CHECK(std::equal(tiny.q.begin(), tiny.q.end(), qkv));
  CHECK(std::equal(tiny.k.begin(), tiny.k.end(), qkv + 64));
  CHECK(std::equal(tiny.embd.begin(), tiny.embd.end(),
                   static_cast<const float*>((*model)->lm_head().data)));

  ModelSection section;
  section.path = path;
  CHECK(ServedModelName(section) == "tiny-llama.q8");
  CHECK(ResolveModelDir(section).value() == path);
  section.path = (dir.path() / "missing.gguf").string();
  CHECK(ResolveModelDir(section).status().message() == "model.path '" + section.path + "': no such file");

  StatusOr<GgufFile> file = GgufFile::Open(path);
  REQUIRE(file.ok());
  StatusOr<GgufVocab> vocab = GgufVocabFromFile(*file);
  REQUIRE(vocab.ok());
  CHECK(vocab->model == "gpt2");
  CHECK(vocab->pre == "default");
  CHECK(vocab->tokens.size() == 16);
  CHECK(vocab->eos_id == 2);
  CHECK(vocab->chat_template == "{{ messages }}");
}

TEST_CASE("gguf qwen2 is not permuted and has q/k/v biases", "[gguf]") {
  TinyGguf tiny = MakeTiny("qwen2");
  const std::string bytes = tiny.builder.Bytes();
  StatusOr<GgufFile> file = Parse(bytes);
  REQUIRE(file.ok());
  StatusOr<ModelConfig> config = ModelConfigFromGguf(*file);
  REQUIRE(config.ok());
  CHECK(config->architecture == "Qwen2ForCausalLM");
  CHECK(config->qkv_bias);
  GgufTensorSource source(std::move(*file), *config);
  std::vector<float> q(64);
  REQUIRE(source.ReadF32("model.layers.0.self_attn.q_proj.weight", std::vector<int64_t>{8, 8}, q).ok());
  CHECK(q == tiny.q);
  CHECK(source.Has("model.layers.0.self_attn.k_proj.bias"));
  CHECK_FALSE(source.Has("lm_head.weight"));
  std::vector<float> wrong(16);
  CHECK(source.ReadF32("model.layers.0.self_attn.k_proj.weight", std::vector<int64_t>{2, 8}, wrong)
            .message() ==
        "tensor 'blk.0.attn_k.weight' has shape [4, 8], expected [2, 8] "
        "(model.layers.0.self_attn.k_proj.weight)");
  CHECK(source.ReadF32("lm_head.weight", std::vector<int64_t>{16, 8}, wrong).message() ==
        "tensor 'output.weight' (lm_head.weight, expected shape [16, 8]) is missing");
}

TEST_CASE("gguf checkpoints Tandem cannot run are refused naming the key or tensor", "[gguf]") {
  auto config_error = [](GgufBuilder b) {
    const std::string bytes = b.Bytes();
    StatusOr<GgufFile> file = Parse(bytes);
    if (!file.ok()) return "parse: " + file.status().message();
    StatusOr<ModelConfig> config = ModelConfigFromGguf(*file);
    return config.ok() ? std::string("(ok)") : config.status().message();
  };
  CHECK(config_error(MakeTiny().builder) == "(ok)");
  CHECK(config_error(MakeTiny("gemma").builder) ==
        "t.gguf: metadata key 'general.architecture' is 'gemma', which is not supported "
        "(supported: llama, qwen2)");
  {
    TinyGguf t = MakeTiny();
    t.builder.F32Tensor("rope_freqs.weight", {2}, {1, 1});
    CHECK(config_error(t.builder) ==
          "t.gguf: tensor 'rope_freqs.weight' (llama3 RoPE frequency scaling) is not supported");
  }
  {
    TinyGguf t = MakeTiny();
    t.builder.String("llama.rope.scaling.type", "yarn");
    CHECK(config_error(t.builder) ==
          "t.gguf: metadata key 'llama.rope.scaling.type' is 'yarn', which is not supported "
          "(supported: none, linear)");
  }
  {
    TinyGguf t = MakeTiny();
    t.builder.F32Tensor("blk.0.attn_q_norm.weight", {4}, {1, 1, 1, 1});
    CHECK(config_error(t.builder) ==
          "t.gguf: tensor 'blk.0.attn_q_norm.weight' is not part of a llama model with 1 layers "
          "(an architecture variant Tandem does not support)");
  }
  {
    TinyGguf t = MakeTiny();
    t.builder.Uint32("llama.expert_count", 8);
    CHECK(config_error(t.builder) ==
          "t.gguf: metadata key 'llama.expert_count' is 8: mixture-of-experts models are not "
          "supported");
  }
  {
    GgufBuilder b;
    b.String("general.architecture", "llama");
    CHECK(config_error(b) == "t.gguf: metadata key 'llama.block_count' is missing");
  }
  {
    TinyGguf t = MakeTiny();
    t.builder.Uint32("llama.rope.dimension_count", 2);  // a second entry: refused as a duplicate
    CHECK(config_error(t.builder) ==
          "parse: t.gguf: metadata key 'llama.rope.dimension_count' appears twice");
  }
  {
    // A tensor type Tandem cannot dequantize: the file reads, the checkpoint is refused.
    TinyGguf t = MakeTiny();
    t.builder.Tensor("output.weight", {8, 16}, 24, std::string(128, '\0'));  // I8
    CHECK(config_error(t.builder) ==
          "t.gguf: tensor 'output.weight' has type I8, which Tandem cannot dequantize (supported: "
          "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)");
  }
  {
    TinyGguf t = MakeTiny();
    t.builder.F32Tensor("output.weight", {8, 15}, std::vector<float>(120));
    CHECK(config_error(t.builder) ==
          "t.gguf: tensor 'output.weight' has shape [15, 8], expected [16, 8] from the metadata");
  }
  {
    GgufBuilder b;
    b.String("general.architecture", "llama");
    b.Uint32("llama.block_count", 1);
    b.Uint32("llama.embedding_length", 8);
    b.Uint32("llama.feed_forward_length", 16);
    b.Uint32("llama.attention.head_count", 2);
    b.Uint32("llama.context_length", 64);
    b.Float32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    b.F32Tensor("token_embd.weight", {8, 4}, std::vector<float>(32));
    CHECK(config_error(b) == "t.gguf: tensor 'output_norm.weight' is missing");
  }
}

TEST_CASE("gguf model.path must be a .gguf file or a checkpoint directory", "[gguf]") {
  test::TempDir dir;
  ModelSection section;
  section.path = dir.Write("weights.bin", "x");
  CHECK(ResolveModelDir(section).status().message() ==
        "model.path '" + section.path +
            "' is a file but not a .gguf file (a Hugging Face checkpoint is the directory holding "
            "config.json)");
  section.path = dir.Write("broken.gguf", "GGUF");
  StatusOr<std::unique_ptr<Model>> model = Model::Load(section.path);
  REQUIRE_FALSE(model.ok());
  CHECK(model.status().message() == section.path +
                                        ": truncated: the version at byte 4 runs past the end of "
                                        "the file (4 bytes)");
}

}  // namespace
}  // namespace tandem
