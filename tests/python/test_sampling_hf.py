"""Compares Tandem's logits processing with Hugging Face transformers' warpers.

For seeded random logit vectors and parameter sets, HF's RepetitionPenaltyLogitsProcessor,
TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper and MinPLogitsWarper (applied in
the order `generate` applies them, each only when `generate` would add it) must keep the same
tokens as tandem::Sampler::Process and give the same renormalised probabilities (to 1e-5).

Our side runs as the hidden Catch2 test "[.hf_sampling_cases]" of tandem_unit_tests, which
reads hf_cases.json from $TANDEM_TEST_DIR and writes tandem_results.json there.
Exit status 0 = pass.
"""

import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

PROB_TOLERANCE = 1e-5
# A token whose top-p cumulative mass or min-p ratio lies this close to the cut may land on
# either side from float32 (torch) versus float64 (ours) rounding; such a case is reported but
# not failed. Random logits essentially never hit it.
BORDER_TOLERANCE = 1e-6


def make_cases():
    gen = torch.Generator().manual_seed(1234)
    param_sets = [
        dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0),
        dict(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0),
        dict(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0, repetition_penalty=1.0),
        dict(temperature=1.0, top_k=1, top_p=1.0, min_p=0.0, repetition_penalty=1.0),
        dict(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0, repetition_penalty=1.0),
        dict(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0, repetition_penalty=1.0),
        dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.05, repetition_penalty=1.0),
        dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3, repetition_penalty=1.0),
        dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.3),
        dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=0.8),
        dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.0, repetition_penalty=1.1),
        dict(temperature=1.5, top_k=50, top_p=0.8, min_p=0.1, repetition_penalty=1.2),
        dict(temperature=0.3, top_k=0, top_p=0.7, min_p=0.02, repetition_penalty=1.5),
        dict(temperature=2.0, top_k=200, top_p=0.99, min_p=0.0, repetition_penalty=1.0),
    ]
    cases = []
    for vocab, scale in [(64, 1.0), (1000, 3.0), (32000, 2.0)]:
        for params in param_sets:
            for _ in range(3):
                logits = torch.randn(vocab, generator=gen) * scale
                prompt = torch.randint(0, vocab, (int(torch.randint(1, 20, (1,), generator=gen)),),
                                       generator=gen)
                output = torch.randint(0, vocab, (int(torch.randint(0, 10, (1,), generator=gen)),),
                                       generator=gen)
                cases.append(dict(params, logits=logits.tolist(), prompt_tokens=prompt.tolist(),
                                  output_tokens=output.tolist()))
    return cases


def hf_process(case):
    """Returns (scores after HF processing, scores that entered top-p or None)."""
    scores = torch.tensor(case["logits"], dtype=torch.float32).unsqueeze(0)
    input_ids = torch.tensor(case["prompt_tokens"] + case["output_tokens"],
                             dtype=torch.long).unsqueeze(0)
    # As GenerationMixin._get_logits_processor / _get_logits_warper (4.44) add them.
    steps = []
    if case["repetition_penalty"] != 1.0:
        steps.append(RepetitionPenaltyLogitsProcessor(penalty=case["repetition_penalty"]))
    if case["temperature"] != 1.0:
        steps.append(TemperatureLogitsWarper(case["temperature"]))
    if case["top_k"] != 0:
        steps.append(TopKLogitsWarper(top_k=case["top_k"], min_tokens_to_keep=1))
    if case["top_p"] < 1.0:
        steps.append(TopPLogitsWarper(top_p=case["top_p"], min_tokens_to_keep=1))
    if case["min_p"] > 0.0:
        steps.append(MinPLogitsWarper(min_p=case["min_p"], min_tokens_to_keep=1))
    before_top_p = None
    for step in steps:
        if isinstance(step, TopPLogitsWarper):
            before_top_p = scores[0].clone()
        scores = step(input_ids, scores)
    return scores[0], before_top_p


def near_border(case, hf_scores, before_top_p):
    """True when some token sits within BORDER_TOLERANCE of a top-p or min-p cut."""
    if before_top_p is not None:
        ascending = torch.softmax(before_top_p.double(), dim=0).sort().values.cumsum(0)
        if ((ascending - (1.0 - case["top_p"])).abs() < BORDER_TOLERANCE).any():
            return True
    finite = hf_scores[torch.isfinite(hf_scores)]
    if finite.numel() == 0:
        return False
    probs = torch.softmax(finite.double(), dim=0)
    if case["min_p"] > 0.0:
        ratio = probs / probs.max()
        if ((ratio - case["min_p"]).abs() < BORDER_TOLERANCE).any():
            return True
    return False


def main():
    build_dir = os.environ.get("TANDEM_BUILD_DIR")
    if not build_dir:
        print("TANDEM_BUILD_DIR is not set (run through ctest)", file=sys.stderr)
        return 1
    binary = os.path.join(build_dir, "tests", "tandem_unit_tests")
    cases = make_cases()
    with tempfile.TemporaryDirectory(prefix="tandem_hf_sampling_") as tmp:
        with open(os.path.join(tmp, "hf_cases.json"), "w") as f:
            json.dump(cases, f)
        env = dict(os.environ, TANDEM_TEST_DIR=tmp)
        run = subprocess.run([binary, "[.hf_sampling_cases]"], env=env, capture_output=True,
                             text=True, timeout=600)
        if run.returncode != 0:
            print(run.stdout, run.stderr, sep="\n", file=sys.stderr)
            print(f"FAIL: {binary} exited {run.returncode}", file=sys.stderr)
            return 1
        with open(os.path.join(tmp, "tandem_results.json")) as f:
            results = json.load(f)

    if len(results) != len(cases):
        print(f"FAIL: {len(cases)} cases but {len(results)} results", file=sys.stderr)
        return 1
    failures = 0
    borderline = 0
    max_err = 0.0
    for i, (case, ours) in enumerate(zip(cases, results)):
        hf_scores, before_top_p = hf_process(case)
        hf_kept = torch.isfinite(hf_scores)
        hf_probs = torch.softmax(hf_scores.double(), dim=0)
        hf_set = set(torch.nonzero(hf_kept).flatten().tolist())
        our_set = set(ours["token_ids"])
        label = {k: case[k] for k in ("temperature", "top_k", "top_p", "min_p",
                                      "repetition_penalty")}
        label["vocab"] = len(case["logits"])
        if hf_set != our_set:
            if near_border(case, hf_scores, before_top_p):
                borderline += 1
                print(f"case {i} {label}: kept sets differ at a rounding border "
                      f"(only HF: {sorted(hf_set - our_set)[:10]}, "
                      f"only ours: {sorted(our_set - hf_set)[:10]})")
                continue
            failures += 1
            print(f"FAIL case {i} {label}: kept sets differ: HF keeps {len(hf_set)}, we keep "
                  f"{len(our_set)}; only HF: {sorted(hf_set - our_set)[:10]}, "
                  f"only ours: {sorted(our_set - hf_set)[:10]}", file=sys.stderr)
            continue
        for token, p in zip(ours["token_ids"], ours["probs"]):
            err = abs(p - float(hf_probs[token]))
            max_err = max(max_err, err)
            if err > PROB_TOLERANCE:
                failures += 1
                print(f"FAIL case {i} {label}: token {token}: ours {p}, HF "
                      f"{float(hf_probs[token])}", file=sys.stderr)
                break
    print(f"{len(cases)} cases, {failures} failures, {borderline} at a rounding border, "
          f"max prob error {max_err:.3g}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
