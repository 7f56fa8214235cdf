#!/usr/bin/env python3
"""The disaggregated cluster on one GPU (tests/gpu/run.sh): `tandem serve` with one prefill and
one decode instance, both `device: cuda`, sharing the GPU, the KV moving between their pools
over CUDA IPC (`transfer.backend: cuda_ipc`), SmolLM2-135M-Instruct, driven by the official
`openai` client. Then one long prompt, to time the KV transfer against the device-to-device copy
bandwidth.

  .venv/bin/python tests/gpu/cluster_check.py TANDEM_BINARY LOG_DIR [--d2d-gbps X] [--cpu]
      [--decode-tp T] [--transfer nccl|ucx]

--cpu runs the same checks on the CPU cluster (ucx, device cpu): the script's own check where no
GPU is. --decode-tp T puts decode on GPUs 0..T-1 with tensor_parallel T (prefill stays on GPU 0,
tensor_parallel 1): every pull re-shards the KV heads 1 -> T (SmolLM2's 9 heads, 3 KV heads:
T = 3 or 9). --transfer nccl puts prefill on GPU 0 and decode on GPU 1 (with --decode-tp T: GPUs 1..T)
and moves the KV with NCCL (the transport for GPU pools on different machines; NCCL refuses two
ranks on one GPU). --transfer ucx keeps both on this GPU and moves the KV with UCX over its CUDA
transports (only where the UCX at hand has them: run.sh asks `tandem --version` first).

Judged: the greedy answer names Paris; streaming and non-streaming give the same text; eight
concurrent requests all finish with their max_tokens or a stop; every pull succeeded
(tandem_kv_transfer_* on the decode instance). Printed as "ROW|name|result|detail" lines for
run.sh's table; exit 0 = pass. The cluster is stopped in a finally block.
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import time

import httpx
import openai

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from cluster_util import (free_base, metric, stop_process,  # noqa: E402
                          wait_for_ready_line)

MODEL = "smollm2-135m-instruct"
READY_TIMEOUT_S = 120
CLUSTER_ROW = {False: "cluster 1P+1D over CUDA IPC (openai)",
               True: "cluster 1P+1D on the CPU over UCX (openai; the script's own check)"}
TRANSFER_ROW = {False: "KV transfer (cuda_ipc) vs D2D copy", True: "KV transfer (ucx, CPU)"}
NCCL_ROWS = ("cluster 1P+1D over NCCL, GPU 0 -> 1 (openai)", "KV transfer (nccl, GPU 0 -> 1)")
UCX_ROWS = ("cluster 1P+1D over UCX on GPU memory (openai)", "KV transfer (ucx, GPU memory)")
# The transports a CUDA-aware UCX moves GPU memory with, besides the host ones.
UCX_CUDA_TLS = "tcp,sm,self,cuda_copy,cuda_ipc"



def row(name, result, detail):
    print(f"ROW|{name}|{result}|{detail}", flush=True)


# The instances' start-up lines on GPU memory (kvtransfer/factory.h LogDeviceMemoryUse).
MEMORY_LINE = re.compile(r"(\S+): GPU (\d+): start-up took ([\d.]+) GiB, ([\d.]+) GiB (more|less) "
                         r"than planned .*?(within|beyond) the")


def memory_rows(log_path):
    """One detail for what each instance's GPUs took at start-up against the plan."""
    with open(log_path, errors="replace") as log:
        found = [m.groups() for m in MEMORY_LINE.finditer(log.read())]
    if not found:
        return "FAIL", "no instance logged its GPU memory at start-up"
    parts = [f"{who} GPU {gpu}: {took} GiB, {diff} GiB {way} than planned ({margin} the margin)"
             for who, gpu, took, diff, way, margin in found]
    return ("FAIL" if any(g[5] == "beyond" for g in found) else "info"), "; ".join(parts)


