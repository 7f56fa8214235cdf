#!/usr/bin/env python3
"""KV handoff wait, layer-wise streaming off vs on (perf/README.md "KV handoff").

Starts `tandem up` on perf/configs/disagg-1p1d.yaml (medium model, 1 prefill + 1 decode, one
thread each) with transfer.ucx_tls and transfer.layerwise overridden, sends one greedy request
at a time (prompt of N token ids, max_tokens 2) and reads, after each, the change of the decode
instance's tandem_kv_handoff_wait_seconds sum: from the moment decode learned the request's
first token to the moment all of its KV was in (0 if it was in before). Prints the median of
--repeat requests per (tls, prompt length, layerwise) and the raw numbers as JSON.

  python3 perf/handoff.py [--binary build/tandem] [--repeat 3] [--lengths 1024,4096]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from cluster_util import free_base, http_get  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def metric_sum(port, name):
    status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert status == 200, status
    total = count = 0.0
    for line in body.splitlines():
        if line.startswith(name + "_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count"):
            count = float(line.rsplit(" ", 1)[1])
    return total, count


def run(binary, tls, layerwise, lengths, repeat, work):
    router_port, metrics_port = free_base(1), free_base(2)
    config = os.path.join(work, f"{tls}-{layerwise}.yaml")
    with open(os.path.join(ROOT, "perf", "configs", "disagg-1p1d.yaml")) as f:
        text = f.read()
    text = text.replace("max_model_len: 2048", "max_model_len: 8192")
    text = text.replace("router:\n  port: 0", f"router:\n  port: {router_port}")
    # kv_blocks: the default (max_model_len / block_size x max_batch_size) would be 12 GiB each.
    text = text.replace("prefill:\n", f"prefill:\n  metrics_port: {metrics_port}\n"
                        "  token_budget: 4096\n  kv_blocks: 1024\n")
    text = text.replace("decode:\n", f"decode:\n  metrics_port: {metrics_port + 1}\n"
                        "  kv_blocks: 1024\n")
    text += f"transfer:\n  ucx_tls: {tls}\n  layerwise: {'true' if layerwise else 'false'}\n"
    # A 4k prompt takes tens of seconds on one thread: SLOs the router can admit it under.
    text += "slo:\n  ttft_s: 600\n  tpot_s: 60\n"
    with open(config, "w") as f:
        f.write(text)
    log = open(os.path.join(work, f"{tls}-{layerwise}.log"), "w")
    proc = subprocess.Popen([binary, "up", config], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{router_port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if http_get(url + "/ready", timeout=2)[0] == 200:
                    break
            except Exception:
                pass
            time.sleep(0.25)
        else:
            raise RuntimeError("cluster not ready")
        model = json.loads(http_get(url + "/v1/models")[1])["data"][0]["id"]
        def wait_ms(n, salt):
            prompt = [1 + (i * 7919 + salt * 104729 + n) % 2000 for i in range(n)]
            body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 2,
                               "temperature": 0, "ignore_eos": True}).encode()
            before, _ = metric_sum(metrics_port + 1, "tandem_kv_handoff_wait_seconds")
            req = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as resp:
                json.load(resp)
            after, _ = metric_sum(metrics_port + 1, "tandem_kv_handoff_wait_seconds")
            return (after - before) * 1000

        wait_ms(128, 0)  # warm-up: connections, first pull
        return {n: [wait_ms(n, r + 1) for r in range(repeat)] for n in lengths}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default=os.path.join(ROOT, "build", "tandem"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--tls", default="tcp,sm")
    parser.add_argument("--modes", default="off,on", help="layerwise off, on or both")
    parser.add_argument("--workdir", default="", help="keep configs and logs here")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="tandem-handoff-") as tmp:
        work = args.workdir or tmp
        os.makedirs(work, exist_ok=True)
        for tls in args.tls.split(","):
            for layerwise in [m == "on" for m in args.modes.split(",")]:
                waits = run(args.binary, tls, layerwise, lengths, args.repeat, work)
                for n in lengths:
                    results.append({"tls": tls, "tokens": n, "layerwise": layerwise,
                                    "wait_ms": waits[n]})
                    print(f"{tls:4} {n:5} tokens  layerwise {'on ' if layerwise else 'off'}  "
                          f"median {statistics.median(waits[n]):8.2f} ms  "
                          f"({', '.join(f'{w:.2f}' for w in waits[n])})", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
