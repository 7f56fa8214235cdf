#!/usr/bin/env python3
"""A decode instance that stalls and resumes drops at once the requests the router has failed.

A `tandem up` cluster (router, one prefill, one decode, tiny model) with a short heartbeat
timeout (control.heartbeat_timeout_s 1 s). Long streaming requests run on decode; decode is
stopped (SIGSTOP) for three heartbeat timeouts, so the router declares it down, fails its
requests (the clients see errors, no hang) and closes its session; then decode resumes (SIGCONT).
Decode must then drop every request of the closed session at once: its /metrics show
tandem_num_requests_running == 0 and tandem_kv_cache_usage_ratio == 0 within a bound, instead of
generating requests nobody wants any more.

Needs the router side of router sessions (a fresh Hello.instance_id per connection, closing the
connection of an instance it declares down) as well as the instance side.

Env: TANDEM_BINARY; TANDEM_E2E_LOG_DIR (keep the cluster log). Exit 0 = pass.
"""
import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request

from cluster_util import FAILURES, TandemCluster, check, make_tiny_model, metric

BIN = os.environ.get("TANDEM_BINARY") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "tandem")
HEARTBEAT_TIMEOUT_S = 1.0
STREAMS = 4
MAX_TOKENS = 3000
DROP_BOUND_S = 2.0  # after SIGCONT, until decode runs nothing and holds no KV


def stream(url, i, results):
    """One streaming completion; records ("ok"|"error"|"broken", detail)."""
    body = json.dumps({"model": "tiny-test", "prompt": [5 + i, 9, 11, 13], "stream": True,
                       "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}).encode()
    request = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode(errors="replace")
        results[i] = ("error" if '"error"' in text else "ok", text[-200:])
    except urllib.error.HTTPError as e:
        results[i] = ("error", f"HTTP {e.code}")
    except Exception as e:  # a hang or a reset is a failure of the cluster
        results[i] = ("broken", repr(e))


def run(cluster):
    decode_metrics = dict(cluster.metrics_ports)["decode-0"]
    results = [None] * STREAMS
    threads = [threading.Thread(target=stream, args=(cluster.url, i, results))
               for i in range(STREAMS)]
    for t in threads:
        t.start()
    deadline = time.time() + 30
    while time.time() < deadline and (metric(decode_metrics, "tandem_num_requests_running")
                                      or 0) < STREAMS:
        time.sleep(0.05)
    running = metric(decode_metrics, "tandem_num_requests_running")
    check(running == STREAMS, f"decode runs {running} of {STREAMS} streams before the stall")
    pid = cluster.child_pid("decode", 0)
    check(pid is not None, "no decode-0 process")
    os.kill(pid, signal.SIGSTOP)
    time.sleep(3 * HEARTBEAT_TIMEOUT_S)
    for t in threads:  # the router failed the streams while decode was stopped
        t.join(timeout=10)
    os.kill(pid, signal.SIGCONT)
    resumed = time.time()
    check(all(not t.is_alive() for t in threads), "streams still open after the router "
          "declared decode down")
    check(all(r and r[0] == "error" for r in results), f"streams did not fail cleanly: {results}")
    dropped = False
    while time.time() < resumed + DROP_BOUND_S and not dropped:
        try:
            dropped = (metric(decode_metrics, "tandem_num_requests_running") == 0 and
                       metric(decode_metrics, "tandem_kv_cache_usage_ratio") == 0)
        except Exception:
            pass
        if not dropped:
            time.sleep(0.05)
    print(f"decode dropped the failed requests {time.time() - resumed:.2f} s after SIGCONT"
          if dropped else "decode kept the failed requests", flush=True)
    check(dropped, f"decode still runs requests {DROP_BOUND_S} s after it resumed: running "
          f"{metric(decode_metrics, 'tandem_num_requests_running')}, KV usage "
          f"{metric(decode_metrics, 'tandem_kv_cache_usage_ratio')}")
    check(cluster.child_pid("decode", 0) == pid, "decode-0 was restarted: the test saw nothing")


def main():
    if not os.path.exists(BIN):
        print("no tandem binary at", BIN)
        return 1
    with tempfile.TemporaryDirectory(prefix="tandem-stall-") as work:
        model_dir = make_tiny_model(BIN, work)
        cluster = TandemCluster("stall", BIN, model_dir, work, prefill=1, decode=1,
                                extra={"control": {"heartbeat_interval_s": 0.1,
                                                   "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S}})
        cluster.config["model"]["max_model_len"] = 4096
        cluster.config["decode"]["kv_blocks"] = 1024
        cluster.write_config()
        try:
            cluster.start()
            run(cluster)
        except Exception:
            print(cluster.tail(80))
            raise
        finally:
            cluster.stop()
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
