#!/usr/bin/env python3
"""deploy/prometheus/tandem-rules.yaml under promtool: `promtool check rules`, then `promtool test
rules` with, for every alert, a scenario of synthetic series on which it must fire (with its
labels) and a healthy one on which it must stay silent; and the recording rules' values on a
known input. Every alert in the file must have its scenarios here. Exit 0 = pass (77: no
promtool)."""
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

RULES = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "prometheus",
                     "tandem-rules.yaml")
M = 'model="m"'


def series(name, labels, values):
    return {"series": f"{name}{{{labels}}}", "values": values}


def slo(result, values):
    return series("tandem_router_slo_requests_total",
                  f'role="router",{M},slo_class="default",result="{result}"', values)


def hist(name, le_counts, step, slo_class="default"):
    """A router histogram of one SLO class whose per-minute increments put the mass at
    `le_counts`."""
    return [series(name + "_bucket", f'role="router",{M},slo_class="{slo_class}",le="{le}"',
                   f"0+{n * step}x40")
            for le, n in le_counts]


def target(slo_class, objective, seconds):
    return series("tandem_router_slo_target_seconds",
                  f'role="router",{M},slo_class="{slo_class}",objective="{objective}"',
                  f"{seconds}x40")


# The default class (TTFT 2 s, TPOT 0.2 s) and a looser "batch" class (TTFT 10 s, TPOT 1 s).
SLO_TARGETS = [
    target("default", "ttft", 2), target("default", "tpot", 0.2),
    target("batch", "ttft", 10), target("batch", "tpot", 1),
    series("tandem_router_slo_attainment_target", f'role="router",{M}', "0.9x40"),
]
TTFT = "tandem_time_to_first_token_seconds"
TPOT = "tandem_time_per_output_token_seconds"
# p90 of each: TTFT 0.9 s, 4.6 s, 18.5 s; TPOT 0.09 s, 0.46 s, 1.85 s.
TTFT_FAST = [("1", 10), ("5", 10), ("20", 10), ("+Inf", 10)]
TTFT_MID = [("1", 0), ("5", 10), ("20", 10), ("+Inf", 10)]
TTFT_SLOW = [("1", 0), ("5", 0), ("20", 10), ("+Inf", 10)]
TPOT_FAST = [("0.1", 10), ("0.5", 10), ("2", 10), ("+Inf", 10)]
TPOT_MID = [("0.1", 0), ("0.5", 10), ("2", 10), ("+Inf", 10)]
TPOT_SLOW = [("0.1", 0), ("0.5", 0), ("2", 10), ("+Inf", 10)]

