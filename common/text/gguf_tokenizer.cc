// TEMPORARY placeholder until branch tok lands (it implements TokenizerFromGguf here): GGUF
// checkpoints load, but their tokenizer is refused with a message saying so.
#include "common/text/gguf_vocab.h"

namespace tandem {

StatusOr<Tokenizer> TokenizerFromGguf(const GgufVocab& vocab, std::string_view source) {
  (void)vocab;
  return FailedPrecondition(std::string(source) +
                            ": the tokenizer from GGUF metadata is not implemented yet");
}

}  // namespace tandem
