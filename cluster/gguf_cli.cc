#include "cluster/gguf_cli.h"

#include <cstdio>
#include <fstream>

#include "common/base/flags.h"
#include "common/model/gguf.h"
#include "common/model/gguf_checkpoint.h"
#include "common/model/gguf_quants.h"

namespace tandem {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "tandem gguf: %s\n", message.c_str());
  return kExitFailure;
}

void PrintFile(const GgufFile& file, size_t max_items) {
  std::printf("%s: GGUF v%u, %zu metadata keys, %zu tensors, alignment %llu, data at byte %llu "
              "(%llu bytes in all)\n",
              file.path().c_str(), file.version(), file.metadata().size(), file.tensors().size(),
              static_cast<unsigned long long>(file.alignment()),
              static_cast<unsigned long long>(file.data_offset()),
              static_cast<unsigned long long>(file.file_size()));
  std::printf("\nmetadata:\n");
  for (const auto& [key, value] : file.metadata()) {
    const std::string type = value.is_array() ? "array" : GgufValueTypeName(value.type());
    std::printf("  %-44s %-8s %s\n", key.c_str(), type.c_str(),
                value.ToString(max_items).c_str());
  }
  std::printf("\ntensors:\n  %-32s %-7s %-20s %14s %12s\n", "name", "type", "shape", "offset",
              "bytes");
  for (const GgufTensorInfo& t : file.tensors()) {
    std::printf("  %-32s %-7s %-20s %14llu %12llu\n", t.name.c_str(),
                std::string(FindGgmlType(static_cast<uint32_t>(t.type))->name).c_str(),
                ShapeToString(t.Shape()).c_str(), static_cast<unsigned long long>(t.offset),
                static_cast<unsigned long long>(t.size_bytes));
  }
  StatusOr<ModelConfig> config = ModelConfigFromGguf(file);
  if (!config.ok()) {
    std::printf("\nTandem cannot serve it: %s\n", config.status().message().c_str());
    return;
  }
  const ModelConfig& c = *config;
  std::printf("\nas a Tandem model: %s, %d layers, hidden %d, intermediate %d, %d heads / %d KV "
              "heads of %d, vocab %d, context %d, rope_theta %g, rms_norm_eps %g, %s embeddings, "
              "%.1fM parameters\n",
              c.architecture.c_str(), c.num_layers, c.hidden_size, c.intermediate_size,
              c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size, c.max_position_embeddings,
              c.rope_theta, c.rms_norm_eps, c.tie_word_embeddings ? "tied" : "untied",
              static_cast<double>(c.NumParameters()) / 1e6);
}

int WriteTensor(const GgufFile& file, const std::string& name, const std::string& out) {
  const GgufTensorInfo* t = file.FindTensor(name);
  if (t == nullptr) return Fail(file.path() + ": no tensor '" + name + "'");
  if (!CanDequantize(t->type))
    return Fail(file.path() + ": tensor '" + name + "' has type " +
                std::string(FindGgmlType(static_cast<uint32_t>(t->type))->name) +
                ", which Tandem cannot dequantize (supported: " + DequantizableTypeNames() + ")");
  std::vector<float> values(t->num_elements);
  DequantizeToF32(t->type, t->data, values.size(), values.data());
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(values.data()),
          static_cast<std::streamsize>(values.size() * sizeof(float)));
  f.close();
  if (!f) return Fail("cannot write " + out);
  std::printf("wrote %s: %s %s as %zu fp32 values\n", out.c_str(), name.c_str(),
              ShapeToString(t->Shape()).c_str(), values.size());
  return kExitOk;
}

}  // namespace

int GgufMain(const std::vector<std::string>& args) {
  FlagParser flags("tandem gguf FILE [flags]",
                   "Prints a GGUF file's metadata and tensor table, and whether Tandem can serve "
                   "it; with --tensor and --out, writes one tensor dequantized to fp32.");
  flags.AddInt("max-items", 8, "array items printed per metadata key");
  flags.AddString("tensor", "", "a tensor to write dequantized (needs --out)");
  flags.AddString("out", "", "where --tensor's fp32 values go (raw, little endian, row-major)");
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "tandem gguf: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (flags.positional().size() != 1) {
    std::fprintf(stderr, "tandem gguf: give exactly one FILE (see tandem gguf --help)\n");
    return kExitUsage;
  }
  if (flags.GetString("tensor").empty() != flags.GetString("out").empty()) {
    std::fprintf(stderr, "tandem gguf: --tensor and --out go together\n");
    return kExitUsage;
  }
  if (flags.GetInt("max-items") < 0) {
    std::fprintf(stderr, "tandem gguf: --max-items must not be negative\n");
    return kExitUsage;
  }
  StatusOr<GgufFile> file = GgufFile::Open(flags.positional()[0]);
  if (!file.ok()) return Fail(file.status().message());
  if (!flags.GetString("tensor").empty())
    return WriteTensor(*file, flags.GetString("tensor"), flags.GetString("out"));
  PrintFile(*file, static_cast<size_t>(flags.GetInt("max-items")));
  return kExitOk;
}

}  // namespace tandem