# alert -> (series on which it fires, the labels it fires with, healthy series)
SCENARIOS = {
    "TandemSLOAttainmentLow": (
        [slo("attained", "0+60x40"), slo("missed", "0+40x40")] + SLO_TARGETS,
        {"model": "m", "slo_class": "default"},
        [slo("attained", "0+98x40"), slo("missed", "0+2x40")] + SLO_TARGETS),
    # Per class against its own target: batch over its 10 s fires (default within its 2 s); silent
    # when batch's 4.6 s is over the default's 2 s but within its own 10 s.
    "TandemTTFTOverSLO": (
        hist(TTFT, TTFT_FAST, 6) + hist(TTFT, TTFT_SLOW, 6, "batch") + SLO_TARGETS,
        {"model": "m", "slo_class": "batch"},
        hist(TTFT, TTFT_FAST, 6) + hist(TTFT, TTFT_MID, 6, "batch") + SLO_TARGETS),
    "TandemTPOTOverSLO": (
        hist(TPOT, TPOT_FAST, 6) + hist(TPOT, TPOT_SLOW, 6, "batch") + SLO_TARGETS,
        {"model": "m", "slo_class": "batch"},
        hist(TPOT, TPOT_FAST, 6) + hist(TPOT, TPOT_MID, 6, "batch") + SLO_TARGETS),
    "TandemKVCacheNearFull": (
        [series("tandem_kv_cache_usage_ratio", f'role="decode",{M},instance="d0"', "0.99x40")],
        {"model": "m", "role": "decode", "instance": "d0"},
        [series("tandem_kv_cache_usage_ratio", f'role="decode",{M},instance="d0"', "0.7x40")]),
    "TandemKVTransferFailures": (
        [series("tandem_kv_transfer_failures_total",
                f'role="decode",{M},instance="d0",reason="timeout"', "0+1x40")],
        {"model": "m", "instance": "d0", "reason": "timeout"},
        [series("tandem_kv_transfer_failures_total",
                f'role="decode",{M},instance="d0",reason="timeout"', "3x40")]),
    "TandemKVReadsRefused": (
        [series("tandem_kv_read_refusals_total", f'role="prefill",{M},instance="p0",reason="mac"',
                "0+5x40")],
        {"instance": "p0", "reason": "mac"},
        [series("tandem_kv_read_refusals_total", f'role="prefill",{M},instance="p0",reason="mac"',
                "0x40")]),
    "TandemRoleUnavailable": (
        [series("tandem_router_instances_usable", f'role="router",{M},instance_role="decode"',
                "2x10 0x30")],
        {"role": "router", "model": "m", "instance_role": "decode"},
        [series("tandem_router_instances_usable", f'role="router",{M},instance_role="decode"',
                "2x40"),
         # A role the cluster never had (colocated-only, say) is not "unavailable".
         series("tandem_router_instances_usable", f'role="router",{M},instance_role="prefill"',
                "0x40")]),
    "TandemInstanceLost": (
        [series("tandem_router_instance_disconnects_total", f'role="router",{M},instance="decode-1"',
                "0x25 1x15")],
        {"model": "m", "instance": "decode-1"},
        [series("tandem_router_instance_disconnects_total", f'role="router",{M},instance="decode-1"',
                "1x40")]),
    "TandemPrefillBottleneck": (
        [series("tandem_num_requests_waiting", f'role="prefill",{M},instance="p0"', "20x40"),
         series("tandem_kv_cache_usage_ratio", f'role="decode",{M},instance="d0"', "0.1x40")],
        {"model": "m"},
        [series("tandem_num_requests_waiting", f'role="prefill",{M},instance="p0"', "20x40"),
         series("tandem_kv_cache_usage_ratio", f'role="decode",{M},instance="d0"', "0.8x40")]),
    "TandemDecodeBottleneck": (
        [series("tandem_num_requests_waiting", f'role="decode",{M},instance="d0"', "20x40"),
         series("tandem_num_requests_waiting", f'role="prefill",{M},instance="p0"', "0x40")],
        {"model": "m"},
        [series("tandem_num_requests_waiting", f'role="decode",{M},instance="d0"', "20x40"),
         series("tandem_num_requests_waiting", f'role="prefill",{M},instance="p0"', "5x40")]),
    "TandemErrorRateHigh": (
        [series("tandem_request_success_total", f'role="router",{M},finish_reason="length"',
                "0+80x40"),
         series("tandem_request_failure_total", f'role="router",{M},code="503"', "0+20x40")],
        {"model": "m"},
        [series("tandem_request_success_total", f'role="router",{M},finish_reason="length"',
                "0+99x40"),
         series("tandem_request_failure_total", f'role="router",{M},code="503"', "0+1x40")]),
}

# More firing cases: (alert, series, the label sets it fires with).
MORE_FIRING = [
    # The default class over its 2 s / 0.2 s fires for default only (batch within its 10 s / 1 s).
    ("TandemTTFTOverSLO", hist(TTFT, TTFT_MID, 6) + hist(TTFT, TTFT_MID, 6, "batch") + SLO_TARGETS,
     [{"model": "m", "slo_class": "default"}]),
    ("TandemTPOTOverSLO", hist(TPOT, TPOT_MID, 6) + hist(TPOT, TPOT_MID, 6, "batch") + SLO_TARGETS,
     [{"model": "m", "slo_class": "default"}]),
    # Both classes over: one alert each.
    ("TandemTTFTOverSLO", hist(TTFT, TTFT_SLOW, 6) + hist(TTFT, TTFT_SLOW, 6, "batch")
     + SLO_TARGETS, [{"model": "m", "slo_class": "batch"}, {"model": "m", "slo_class": "default"}]),
]


