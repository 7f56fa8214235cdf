#include "common/model/checkpoint.h"

#include <utility>

#include "common/model/gguf.h"
#include "common/model/gguf_checkpoint.h"
#include "common/model/safetensors.h"
#include "common/text/gguf_vocab.h"

namespace tandem {

StatusOr<Checkpoint> OpenCheckpoint(const std::string& path) {
  Checkpoint checkpoint;
  if (IsGgufPath(path)) {
    TANDEM_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path));
    TANDEM_ASSIGN_OR_RETURN(checkpoint.config, ModelConfigFromGguf(file));
    checkpoint.tensors = std::make_unique<GgufTensorSource>(std::move(file), checkpoint.config);
    return checkpoint;
  }
  TANDEM_ASSIGN_OR_RETURN(checkpoint.config, LoadModelConfig(path));
  TANDEM_ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::OpenDir(path));
  checkpoint.tensors = std::make_unique<SafetensorsReader>(std::move(reader));
  return checkpoint;
}

StatusOr<Tokenizer> LoadCheckpointTokenizer(const std::string& path) {
  if (!IsGgufPath(path)) return Tokenizer::Load(path);
  TANDEM_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path));
  TANDEM_ASSIGN_OR_RETURN(GgufVocab vocab, GgufVocabFromFile(file));
  return TokenizerFromGguf(vocab, path);
}

}  // namespace tandem
