#!/usr/bin/env python3
"""`tandem bench` and `tandem bench sweep` against a real `tandem up` cluster (tiny model,
1 prefill + 1 decode instance).

1. bench, open loop: 8 requests of the `code` workload at 4 req/s. Every request completes,
   output_tokens == max_tokens (ignore_eos), 0 < ttft <= e2e, tpot matches (e2e - ttft) /
   (output_tokens - 1), and the summary's attainments equal the shares computed here from the
   per-request numbers; the table is printed.
2. bench, closed loop: 4 requests at concurrency 2, all completed.
3. Bad flag values exit 2 with a message naming the flag (bench and sweep).
4. sweep: the same cluster config, 2 rates x 6 requests, with a latency model: sweep.json has
   both points (measured and simulated attainment in [0, 1]; the measured speed, read from the
   router's /metrics, with the simulation at that speed), a goodput row and an SLO-scale
   curve; the run files exist; the plots are PNG files.
5. sweep with an SLO nobody meets: after the first rate it probes one lower rate
   (--probe-down 1, which misses too) and stops: points at 0.5 and 1 req/s in ascending order,
   goodput 0, --cores-per used.

Env: TANDEM_BINARY. Exit 0 = pass. Every process is stopped in finally blocks.
"""
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading

from cluster_util import FAILURES, check, stop_process, make_tiny_model

BIN = os.environ.get("TANDEM_BINARY") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "tandem")
READY_TIMEOUT_S = 90
RUN_TIMEOUT_S = 90
SLO_TTFT, SLO_TPOT = 0.5, 0.05

# A crude but valid latency model for the tiny model on 1 CPU thread (format:
# common/engine/latency_model.h); the sweep only needs it to run the simulator beside the measurement.
LATENCY_MODEL = """latency_model:
  - model: tiny
    device: cpu
    threads: 1
    tensor_parallel: 1
    pipeline_parallel: 1
    prefill: {c1: 0.002, c2: 0.00002, c3: 1.0e-9}
    decode: {c4: 0.002, c5: 0.0001, c6: 1.0e-8}
    kv_bytes_per_token: 1024
"""


def start_cluster(config_path, log_path):
    """`tandem up` with stdout read by a thread; returns (process, url) once ready."""
    log = open(log_path, "w")
    proc = subprocess.Popen([BIN, "up", config_path], stdout=subprocess.PIPE, stderr=log,
                            text=True, start_new_session=True)
    lines = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        while True:
            line = lines.get(timeout=READY_TIMEOUT_S)
            if line is None:
                raise RuntimeError(f"tandem up exited before it was ready (see {log_path})")
            if line.startswith("tandem: ready at "):
                return proc, line.split()[3]
    except queue.Empty:
        stop(proc)
        raise RuntimeError(f"tandem up not ready after {READY_TIMEOUT_S} s (see {log_path})")


def stop(proc, timeout=30):
    stop_process(proc, timeout)


def run(args, timeout=RUN_TIMEOUT_S):
    r = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        print("$ tandem", " ".join(args), "->", r.returncode, "\n", r.stdout[-2000:],
              r.stderr[-2000:], flush=True)
    return r


def check_run_json(path, n_expected, what):
    with open(path) as f:
        data = json.load(f)
    reqs, summary, config = data["requests"], data["summary"], data["config"]
    check(len(reqs) == n_expected, f"{what}: {len(reqs)} requests, expected {n_expected}")
    check(summary["requests"] == len(reqs), f"{what}: summary.requests {summary['requests']}")
    for r in reqs:
        tag = f"{what}: request {r['id']}"
        if not check(r["ok"] and not r["rejected"] and r["error"] == "", f"{tag} failed: {r}"):
            continue
        check(r["output_tokens"] == r["max_tokens"],
              f"{tag}: {r['output_tokens']} output tokens, max_tokens {r['max_tokens']}")
        check(0 < r["ttft_s"] <= r["e2e_s"], f"{tag}: ttft {r['ttft_s']} e2e {r['e2e_s']}")
        if r["output_tokens"] > 1:
            tpot = (r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1)
            check(abs(tpot - r["tpot_s"]) < 1e-6, f"{tag}: tpot {r['tpot_s']} vs {tpot}")
    check(summary["completed"] == n_expected, f"{what}: completed {summary['completed']}")
    ttft_slo, tpot_slo = config["slo_ttft_s"], config["slo_tpot_s"]
    ok_ttft = [r["ok"] and r["ttft_s"] <= ttft_slo for r in reqs]
    ok_tpot = [r["ok"] and r["tpot_s"] <= tpot_slo for r in reqs]
    n = len(reqs)
    for key, share in (("attainment", sum(a and b for a, b in zip(ok_ttft, ok_tpot)) / n),
                       ("ttft_attainment", sum(ok_ttft) / n),
                       ("tpot_attainment", sum(ok_tpot) / n)):
        check(0 <= summary[key] <= 1 and abs(summary[key] - share) < 1e-9,
              f"{what}: {key} {summary[key]}, computed {share}")
    return data


