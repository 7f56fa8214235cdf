#!/usr/bin/env python3
"""DistServe's own OPT-13B comparison, simulated on our derived GPU latency models.

DistServe's artifact ran OPT-13B as one prefill instance at tensor parallelism 2 plus one
decode instance at tensor parallelism 1 (3 GPUs), against vLLM at tensor parallelism 1 (1 GPU),
and compared goodput per GPU. `tandem plan` searches every shape instead; this script answers
the narrower question "what does DistServe's own pair of layouts give on these models", so
that perf/README.md can tell a planner result apart from a latency-model one.

For each (layout, workload, SLO) it finds the goodput, the highest Poisson rate whose simulated
SLO attainment is at least the target, by doubling and then bisecting the rate with
`tandem simulate` on the same seeded workload (arrivals over `--horizon-s` seconds, at least
400 requests, as the planner sizes its runs).

  python3 perf/distserve_layout.py [--tandem build/tandem] [--latency-model LM.yaml]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

LAYOUTS = [  # name, config, GPUs
    ("DistServe: P(tp2) + D(tp1)", "perf/configs/a100-distserve-unit.yaml", 3),
    ("vLLM: colocated tp1, prefill_first", "perf/configs/a100-vllm-tp1.yaml", 1),
]
CASES = [  # workload, TTFT SLO, TPOT SLO
    ("chatbot", 0.25, 0.1),
    ("chatbot-history", 0.25, 0.1),
    ("chatbot-history", 0.2, 0.1),
]


def attainment(args, config, workload, ttft, tpot, rate):
    """Simulated SLO attainment of `config` at `rate` req/s."""
    num_requests = max(400, min(20000, int(rate * args.horizon_s)))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sim.json")
        subprocess.run([args.tandem, "simulate", "--config", config,
                        "--latency-model", args.latency_model, "--workload", workload,
                        "--rate", "%g" % rate, "--num-requests", str(num_requests),
                        "--seed", "1", "--max-model-len", "2048",
                        "--slo.ttft_s=%g" % ttft, "--slo.tpot_s=%g" % tpot, "--out", out],
                       check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)["summary"]["attainment"]


def goodput(args, config, workload, ttft, tpot):
    """Highest rate meeting the target, to 1% (0 if even start_rate / 64 misses)."""
    def passes(rate):
        return attainment(args, config, workload, ttft, tpot, rate) >= args.target

    # Bracket the crossing, low passing and high missing: double up from the start rate, or
    # halve down from it when it misses.
    if passes(args.start_rate):
        low, high = args.start_rate, 2 * args.start_rate
        while passes(high):
            if high > 1e4:
                sys.exit("attainment never drops below the target: check the SLOs")
            low, high = high, 2 * high
    else:
        low, high = args.start_rate / 2, args.start_rate
        while not passes(low):
            if low <= args.start_rate / 64:
                return 0.0
            low, high = low / 2, low
    while high - low > 0.01 * high:
        mid = (low + high) / 2
        if passes(mid):
            low = mid
        else:
            high = mid
    return low


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tandem", default="build/tandem")
    parser.add_argument("--latency-model", default="cluster/gpu/a100-opt13b.yaml")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--horizon-s", type=float, default=60)
    parser.add_argument("--start-rate", type=float, default=1.0)
    parser.add_argument("--out", default="perf/results/distserve_layout.json")
    args = parser.parse_args()

    rows = []
    print("| workload | SLO TTFT / TPOT (s) | layout | GPUs | goodput (req/s) | per GPU |")
    print("|---|---|---|---|---|---|")
    for workload, ttft, tpot in CASES:
        for name, config, gpus in LAYOUTS:
            rate = goodput(args, config, workload, ttft, tpot)
            rows.append({"workload": workload, "slo_ttft_s": ttft, "slo_tpot_s": tpot,
                         "layout": name, "config": config, "gpus": gpus, "goodput": rate,
                         "per_gpu": rate / gpus})
            print("| %s | %g / %g | %s | %d | %.2f | %.2f |" % (workload, ttft, tpot, name, gpus,
                                                               rate, rate / gpus), flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"latency_model": args.latency_model, "target": args.target, "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()