def main():
    promtool = shutil.which("promtool")
    if not promtool:
        print("promtool not installed")
        return 77
    out = subprocess.run([promtool, "check", "rules", RULES], capture_output=True, text=True)
    print(out.stdout + out.stderr)
    if out.returncode != 0:
        return 1
    with open(RULES) as f:
        rules = yaml.safe_load(f)
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    missing = set(alerts) - set(SCENARIOS)
    if missing:
        print("alerts without a unit test:", sorted(missing))
        return 1

    tests = []
    for name, (firing, labels, healthy) in SCENARIOS.items():
        rule = alerts[name]
        expected = {**rule.get("labels", {}), **labels}
        tests.append({"interval": "1m", "input_series": firing, "alert_rule_test": [
            {"eval_time": "30m", "alertname": name,
             "exp_alerts": [{"exp_labels": expected, "exp_annotations": rule["annotations"]}]}]})
        tests.append({"interval": "1m", "input_series": healthy, "alert_rule_test": [
            {"eval_time": "30m", "alertname": name, "exp_alerts": []}]})
    for name, firing, label_sets in MORE_FIRING:
        rule = alerts[name]
        tests.append({"interval": "1m", "input_series": firing, "alert_rule_test": [
            {"eval_time": "30m", "alertname": name,
             "exp_alerts": [{"exp_labels": {**rule.get("labels", {}), **labels},
                             "exp_annotations": rule["annotations"]} for labels in label_sets]}]})
    # Recording rules on a known input: 60 of 100 requests a minute attained.
    tests.append({"interval": "1m",
                  "input_series": [slo("attained", "0+60x20"), slo("missed", "0+40x20")],
                  "promql_expr_test": [
                      {"expr": "tandem:slo_attainment:ratio5m", "eval_time": "10m",
                       "exp_samples": [{"labels": 'tandem:slo_attainment:ratio5m'
                                                  '{model="m",slo_class="default"}',
                                        "value": 0.6}]},
                      {"expr": "tandem:goodput:rate5m", "eval_time": "10m",
                       "exp_samples": [{"labels": 'tandem:goodput:rate5m'
                                                  '{model="m",slo_class="default"}',
                                        "value": 1.0}]}]})
    # p90 per class, and over all classes per model (half of the requests under 1 s).
    tests.append({"interval": "1m",
                  "input_series": hist(TTFT, TTFT_FAST, 6) + hist(TTFT, TTFT_MID, 6, "batch"),
                  "promql_expr_test": [
                      {"expr": "tandem:ttft_seconds_by_class:p90_5m", "eval_time": "10m",
                       "exp_samples": [
                           {"labels": 'tandem:ttft_seconds_by_class:p90_5m'
                                      '{model="m",slo_class="default"}', "value": 0.9},
                           {"labels": 'tandem:ttft_seconds_by_class:p90_5m'
                                      '{model="m",slo_class="batch"}', "value": 4.6}]},
                      {"expr": "tandem:ttft_seconds:p90_5m", "eval_time": "10m",
                       "exp_samples": [{"labels": 'tandem:ttft_seconds:p90_5m{model="m"}',
                                        "value": 4.2}]}]})
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tandem-rules.test.yaml")
        with open(path, "w") as f:
            yaml.safe_dump({"rule_files": [os.path.abspath(RULES)], "evaluation_interval": "1m",
                            "tests": tests}, f, sort_keys=False)
        out = subprocess.run([promtool, "test", "rules", path], capture_output=True, text=True)
    print(out.stdout + out.stderr)
    print(f"{len(SCENARIOS)} alerts, each firing on its bad series and silent on healthy ones "
          f"(+{len(MORE_FIRING)} more firing cases)"
          if out.returncode == 0 else "promtool test rules FAILED")
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
