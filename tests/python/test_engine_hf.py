"""The engine against Hugging Face transformers, the reference users trust.

For a tiny Llama (GQA, llama3 RoPE scaling, untied head) and a tiny Qwen2 (qkv bias, tied
embeddings) written by `tandem make-model`:
  - AutoModelForCausalLM.from_pretrained loads the directory unmodified, with no missing,
    unexpected or mis-shaped weights;
  - our logits (`tandem generate --dump-logits`) match HF's eager fp32 logits at every prompt
    position (prefill) and for 32 decode steps;
  - greedy tokens are identical to HF generate.
Relative error of a logits vector: max|ours - hf| / max|hf| (infinity norms), required < 1e-4.
Variants: chunked prefill and another KV block size must give the same tokens and logits. A
Mistral config (sliding window shorter than the prompt) over the tiny Llama's weights checks the
window mask. A small model stored in bf16 is a smoke test (upcast to fp32 on both sides); medium runs when
TANDEM_TEST_MEDIUM=1.
Weight storage (model.dtype): the tiny Llama's fp32 checkpoint run with --dtype bfloat16 and
--dtype float16 against HF with the same matrices rounded (Linear and Embedding weights
through bf16/f16 and back; norms stay fp32 on both sides): the same
1e-4 tolerance and identical greedy tokens, since only the storage is rounded and the arithmetic
stays fp32 on both sides. The error against HF's unrounded fp32 model is printed beside it.

Run: TANDEM_BINARY=build/tandem .venv/bin/python tests/python/test_engine_hf.py
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from cluster_util import FAILURES, report

BINARY = os.environ.get("TANDEM_BINARY", "build/tandem")
TOLERANCE = 1e-4
DECODE_STEPS = 32


def rel_err(ours, ref):
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def make_model(out, preset, family, seed, dtype="f32"):
    subprocess.run([BINARY, "make-model", "--preset", preset, "--family", family, "--out", out,
                    "--seed", str(seed), "--dtype", dtype], check=True)


def run_ours(model_dir, prompt, max_tokens, extra=()):
    dump = os.path.join(model_dir, "ours.bin")
    proc = subprocess.run(
        [BINARY, "generate", "--model", model_dir, "--prompt-ids", ",".join(map(str, prompt)),
         "--max-tokens", str(max_tokens), "--ignore-eos", "--all-positions", "--threads", "2",
         "--dump-logits", dump, *extra],
        check=True, capture_output=True, text=True)
    ids = None
    for line in proc.stdout.splitlines():
        if line.startswith("generated_ids:"):
            ids = [int(x) for x in line.split()[1:]]
    return ids, np.fromfile(dump, dtype=np.float32)


def load_hf(model_dir):
    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager", torch_dtype=torch.float32,
        output_loading_info=True)
    model.eval()
    problems = {k: v for k, v in info.items() if v}
    report(not problems, f"{model_dir}: from_pretrained loads every weight {problems or ''}")
    return model


def compare(name, model_dir, prompt, steps, variants=(), ours_extra=(), hf_round=None):
    model = load_hf(model_dir)
    if hf_round is not None:  # the weights our storage holds: rounded, then fp32 arithmetic
        with torch.no_grad():
            unrounded = model(torch.tensor([prompt])).logits[0, -1].float().numpy()
        # Our storage rounds the matrices (projections, embedding, LM head); norms and biases
        # stay fp32.
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                    module.weight.copy_(module.weight.to(hf_round).to(torch.float32))
    vocab = model.config.vocab_size
    model.generation_config.eos_token_id = None  # run all steps, as --ignore-eos does
    with torch.no_grad():
        gen = model.generate(torch.tensor([prompt]), max_new_tokens=steps + 1, do_sample=False,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        hf_tokens = gen.sequences[0, len(prompt):].tolist()
        hf_step_logits = np.stack([l[0].float().numpy() for l in gen.logits])  # cached decode
        full = model(gen.sequences[:, :-1]).logits[0].float().numpy()  # one pass, no cache

    ours_tokens, ours = run_ours(model_dir, prompt, steps + 1, ours_extra)
    ours = ours.reshape(-1, vocab)
    if hf_round is not None:
        print(f"      {name}: last prompt position vs HF's unrounded fp32 weights: rel err "
              f"{rel_err(ours[len(prompt) - 1], unrounded):.2e} (the storage's rounding)")
    report(ours.shape[0] == len(prompt) + steps,
          f"{name}: {ours.shape[0]} logits rows (prompt {len(prompt)} + {steps} decode)")
    prefill_err = max(rel_err(ours[i], full[i]) for i in range(len(prompt)))
    decode_err = max(rel_err(ours[len(prompt) + i], full[len(prompt) + i]) for i in range(steps))
    cached_err = max(rel_err(ours[len(prompt) - 1 + i], hf_step_logits[i])
                     for i in range(steps + 1))
    report(prefill_err < TOLERANCE, f"{name}: prefill max rel err {prefill_err:.2e} (all {len(prompt)} positions)")
    report(decode_err < TOLERANCE, f"{name}: decode max rel err {decode_err:.2e} over {steps} steps")
    report(cached_err < TOLERANCE, f"{name}: vs HF generate's cached-decode logits {cached_err:.2e}")
    report(ours_tokens == hf_tokens, f"{name}: greedy tokens identical ({len(hf_tokens)} tokens)")
    if ours_tokens != hf_tokens:
        print("  ours", ours_tokens, "\n  hf  ", hf_tokens)
    for extra in variants:
        tokens, logits = run_ours(model_dir, prompt, steps + 1, (*ours_extra, *extra))
        logits = logits.reshape(-1, vocab)[-(steps + 1):]
        err = max(rel_err(logits[i], full[len(prompt) - 1 + i]) for i in range(steps + 1))
        report(tokens == hf_tokens and err < TOLERANCE,
              f"{name} {' '.join(extra)}: same tokens, max rel err {err:.2e}")


def main():
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        llama = os.path.join(tmp, "tiny-llama")
        make_model(llama, "tiny", "llama", 1)
        cfg = AutoModelForCausalLM.from_pretrained(llama).config
        report(cfg.num_key_value_heads < cfg.num_attention_heads and
              cfg.rope_scaling["rope_type"] == "llama3", "tiny llama has GQA and llama3 RoPE")
        prompt = rng.integers(0, 2000, size=45).tolist()  # crosses two 16-token blocks
        compare("tiny llama", llama, prompt, DECODE_STEPS,
                variants=[("--prefill-chunk", "7"), ("--block-size", "5")])
        compare("tiny llama --dtype bfloat16", llama, prompt, DECODE_STEPS,
                variants=[("--prefill-chunk", "7")], ours_extra=("--dtype", "bfloat16"),
                hf_round=torch.bfloat16)
        compare("tiny llama --dtype float16", llama, prompt, DECODE_STEPS,
                ours_extra=("--dtype", "float16"), hf_round=torch.float16)

        qwen = os.path.join(tmp, "tiny-qwen2")
        make_model(qwen, "tiny", "qwen2", 2)
        m = AutoModelForCausalLM.from_pretrained(qwen)
        report(m.model.layers[0].self_attn.q_proj.bias is not None and
              m.config.tie_word_embeddings, "tiny qwen2 has qkv bias and tied embeddings")
        del m
        prompt = rng.integers(0, 2000, size=33).tolist()
        compare("tiny qwen2", qwen, prompt, DECODE_STEPS, variants=[("--prefill-chunk", "16")])

        # Mistral: the tiny Llama's weights under a MistralForCausalLM config with a sliding
        # window shorter than the prompt, so the window mask is exercised.
        mistral = os.path.join(tmp, "tiny-mistral")
        os.makedirs(mistral)
        shutil.copy(os.path.join(llama, "model.safetensors"), mistral)
        with open(os.path.join(llama, "config.json")) as f:
            cfg = json.load(f)
        for key in ("rope_scaling", "attention_bias", "mlp_bias", "pretraining_tp"):
            cfg.pop(key, None)
        cfg.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=12,
                   rope_theta=10000.0)
        with open(os.path.join(mistral, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        compare("tiny mistral (sliding window 12)", mistral,
                rng.integers(0, 2000, size=30).tolist(), 8)

        small = os.path.join(tmp, "small-qwen2-bf16")
        make_model(small, "small", "qwen2", 3, dtype="bf16")
        compare("small qwen2 bf16", small, rng.integers(0, 7000, size=40).tolist(), 4)

        if os.environ.get("TANDEM_TEST_MEDIUM") == "1":
            medium = os.path.join(tmp, "medium-llama")
            make_model(medium, "medium", "llama", 4)
            compare("medium llama", medium, rng.integers(0, 7000, size=64).tolist(), 4)

    if FAILURES:
        print(f"{len(FAILURES)} report(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
