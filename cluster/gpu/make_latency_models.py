#!/usr/bin/env python3
"""Writes the GPU latency models in this folder from first principles (no GPU needed).

    python3 cluster/gpu/make_latency_models.py     # rewrites h100-opt13b.yaml, a100-opt13b.yaml

The formulas are the ones spelled out in h100-opt13b.yaml's header (DistServe's latency form,
common/engine/latency_model.h); only the GPU's peak numbers differ between the files. a100-opt13b.yaml
is the hardware DistServe (OSDI'24) measured OPT-13B on: 8x A100-80GB SXM per node.
"""
import os

MODEL = dict(name="opt-13b", params=13e9, layers=40, hidden=5120, bytes_per_param=2)
GPUS = {
    "h100": dict(title="H100 SXM 80GB", flops=990e12, hbm=3.35e12, link=300e9),
    "a100": dict(title="A100 SXM 80GB", flops=312e12, hbm=2.039e12, link=200e9),
}
MFU = {1: 0.55, 2: 0.52, 4: 0.48, 8: 0.42}  # thinner GEMMs at higher tensor degree
HBM_EFFICIENCY = 0.75
ALLREDUCE_LATENCY_S = 8e-6  # per all-reduce (2 per layer)
HOP_LATENCY_S = 20e-6       # per pipeline hop
SHAPES = [(tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4) if tp * pp <= 16]


def entry(gpu, tp, pp):
    m = MODEL
    flops_per_token = 2 * m["params"]
    weights = m["params"] * m["bytes_per_param"]
    act_bytes = m["hidden"] * m["bytes_per_param"]                  # one token's activations
    kv_per_token = 2 * m["layers"] * m["hidden"] * m["bytes_per_param"]
    attn_flops_per_pair = 4 * m["hidden"] * m["layers"]
    allreduces = 2 * m["layers"]
    flops = gpu["flops"] * MFU[tp]
    hbm = gpu["hbm"] * HBM_EFFICIENCY
    fixed = (allreduces * ALLREDUCE_LATENCY_S if tp > 1 else 0) + (pp - 1) * HOP_LATENCY_S
    per_token_comm = ((allreduces * 2 * (tp - 1) / tp * act_bytes / gpu["link"]) if tp > 1 else 0)
    per_token_comm += (pp - 1) * act_bytes / gpu["link"]
    c1 = 0.004 + fixed
    c2 = flops_per_token / flops / tp + per_token_comm
    c3 = attn_flops_per_pair / 2 / flops / tp
    c4 = weights / hbm / tp + 0.001 + fixed
    c5 = 4e-5 * (990e12 / gpu["flops"]) / tp + per_token_comm
    c6 = kv_per_token / hbm / tp
    return dict(tp=tp, pp=pp, c=(c1, c2, c3, c4, c5, c6), kv=kv_per_token)


def write(key, path):
    gpu = GPUS[key]
    lines = [
        f"# OPT-13B on {gpu['title']} (nodes of 8 GPUs, NVLink within a node), bf16.",
        "# Not measured: derived from first principles by cluster/gpu/make_latency_models.py so",
        "# that the planner has a GPU to plan for. Model: 40 layers, hidden 5120, 26 GB of bf16",
        "# weights; 26 GFLOP of matmul per token; attention 4*hidden*layers FLOP per (query, key)",
        "# pair; KV 2*40*5120*2 = 819,200 bytes per token.",
        f"# GPU: {gpu['flops'] / 1e12:g} TFLOP/s dense bf16 at MFU 55/52/48/42% for tp 1/2/4/8;",
        f"#   HBM {gpu['hbm'] / 1e12:g} TB/s at 75%; NVLink ~{gpu['link'] / 1e9:g} GB/s per GPU.",
        "# prefill = c1 + c2 sum(l) + c3 sum(l^2): c1 4 ms + all-reduce (80 x 8 us, tp > 1) and",
        "#   pipeline hop (20 us each) latencies; c2 matmul work / tp + all-reduce and hop traffic",
        "#   per token; c3 causal attention work / tp.",
        "# decode = c4 + c5 batch + c6 sum(context): c4 the weights read once per step / tp + 1 ms",
        "#   + the same latencies; c5 per-sequence work (40 us at H100 speed) / tp + traffic;",
        "#   c6 KV bytes per context token / HBM / tp.",
        "# pipeline_parallel: an entry's time is a batch's latency through all stages; the",
        "#   simulator lets a new batch enter every latency / pp (cluster/simulator.cc).",
        f"# transfer: KV between instances over NVLink: {gpu['link'] / 1e9:g} GB/s, 0.2 ms each.",
        "latency_model:",
    ]
    for tp, pp in SHAPES:
        e = entry(gpu, tp, pp)
        c1, c2, c3, c4, c5, c6 = e["c"]
        lines += [
            f"  - model: {MODEL['name']}",
            f"    device: {key}",
            "    threads: 1",
            f"    tensor_parallel: {tp}",
            f"    pipeline_parallel: {pp}",
            f"    prefill: {{c1: {c1:.6g}, c2: {c2:.6g}, c3: {c3:.6g}}}",
            f"    decode: {{c4: {c4:.6g}, c5: {c5:.6g}, c6: {c6:.6g}}}",
            f"    kv_bytes_per_token: {e['kv']:g}",
        ]
    lines += ["transfer:", "  latency_s: 0.0002", f"  bytes_per_s: {gpu['link']:.6g}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    for key in GPUS:
        path = os.path.join(here, f"{key}-opt13b.yaml")
        write(key, path)
        print("wrote", path)
