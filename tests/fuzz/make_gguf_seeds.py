"""Writes the gguf_file fuzz target's seeds (tests/fuzz/README.md) with the `gguf` package's
GGUFWriter: tiny llama and qwen2 checkpoints (every metadata type a real file has, a tokenizer,
permuted Q/K, F32/F16/Q8_0/Q4_0/Q4_1 weights), one tensor of each K-quant and BF16, and a file with
a non-default alignment. Each stays far below run.sh's -max_len (64 KiB).

Run: .venv/bin/python tests/fuzz/make_gguf_seeds.py tests/fuzz/corpus/gguf_file
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize


def finish(writer):
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_model(path, arch, rng, weight_type):
    hidden, inter, heads, kv_heads, vocab = 32, 64, 4, 2, 8
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm" if arch == "llama" else "qwen2")
    w.add_token_list(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "ab", "Ġ", "Ġa"])
    w.add_token_types([3, 3, 3, 1, 1, 1, 1, 1])
    w.add_token_merges(["a b", "Ġ a"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")

    def add(name, rows, cols):
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        if weight_type == Q.F32 or cols % 32 != 0 or rows == 1:
            w.add_tensor(name, x.reshape(-1) if rows == 1 else x)
        elif weight_type == Q.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, quantize(x, weight_type), raw_dtype=weight_type)

    hd = hidden // heads
    add("token_embd.weight", vocab, hidden)
    add("blk.0.attn_norm.weight", 1, hidden)
    add("blk.0.attn_q.weight", heads * hd, hidden)
    add("blk.0.attn_k.weight", kv_heads * hd, hidden)
    add("blk.0.attn_v.weight", kv_heads * hd, hidden)
    if arch == "qwen2":
        add("blk.0.attn_q.bias", 1, heads * hd)
        add("blk.0.attn_k.bias", 1, kv_heads * hd)
        add("blk.0.attn_v.bias", 1, kv_heads * hd)
    add("blk.0.attn_output.weight", hidden, heads * hd)
    add("blk.0.ffn_norm.weight", 1, hidden)
    add("blk.0.ffn_gate.weight", inter, hidden)
    add("blk.0.ffn_up.weight", inter, hidden)
    add("blk.0.ffn_down.weight", hidden, inter)
    add("output_norm.weight", 1, hidden)
    if arch == "qwen2":
        add("output.weight", vocab, hidden)
    finish(w)


def types_file(path, rng):
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -3)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_int64("t.i64", -(1 << 40))
    w.add_uint64("t.u64", 1 << 50)
    w.add_float64("t.f64", 0.125)
    w.add_bool("t.bool", True)
    w.add_array("t.floats", [0.5, 1.5])
    for qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        size = gguf.GGML_QUANT_SIZES[qtype][1]
        raw = rng.integers(0, 256, size=(1, size), dtype=np.uint8)
        raw[0, 0:2] = np.array([0.01], np.float16).view(np.uint8)
        w.add_tensor(qtype.name.lower(), raw, raw_dtype=qtype)
    w.add_tensor("bf16", quantize(rng.standard_normal((2, 8)).astype(np.float32), Q.BF16),
                 raw_dtype=Q.BF16)
    finish(w)


def aligned_file(path, rng):
    w = gguf.GGUFWriter(path, "llama")
    w.add_custom_alignment(64)
    w.add_tensor("a", rng.standard_normal(3).astype(np.float32))
    w.add_tensor("b", rng.standard_normal((2, 5)).astype(np.float32))
    finish(w)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/gguf_file"
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    tiny_model(os.path.join(out, "llama_f32.gguf"), "llama", rng, Q.F32)
    tiny_model(os.path.join(out, "llama_q8_0.gguf"), "llama", rng, Q.Q8_0)
    tiny_model(os.path.join(out, "llama_q4_1.gguf"), "llama", rng, Q.Q4_1)
    tiny_model(os.path.join(out, "qwen2_f16.gguf"), "qwen2", rng, Q.F16)
    tiny_model(os.path.join(out, "qwen2_q4_0.gguf"), "qwen2", rng, Q.Q4_0)
    types_file(os.path.join(out, "types.gguf"), rng)
    aligned_file(os.path.join(out, "aligned64.gguf"), rng)
    for name in sorted(os.listdir(out)):
        print(f"{os.path.join(out, name)}: {os.path.getsize(os.path.join(out, name))} bytes")


if __name__ == "__main__":
    main()
