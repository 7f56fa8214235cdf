"""SmolLM2-135M-Instruct from its GGUF file (the default model) against Hugging Face transformers.

Tandem loads the GGUF file itself (`tandem generate --model FILE.gguf`: dequantized on load, Q/K
rows un-permuted). The reference is transformers' LlamaForCausalLM (eager attention, fp32) built
from the same file with the `gguf` package: every tensor dequantized with gguf.quants.dequantize,
attn_q/attn_k rows permuted back to HF order, tied embeddings, the config from the metadata.
For 10 chat prompts (SmolLM2's own template, rendered by jinja2 as transformers does, tokenized by
the HF tokenizer built from the same metadata) both generate 48 tokens greedily: the tokens must
be identical, and the largest relative logit error max|ours - hf| / max|hf| over every step is
reported (and must stay below 1e-3). HF's side is one forward pass over the prompt and Tandem's
tokens: its argmax after every prefix equal to Tandem's token means HF's greedy decoding produces
the same tokens (one pass instead of 48 cached steps keeps the test short; HF's generate
checks that once). Tandem's load time of
the file is reported too.

Run: TANDEM_BINARY=build/tandem .venv/bin/python tests/python/test_gguf_smollm2.py
"""
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smollm2_util  # noqa: E402
from cluster_util import FAILURES, report  # noqa: E402

BINARY = os.environ.get("TANDEM_BINARY", "build/tandem")
STEPS = 48
TOLERANCE = 1e-3
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three primary colors.",
    "How many legs does a spider have?",
    "Translate 'good morning' into Spanish.",
    "Give me a tip for staying focused while studying.",
    "What is 12 times 7?",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
]


def unpermute(w, n_head):
    """Inverse of llama.cpp convert_hf_to_gguf.py LlamaModel.permute (rows of Q or K)."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def build_hf_model(path):
    import gguf
    import torch
    from gguf.quants import dequantize
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_utils import no_init_weights

    reader = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items()}
    heads = meta["llama.attention.head_count"]
    kv_heads = meta["llama.attention.head_count_kv"]
    config = LlamaConfig(
        vocab_size=len(meta["tokenizer.ggml.tokens"]),
        hidden_size=meta["llama.embedding_length"],
        intermediate_size=meta["llama.feed_forward_length"],
        num_hidden_layers=meta["llama.block_count"],
        num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=meta["llama.context_length"],
        rope_theta=float(meta["llama.rope.freq_base"]),
        rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
        tie_word_embeddings=True, hidden_act="silu", attn_implementation="eager",
        bos_token_id=meta["tokenizer.ggml.bos_token_id"],
        eos_token_id=meta["tokenizer.ggml.eos_token_id"])
    names = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    state = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape.tolist())])
        parts = t.name.split(".")
        if t.name == "token_embd.weight":
            state["model.embed_tokens.weight"] = w
        elif t.name == "output_norm.weight":
            state["model.norm.weight"] = w
        elif parts[0] == "blk":
            if parts[2] == "attn_q":
                w = unpermute(w, heads)
            elif parts[2] == "attn_k":
                w = unpermute(w, kv_heads)
            state[f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"] = w
        else:
            raise ValueError(f"unexpected tensor {t.name}")
    with no_init_weights():  # every weight is loaded below; random init would take seconds
        model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embedding
    report(not missing and not unexpected,
          f"HF model from the dequantized GGUF (missing {missing}, unexpected {unexpected})")
    model.tie_weights()
    model.eval()
    return model, meta


def run_ours(path, prompt, tmp):
    dump = os.path.join(tmp, "logits.bin")
    proc = subprocess.run(
        [BINARY, "generate", "--model", path, "--prompt-ids", ",".join(map(str, prompt)),
         "--max-tokens", str(STEPS), "--ignore-eos", "--threads", "2", "--dump-logits", dump],
        capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"tandem generate failed: {proc.stderr.strip()}")
    ids = next(
        [int(x) for x in line.split()[1:]] for line in proc.stdout.splitlines()
        if line.startswith("generated_ids:"))
    load_ms = float(re.search(r"model: loaded .* in (\d+) ms", proc.stderr).group(1))
    return ids, np.fromfile(dump, dtype=np.float32), load_ms


def main():
    try:
        path = smollm2_util.gguf_path()
    except FileNotFoundError as e:
        print(f"skip: {e}")
        return 77
    import torch
    torch.set_num_threads(2)
    started = time.time()
    model, meta = build_hf_model(path)
    tokenizer = smollm2_util.hf_tokenizer(meta)
    print(f"reference model built in {time.time() - started:.1f} s", flush=True)
    vocab = model.config.vocab_size
    worst = 0.0
    load_times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(PROMPTS):
            rendered = smollm2_util.render_chat([{"role": "user", "content": text}], meta=meta)
            prompt = tokenizer.encode(rendered, add_special_tokens=False).ids
            ours_tokens, ours, load_ms = run_ours(path, prompt, tmp)
            # One HF forward pass over prompt + our tokens gives HF's logits after every prefix
            # of our generation; its argmax at each step is what HF's greedy decoding picks given
            # the same prefix, so equal argmaxes at every step mean HF greedy-generates exactly
            # our tokens (by induction), at the cost of one pass instead of 48 cached steps.
            with torch.no_grad():
                sequence = torch.tensor([prompt + ours_tokens[:-1]])
                hf_logits = model(sequence).logits[0, len(prompt) - 1:].float().numpy()
            hf_tokens = hf_logits.argmax(axis=-1).tolist()
            load_times.append(load_ms)
            ours = ours.reshape(-1, vocab)
            n = min(len(ours), len(hf_logits))
            err = max(float(np.abs(ours[s] - hf_logits[s]).max() / np.abs(hf_logits[s]).max())
                      for s in range(n))
            worst = max(worst, err)
            same = ours_tokens == hf_tokens
            report(same and n == STEPS,
                  f"prompt {i} ({len(prompt)} tokens): {STEPS} greedy tokens identical, max rel "
                  f"logit err {err:.2e}")
            if not same:
                first = next(k for k in range(min(len(ours_tokens), len(hf_tokens)))
                             if ours_tokens[k] != hf_tokens[k])
                print(f"  first difference at step {first}\n  ours {ours_tokens}\n  hf   {hf_tokens}")
            if i == 0:
                print("  answer:", repr(tokenizer.decode(hf_tokens)))
                # Once, HF's own generate (cached decode) as the cross-check of the argmaxes.
                with torch.no_grad():
                    gen = model.generate(torch.tensor([prompt]), max_new_tokens=STEPS,
                                         do_sample=False, eos_token_id=None, pad_token_id=0)
                generated = gen[0, len(prompt):].tolist()
                report(generated == ours_tokens,
                      f"prompt 0: HF generate's {STEPS} greedy tokens equal ours")
    report(worst < TOLERANCE, f"largest relative logit error over {len(PROMPTS)} prompts x {STEPS} "
                             f"steps: {worst:.2e} (< {TOLERANCE:g})")
    print(f"tandem GGUF load time (dequantize to fp32): median {np.median(load_times):.0f} ms, "
          f"min {min(load_times):.0f} ms over {len(load_times)} loads; test ran "
          f"{time.time() - started:.0f} s")
    if FAILURES:
        print(f"{len(FAILURES)} report(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
