"""`tandem up` as a supervisor (tiny model, 1 prefill + 1 decode over UCX tcp):

1. Children run the config snapshot `up` validated, not the live file: the live file is broken
   while the cluster runs and a child is killed; it comes back on the snapshot and the cluster
   serves again (a child that read the live file would exit at load, for ever).
2. A child that stops answering /health (SIGSTOP) is killed and restarted within a bound
   (launcher.health_* small), and the cluster serves again.
3. SIGHUP rereads the live file: the router reloads the SLO written there; an invalid live file
   is reported and changes nothing.
4. Stopping removes the run directory.

Env: TANDEM_BINARY. Exit 0 = pass."""
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request

from cluster_util import FAILURES, TandemCluster, check, children_of, make_tiny_model

BIN = os.environ.get("TANDEM_BINARY", "build/tandem")


def complete(url, model):
    body = json.dumps({"model": model, "prompt": "hello there", "max_tokens": 4,
                       "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return r.status, json.loads(r.read())["choices"][0]["text"]


def wait_for(predicate, timeout, step=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None


def run_dir_of(cluster):
    for pid, cmd in children_of(cluster.proc.pid):
        if "--config" in cmd:
            return os.path.dirname(cmd[cmd.index("--config") + 1])
    return None


def main():
    if not os.path.exists(BIN):
        print("no tandem binary at", BIN)
        return 1
    with tempfile.TemporaryDirectory(prefix="tandem-launcher-") as work:
        model_dir = make_tiny_model(BIN, work)
        cluster = TandemCluster(
            "sup", BIN, model_dir, work, prefill=1, decode=1,
            extra={"launcher": {"health_interval_s": 0.2, "health_timeout_s": 0.5,
                                "health_failures": 3}})
        try:
            cluster.start()
            status, first = complete(cluster.url, "tiny-test")
            check(status == 200, "a completion before the faults")

            # 0. Every child runs on the snapshot in the run directory.
            run_dir = run_dir_of(cluster)
            check(run_dir is not None and run_dir != os.path.dirname(cluster.config_path),
                  f"children's --config is in a private run dir, got {run_dir}")

            # 1. The live file broken, a child killed: it comes back on the snapshot.
            live = dict(cluster.config)
            cluster.config["kv_cache"] = {"block_size": 3}
            cluster.write_config()
            decode = cluster.child_pid("decode", 0)
            os.kill(decode, signal.SIGKILL)
            back = wait_for(lambda: (cluster.child_pid("decode", 0) or decode) != decode, 15)
            check(back, "decode-0 restarted after SIGKILL")
            check(cluster.wait_ready(30), "ready again after the restart (on the snapshot)")
            time.sleep(1)
            check(cluster.child_pid("decode", 0) not in (None, decode),
                  "the restarted decode-0 keeps running (no crash loop on the broken live file)")
            status, again = complete(cluster.url, "tiny-test")
            check(status == 200 and again == first,
                  f"same greedy completion after the restart: {first!r} vs {again!r}")

            # 3b. SIGHUP with the broken live file: reported, nothing changes.
            os.kill(cluster.proc.pid, signal.SIGHUP)
            check(wait_for(lambda: "is not valid, the cluster keeps running" in cluster.tail(200),
                           10), "an invalid live file on SIGHUP is reported")

            # 2. A hung child is killed and restarted.
            decode = cluster.child_pid("decode", 0)
            os.kill(decode, signal.SIGSTOP)
            t0 = time.time()
            back = wait_for(lambda: (cluster.child_pid("decode", 0) or decode) != decode, 20)
            check(back, "a SIGSTOPped decode-0 is replaced")
            print(f"hung decode-0 replaced after {time.time() - t0:.1f} s", flush=True)
            check(not os.path.exists(f"/proc/{decode}") or
                  open(f"/proc/{decode}/stat").read().split(")")[1].split()[0] == "Z",
                  "the hung decode-0 was killed")
            check(cluster.wait_ready(30), "ready again after replacing the hung child")
            status, again = complete(cluster.url, "tiny-test")
            check(status == 200 and again == first, "serves after replacing the hung child")
            check("failed 3 health check(s) in a row" in cluster.tail(400),
                  "the launcher says why it killed the child")

            # 3. SIGHUP rereads the live file.
            cluster.config = live
            cluster.config["slo"] = {"ttft_s": 7.5, "tpot_s": 10}
            cluster.write_config()
            os.kill(cluster.proc.pid, signal.SIGHUP)
            check(wait_for(lambda: "SLO ttft 7.5 s" in cluster.tail(400), 10),
                  "the router reloaded the SLO from the live file")
        except Exception as e:  # noqa: BLE001 - report and fail
            check(False, f"{type(e).__name__}: {e}")
        finally:
            run_dir = run_dir_of(cluster) if cluster.proc else None
            if FAILURES:
                print(cluster.tail(80))
            cluster.stop()
            if run_dir:
                check(not os.path.exists(run_dir), f"run dir {run_dir} removed at stop")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
