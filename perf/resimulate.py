#!/usr/bin/env python3
"""Re-simulate the measured runs of a `tandem bench sweep` directory.

    python3 perf/resimulate.py SWEEP_DIR LATENCY_MODEL.yaml [--tandem build/tandem]

For every point in SWEEP_DIR/sweep.json it replays the run's requests (the same arrivals and
lengths, from its run file) through `tandem simulate --trace` with the run's cluster config, its
SLOs and the latency model (also in the simulated router, as the sweep runs the real one), then
rewrites the simulated summaries in sweep.json and the run files, the attainment_*.dat files,
and re-makes the PNGs with the sweep's gnuplot scripts. Where the sweep measured the machine's
decode speed during a run (perf/sweep.h, "measured_speed"), it also re-simulates that run with
decode at that speed (`tandem simulate --decode-time-scale`). Use it to check a new latency
model against old measurements, or to redo the simulation of a sweep whose measured half is
good. The replay uses each request's measured send time as its arrival (the sweep's own
simulation uses the scheduled arrival), which can move a request at a point near a threshold.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile


def simulate(tandem, run, latency_model, decode_time_scale=1.0):
    config = run["config"]
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.jsonl")
        out = os.path.join(tmp, "sim.json")
        with open(trace, "w") as f:
            for r in run["requests"]:
                f.write(json.dumps({"prompt_tokens": r["prompt_tokens"],
                                    "max_tokens": r["max_tokens"],
                                    "arrival_s": r["arrival_s"]}) + "\n")
        slo_ttft = config["slo_ttft_s"] if config["slo_ttft_s"] > 0 else 3600
        slo_tpot = config["slo_tpot_s"] if config["slo_tpot_s"] > 0 else 3600
        subprocess.run([tandem, "simulate", "--config", config["cluster_config"],
                        "--latency-model", latency_model, "--trace", trace, "--out", out,
                        f"--router.latency_model={os.path.abspath(latency_model)}",
                        f"--slo.ttft_s={slo_ttft}", f"--slo.tpot_s={slo_tpot}",
                        f"--decode-time-scale={decode_time_scale}"],
                       check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("sweep_dir")
    parser.add_argument("latency_model")
    parser.add_argument("--tandem", default="build/tandem")
    args = parser.parse_args()
    sweep_path = os.path.join(args.sweep_dir, "sweep.json")
    with open(sweep_path) as f:
        sweep = json.load(f)
    dat = {}  # (workload, cluster) -> lines
    for point in sweep["points"]:
        run_path = os.path.join(args.sweep_dir, point["run_file"])
        with open(run_path) as f:
            run = json.load(f)
        sim = simulate(args.tandem, run, args.latency_model)
        point["simulated"] = sim["summary"]
        point.pop("simulated_error", None)
        run["simulated"] = {"summary": sim["summary"], "requests": sim["requests"]}
        # Again at the machine speed the sweep measured during the run (perf/sweep.h), if any.
        speed = (run.get("measured_speed") or {}).get("decode_model_correction") or 0
        at_speed = None
        if speed > 0:
            at_speed = simulate(args.tandem, run, args.latency_model, speed)
            run["simulated_at_measured_speed"] = {"decode_time_scale": speed,
                                                  "summary": at_speed["summary"],
                                                  "requests": at_speed["requests"]}
        point["simulated_at_measured_speed"] = at_speed["summary"] if at_speed else None
        with open(run_path, "w") as f:
            json.dump(run, f, indent=1)
            f.write("\n")
        dat.setdefault((point["workload"], point["cluster"]), []).append(
            "%g %g %g %s" % (point["rate"], point["measured"]["attainment"],
                             sim["summary"]["attainment"],
                             "%g" % at_speed["summary"]["attainment"] if at_speed else "NaN"))
        print("%-12s %-14s rate %-5g measured %5.1f%%  simulated %5.1f%%%s" %
              (point["cluster"], point["workload"], point["rate"],
               100 * point["measured"]["attainment"], 100 * sim["summary"]["attainment"],
               "  at measured speed x%.3f %5.1f%%" % (speed, 100 * at_speed["summary"]["attainment"])
               if at_speed else ""))
    sweep["config"]["resimulated_with"] = args.latency_model
    with open(sweep_path, "w") as f:
        json.dump(sweep, f, indent=1)
        f.write("\n")
    for (workload, cluster), lines in dat.items():
        with open(os.path.join(args.sweep_dir, f"attainment_{workload}_{cluster}.dat"), "w") as f:
            f.write("# rate measured_attainment simulated_attainment "
                    "simulated_at_measured_speed_attainment\n" + "\n".join(lines) + "\n")
    for script in sorted(glob.glob(os.path.join(args.sweep_dir, "*.gp"))):
        subprocess.run(["gnuplot", os.path.basename(script)], cwd=args.sweep_dir, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