def main():
    with tempfile.TemporaryDirectory(prefix="tandem-bench-test-") as work:
        model_dir = make_tiny_model(BIN, work)
        config_path = os.path.join(work, "cluster.yaml")
        with open(config_path, "w") as f:
            f.write(f"model:\n  path: {model_dir}\n  name: tiny-bench\n  max_model_len: 512\n"
                    "router:\n  port: 0\nprefill:\n  instances: 1\n  threads: 1\n"
                    "decode:\n  instances: 1\n  threads: 1\ncolocated:\n  instances: 0\n")
        lm_path = os.path.join(work, "lm.yaml")
        with open(lm_path, "w") as f:
            f.write(LATENCY_MODEL)

        # 3. Bad flags first: no cluster needed.
        for args, flag in (
                (["bench", "--workload", "code", "--rate", "-1", "--slo-ttft", "1",
                  "--slo-tpot", "1"], "--rate"),
                (["bench", "--workload", "nope", "--rate", "1", "--slo-ttft", "1",
                  "--slo-tpot", "1"], "--workload"),
                (["bench", "--workload", "code", "--rate", "1", "--slo-tpot", "1"],
                 "--slo-ttft"),
                (["bench", "sweep", "--cluster", f"a={config_path}", "--workload", "code",
                  "--slo-ttft", "1", "--slo-tpot", "1", "--rates", "1,fast"], "--rates"),
                (["bench", "sweep", "--cluster", "noequals", "--workload", "code",
                  "--slo-ttft", "1", "--slo-tpot", "1"], "--cluster"),
                (["bench", "sweep", "--cluster", f"a={config_path}", "--workload", "code",
                  "--slo-ttft", "1", "--slo-tpot", "1", "--probe-down", "-1"], "--probe-down")):
            r = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=30)
            check(r.returncode == 2 and flag in r.stderr,
                  f"{' '.join(args)}: exit {r.returncode}, stderr {r.stderr!r} (want 2, {flag})")

        proc = None
        try:
            proc, url = start_cluster(config_path, os.path.join(work, "up.log"))
            # 1. Open loop.
            out = os.path.join(work, "bench.json")
            r = run(["bench", "--url", url, "--workload", "code", "--num-requests", "8",
                     "--rate", "4", "--seed", "3", "--slo-ttft", str(SLO_TTFT),
                     "--slo-tpot", str(SLO_TPOT), "--out", out])
            if check(r.returncode == 0, f"bench exit {r.returncode}"):
                check("SLO attainment" in r.stdout and "TTFT" in r.stdout,
                      f"bench table missing: {r.stdout!r}")
                data = check_run_json(out, 8, "bench rate")
                check(data["config"]["model"] == "tiny-bench", "model name from /v1/models")
                check(data["config"]["max_model_len"] == 512, "max_model_len from /v1/models")
                print("bench summary:", json.dumps(data["summary"]), flush=True)
            # 2. Closed loop.
            out2 = os.path.join(work, "bench-conc.json")
            r = run(["bench", "--url", url, "--workload", "chatbot", "--num-requests", "4",
                     "--concurrency", "2", "--slo-ttft", "1", "--slo-tpot", "0.1",
                     "--quiet", "--out", out2])
            if check(r.returncode == 0, f"bench --concurrency exit {r.returncode}"):
                check(r.stdout == "", f"--quiet printed {r.stdout!r}")
                check_run_json(out2, 4, "bench concurrency")
        finally:
            stop(proc)

        # 4. Sweep (starts its own cluster from the same config).
        sweep_dir = os.path.join(work, "sweep")
        r = run(["bench", "sweep", "--cluster", f"tiny={config_path}", "--workload", "code",
                 "--rates", "2,1", "--num-requests", "6", "--slo-ttft", "30", "--slo-tpot", "5",
                 "--target", "0.5", "--latency-model", lm_path, "--out-dir", sweep_dir,
                 "--ready-timeout-s", str(READY_TIMEOUT_S)], timeout=180)
        print(r.stdout[-3000:], flush=True)
        check(r.returncode == 0, f"sweep exit {r.returncode}: {r.stderr[-2000:]}")
        sweep_json = os.path.join(sweep_dir, "sweep.json")
        if check(os.path.exists(sweep_json), "sweep.json missing"):
            with open(sweep_json) as f:
                sweep = json.load(f)
            points = sweep["points"]
            check([(p["cluster"], p["workload"], p["rate"]) for p in points] ==
                  [("tiny", "code", 1), ("tiny", "code", 2)], f"points {points}")
            for p in points:
                check(0 <= p["measured"]["attainment"] <= 1 and
                      p["measured"]["completed"] == 6, f"measured {p['measured']}")
                check(p["simulated"] is not None and 0 <= p["simulated"]["attainment"] <= 1,
                      f"simulated {p.get('simulated')} {p.get('simulated_error')}")
                check(os.path.exists(os.path.join(sweep_dir, p["run_file"])),
                      f"run file {p['run_file']} missing")
                # The machine's speed from the router's decode-model correction, and the
                # simulation at that speed, exist together (null when no sample moved).
                speed, at_speed = p["measured_speed"], p["simulated_at_measured_speed"]
                check((speed is None) == (at_speed is None), f"speed {speed} / {at_speed}")
                if speed is not None:
                    check(0.25 <= speed <= 4 and 0 <= at_speed["attainment"] <= 1,
                          f"speed {speed}, simulated at speed {at_speed}")
            check(any(p["measured_speed"] is not None for p in points),
                  "no point measured the machine's speed (the router's correction gauge)")
            rows = sweep["goodput"]
            check(len(rows) == 1 and rows[0]["goodput_rps"] == 2 and rows[0]["cores"] == 2 and
                  abs(rows[0]["goodput_per_core"] - 1.0) < 1e-9 and
                  rows[0]["ratio_vs_first"] == 1 and rows[0]["lower_bound"],
                  f"goodput rows {rows}")
            scale = sweep["slo_scale"]
            check(len(scale) == 1 and scale[0]["rate"] == 2 and
                  len(scale[0]["curves"]["tiny"]) == 9, f"slo_scale {scale}")
        check("goodput" in r.stdout and "per_core" in r.stdout, "sweep table missing")
        for png in ("attainment_code.png", "slo_scale_code.png"):
            path = os.path.join(sweep_dir, png)
            if check(os.path.exists(path), f"{png} missing"):
                with open(path, "rb") as f:
                    check(f.read(8) == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG")
        for name in ("attainment_code.gp", "attainment_code_tiny.dat", "slo_scale_code.dat"):
            check(os.path.exists(os.path.join(sweep_dir, name)), f"{name} missing")

        # 5. A sweep whose first rate misses the target probes one halved rate, which misses
        # too, and stops: goodput 0. (An SLO of 1 microsecond no request can meet.)
        sweep_dir = os.path.join(work, "sweep-miss")
        r = run(["bench", "sweep", "--cluster", f"tiny={config_path}", "--workload", "code",
                 "--rates", "1,2", "--num-requests", "3", "--slo-ttft", "0.000001",
                 "--slo-tpot", "5", "--out-dir", sweep_dir, "--cores-per", "tiny=4",
                 "--probe-down", "1"],
                timeout=180)
        check("probing 0.5" in r.stdout, f"no probe line: {r.stdout[-1000:]}")
        check(r.returncode == 0, f"sweep (miss) exit {r.returncode}: {r.stderr[-2000:]}")
        if check(os.path.exists(os.path.join(sweep_dir, "sweep.json")), "sweep.json missing"):
            with open(os.path.join(sweep_dir, "sweep.json")) as f:
                sweep = json.load(f)
            check([p["rate"] for p in sweep["points"]] == [0.5, 1] and
                  all(p["measured"]["attainment"] == 0 for p in sweep["points"]) and
                  sweep["points"][0]["simulated"] is None, f"points {sweep['points']}")
            row = sweep["goodput"][0]
            check(row["goodput_rps"] == 0 and row["crossing_rps"] == 0 and
                  not row["lower_bound"] and row["cores"] == 4, f"goodput row {row}")

    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