def start(binary, log_dir, cpu, decode_tp, transfer):
    router, metrics = free_base(1), free_base(1)
    log_path = os.path.join(log_dir, f"cluster-{transfer}-tp{decode_tp}.log")
    log = open(log_path, "w")
    placement = [] if cpu else [f"--transfer.backend={transfer}", "--prefill.device=cuda",
                                "--decode.device=cuda"]
    if transfer == "ucx":  # both on this GPU; UCX must move GPU memory (run.sh checked)
        placement += [f"--transfer.ucx_tls={UCX_CUDA_TLS}"]
    if transfer == "nccl":  # NCCL puts no two ranks on one GPU: decode on the next ones
        gpus = ",".join(str(g) for g in range(1, 1 + decode_tp))
        placement += ["--prefill.cuda_devices=0", f"--decode.cuda_devices={gpus}"]
    if decode_tp > 1 and transfer == "nccl":
        placement += [f"--decode.tensor_parallel={decode_tp}"]
    elif decode_tp > 1:
        gpus = ",".join(str(g) for g in range(decode_tp))
        placement += [f"--decode.tensor_parallel={decode_tp}", "--prefill.cuda_devices=0",
                      f"--decode.cuda_devices={gpus}"]
    proc = subprocess.Popen(
        # A loose TTFT SLO: the long prompt below must be served, not refused as too slow.
        [os.path.abspath(binary), "serve", f"--router.port={router}",
         f"--decode.metrics_port={metrics}", "--slo.ttft_s=120"] + placement,
        stdout=log, stderr=subprocess.STDOUT, cwd=log_dir)
    url = f"http://127.0.0.1:{router}"
    wait_for_ready_line(proc, log_path, f"tandem: ready at {url}", READY_TIMEOUT_S, tail_lines=30)
    return proc, url, metrics, log_path


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("log_dir")
    parser.add_argument("--d2d-gbps", type=float, default=0.0,
                        help="bytes a device-to-device copy moves per second, in GB/s")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--decode-tp", type=int, default=1)
    parser.add_argument("--transfer", choices=("cuda_ipc", "nccl", "ucx"), default="cuda_ipc")
    args = parser.parse_args()
    name = CLUSTER_ROW[args.cpu] if args.decode_tp == 1 else \
        f"cluster 1P+1D, decode tensor_parallel {args.decode_tp} (KV re-sharded 1 -> {args.decode_tp})"
    transfer_row = TRANSFER_ROW[args.cpu]
    if args.transfer == "ucx":
        name, transfer_row = UCX_ROWS
    if args.transfer == "nccl":
        name, transfer_row = NCCL_ROWS
        if args.decode_tp > 1:
            name = (f"cluster 1P+1D over NCCL, decode tensor_parallel {args.decode_tp} on GPUs "
                    f"1..{args.decode_tp} (KV re-sharded 1 -> {args.decode_tp})")
    proc = None
    failed = []
    try:
        started = time.time()
        proc, url, metrics_port, log_path = start(args.binary, args.log_dir, args.cpu,
                                                  args.decode_tp, args.transfer)
        ready_s = time.time() - started
        if not args.cpu:
            row(f"GPU memory at start-up vs plan ({args.transfer})", *memory_rows(log_path))
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120,
                               http_client=httpx.Client(trust_env=False, timeout=120))
        question = [{"role": "user", "content": "What is the capital of France?"}]
        t0 = time.time()
        reply = client.chat.completions.create(model=MODEL, messages=question, temperature=0,
                                               max_tokens=32)
        first_s = time.time() - t0
        text = reply.choices[0].message.content
        streamed = "".join(
            (chunk.choices[0].delta.content or "") for chunk in client.chat.completions.create(
                model=MODEL, messages=question, temperature=0, max_tokens=32, stream=True)
            if chunk.choices)
        if "Paris" not in text:
            failed.append(f"the answer does not name Paris: {text!r}")
        if streamed != text:
            failed.append(f"streamed {streamed!r} != {text!r}")

        def ask(i):
            r = client.chat.completions.create(
                model=MODEL, temperature=0, max_tokens=64,
                messages=[{"role": "user", "content": f"Count from {i} to {i + 40}."}])
            return r.choices[0].finish_reason, r.usage.completion_tokens

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(ask, range(8)))
        bad = [r for r in results if r[0] not in ("stop", "length")]
        if bad:
            failed.append(f"concurrent requests ended {bad}")
        failures = metric(metrics_port, "tandem_kv_transfer_failures_total") or 0
        pulls = metric(metrics_port, "tandem_kv_transfer_seconds_count") or 0
        if failures or pulls < 10:
            failed.append(f"{pulls:.0f} pulls, {failures:.0f} failed")
        detail = (f"ready in {ready_s:.1f} s; {text!r} in {first_s * 1000:.0f} ms; stream equal; "
                  f"8 concurrent ok; {pulls:.0f} pulls, {failures:.0f} failed")
        row(name, "FAIL" if failed else "ok",
            "; ".join(failed) if failed else detail)

        # The transfer of one long prompt's KV (about 46 KB per token for SmolLM2 in fp32).
        bytes0 = metric(metrics_port, "tandem_kv_transfer_bytes_total") or 0
        seconds0 = metric(metrics_port, "tandem_kv_transfer_seconds_sum") or 0
        client.completions.create(model=MODEL, prompt="word " * 3000, max_tokens=1,
                                  temperature=0)
        moved = (metric(metrics_port, "tandem_kv_transfer_bytes_total") or 0) - bytes0
        took = (metric(metrics_port, "tandem_kv_transfer_seconds_sum") or 0) - seconds0
        if moved > 0 and took > 0:
            gbps = moved / took / 1e9
            ratio = f" ({100 * gbps / args.d2d_gbps:.0f}% of the D2D copy's {args.d2d_gbps:.0f} GB/s)" \
                if args.d2d_gbps > 0 else ""
            row(transfer_row, "info",
                f"{moved / 1e6:.1f} MB in {took * 1000:.2f} ms of copying: {gbps:.1f} GB/s{ratio} "
                f"(layer-wise: the waits for prefill's layers are not counted)")
        else:
            row(transfer_row, "FAIL", f"no transfer measured ({moved} B)")
            failed.append("no transfer measured")
    except Exception as e:  # noqa: BLE001 - reported as a row
        row(name, "FAIL", f"{type(e).__name__}: {e}"[:400])
        failed.append(str(e))
    finally:
        stop_process(proc, 20)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
