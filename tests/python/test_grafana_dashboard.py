#!/usr/bin/env python3
"""deploy/grafana/tandem-dashboard.json against a live cluster: every panel's every query, run by a
real Prometheus that scraped a running multi-instance cluster under load, returns data.

1. Lint: the JSON's shape (schemaVersion, the `datasource` and `model` variables, unique panel
   ids, a gridPos, a datasource and targets with an expr on every panel, `$model` in every Tandem
   query) and every expr, with Grafana's variables replaced, parses (`promtool check rules` on
   the exprs written as recording rules).
2. Starts `tandem up` with 2 prefill + 2 decode instances (tiny model, every instance with a
   metrics port, the goodput policy on a latency model just profiled with `tandem profile`,
   replica recommendations every second, three SLO classes, API keys, a small
   router.max_concurrent_requests) and /usr/bin/prometheus scraping the router and every
   instance each second with deploy/prometheus/tandem-rules.yaml loaded.
3. Drives load: requests in two SLO classes, a class no placement can meet (429 at admission),
   a burst over max_concurrent_requests (429), requests without a key and with a wrong one
   (401), an unknown class (400), and a prefill instance killed under load (its requests fail,
   the router loses it, a KV pull from it may fail, the launcher restarts it).
4. Runs every target's expr through /api/v1/query and fails naming each panel (title and expr)
   whose query returns no series or no finite value. Targets written `X or on() vector(0)` (see
   the dashboard's description) are also run without the fallback, and the ones that only had
   the fallback are listed (not a failure: the event did not happen). Targets using `$slo_class`
   (the latency rows, repeated per class) are also run with each class that had traffic and must
   return that class alone.

kube_deployment_status_replicas (kube-state-metrics, Kubernetes only) is parsed but not required
to return data. Exit 0 = pass, 77 = skip (no promtool/prometheus or no tandem binary)."""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from cluster_util import FAILURES, TandemCluster, check, free_base, make_tiny_model  # noqa: E402

SRC = os.environ.get("TANDEM_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
DASHBOARD = os.path.join(SRC, "deploy", "grafana", "tandem-dashboard.json")
RULES = os.path.join(SRC, "deploy", "prometheus", "tandem-rules.yaml")
BIN = os.environ.get("TANDEM_BINARY") or os.path.join(SRC, "build", "tandem")
PROMETHEUS = "/usr/bin/prometheus"

API_KEY = "grafana-test-key-0123456789"
MODEL = "tiny-test"
RATE_INTERVAL = "1m"     # what $__rate_interval and $__interval become
LOAD_S = 40              # seconds of steady load (the [1m] windows then hold only load)
# Metrics that a local cluster cannot have: parsed, not required to return data.
NOT_LOCAL = {"kube_deployment_status_replicas": "kube-state-metrics on Kubernetes"}
FALLBACK = " or on() vector(0)"


def substitute(expr, model, slo_class=".*"):
    """The expr as Grafana sends it: its variables replaced by concrete values (`slo_class`: one
    class, as in a row repeated per class, or every class)."""
    for var, value in (("$__rate_interval", RATE_INTERVAL), ("${__rate_interval}", RATE_INTERVAL),
                       ("$__interval", RATE_INTERVAL), ("${__interval}", RATE_INTERVAL),
                       ("${model}", model), ("$model", model), ("${datasource}", "prometheus"),
                       ("$datasource", "prometheus"), ("${slo_class}", slo_class),
                       ("$slo_class", slo_class)):
        expr = expr.replace(var, value)
    return expr


def data_panels(dashboard):
    """Every panel that is not a row, rows' nested (collapsed) panels included."""
    out = []
    for p in dashboard.get("panels", []):
        if p.get("type") == "row":
            out += p.get("panels", [])
        else:
            out.append(p)
    return out


def lint(dashboard, promtool, work):
    check(dashboard.get("schemaVersion", 0) >= 36, "schemaVersion < 36")
    check(dashboard.get("uid"), "dashboard has no uid")
    check(dashboard.get("time", {}).get("from"), "dashboard has no time range")
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    check(ds.get("type") == "datasource" and ds.get("query") == "prometheus",
          "no `datasource` variable of type datasource/prometheus")
    model = variables.get("model", {})
    check(model.get("type") == "query" and "label_values(" in json.dumps(model.get("query")),
          "no `model` variable with a label_values query")
    slo_class = variables.get("slo_class", {})
    check(slo_class.get("type") == "query" and "label_values(" in json.dumps(slo_class.get("query"))
          and slo_class.get("includeAll") and slo_class.get("allValue") == ".*",
          "no `slo_class` variable (label_values, All = .*) for the latency rows per class")
    ids = [p.get("id") for p in dashboard.get("panels", [])]
    ids += [q.get("id") for p in dashboard.get("panels", []) for q in p.get("panels", [])]
    check(len(ids) == len(set(ids)) and None not in ids, f"panel ids not unique: {ids}")
    rules = []
    cells = set()
    for p in dashboard.get("panels", []) + [q for p in dashboard.get("panels", [])
                                           for q in p.get("panels", [])]:
        title = p.get("title", f"panel {p.get('id')}")
        gp = p.get("gridPos", {})
        if not check(all(isinstance(gp.get(k), int) for k in "hwxy") and gp["x"] + gp["w"] <= 24,
                     f"{title}: bad gridPos {gp}"):
            continue
        overlap = {(gp["x"] + i, gp["y"] + j) for i in range(gp["w"]) for j in range(gp["h"])}
        check(not (cells & overlap), f"{title}: gridPos overlaps another panel")
        cells |= overlap
        if p.get("type") == "row":
            continue
        check(p.get("datasource", {}).get("uid") == "${datasource}",
              f"{title}: datasource is not ${{datasource}}")
        check(p.get("description"), f"{title}: no description")
        targets = p.get("targets", [])
        check(targets, f"{title}: no targets")
        refs = [t.get("refId") for t in targets]
        check(len(refs) == len(set(refs)), f"{title}: refIds not unique")
        for t in targets:
            expr = t.get("expr", "")
            if not check(expr.strip(), f"{title}: target {t.get('refId')} has no expr"):
                continue
            check(t.get("datasource", {}).get("uid", "${datasource}") == "${datasource}",
                  f"{title}: target {t.get('refId')} has another datasource")
            if not any(m in expr for m in NOT_LOCAL):
                check("$model" in expr, f"{title}: {expr} does not use $model")
            rules.append({"record": f"grafana:panel_{p.get('id')}_{t.get('refId')}",
                          "expr": substitute(expr, MODEL)})
    path = os.path.join(work, "exprs.yaml")
    with open(path, "w") as f:
        json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, indent=1)
    out = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True,
                         timeout=60)
    check(out.returncode == 0, f"dashboard exprs do not parse:\n{out.stdout}{out.stderr}")
    print(f"lint: {len(data_panels(dashboard))} panels, {len(rules)} exprs parse", flush=True)


def post(url, body, headers, timeout=60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return -1


def completion(url, slo_class=None, key=API_KEY, max_tokens=12):
    headers = {}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if slo_class:
        headers["x-tandem-slo-class"] = slo_class
    return post(url + "/v1/completions",
                {"model": MODEL, "prompt": "The quick brown fox jumps over the lazy dog " * 3,
                 "max_tokens": max_tokens, "temperature": 0}, headers)


def start_prometheus(work, targets):
    port = free_base(1)
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                         "scrape_timeout": "1s"},
              "rule_files": [os.path.abspath(RULES)],
              "scrape_configs": [{"job_name": "tandem",
                                  "static_configs": [{"targets": targets}]}]}
    path = os.path.join(work, "prometheus.yml")
    with open(path, "w") as f:
        json.dump(config, f)
    log = open(os.path.join(work, "prometheus.log"), "w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={path}",
                             f"--storage.tsdb.path={os.path.join(work, 'tsdb')}",
                             f"--web.listen-address=127.0.0.1:{port}",
                             "--storage.tsdb.retention.time=1h"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("prometheus exited; see " + log.name)
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    return proc, url, log
        except Exception:
            pass
        time.sleep(0.25)
    raise RuntimeError("prometheus not ready in 30 s")


def prom_query(url, expr):
    """(series, error) for an instant query."""
    qs = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{qs}", timeout=10) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        return [], f"HTTP {e.code}: {e.read().decode()[:300]}"
    except Exception as e:
        return [], str(e)
    if body.get("status") != "success":
        return [], body.get("error", "query failed")
    return body["data"]["result"], None


def finite(series):
    """The series with a value. +Inf counts (a capacity whose objective never binds is exported
    as +Inf); NaN (e.g. a quantile of no observations) does not."""
    out = []
    for s in series:
        try:
            v = float(s["value"][1])
        except (KeyError, ValueError, IndexError):
            continue
        if not math.isnan(v):
            out.append(s)
    return out


def drive_load(cluster, log):
    """The load described in the module docstring; returns {what: [statuses]}."""
    url = cluster.url
    got = {}
    lock = threading.Lock()

    def note(what, status):
        with lock:
            got.setdefault(what, []).append(status)

    # Probes that only need to happen once (their counters then exist).
    note("no key", completion(url, "interactive", key=None))
    note("wrong key", completion(url, "interactive", key="not-a-key"))
    note("unknown class", completion(url, "no-such-class"))
    for _ in range(3):
        note("strict class", completion(url, "strict"))

    stop = time.time() + LOAD_S

    def worker(i):
        n = 0
        while time.time() < stop:
            cls = ("interactive", "batch")[(i + n) % 2]
            note(cls, completion(url, cls, max_tokens=8 + 4 * (n % 3)))
            n += 1

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(3)]
    for w in workers:
        w.start()
    time.sleep(LOAD_S * 0.3)
    # A burst over router.max_concurrent_requests.
    burst = [threading.Thread(target=lambda: note("burst", completion(url, "batch")), daemon=True)
             for _ in range(12)]
    for b in burst:
        b.start()
    for b in burst:
        b.join(timeout=90)
    time.sleep(LOAD_S * 0.1)
    # An instance lost under load: its requests fail (503), the router counts the disconnect,
    # a decode pulling its KV at that moment counts a failed pull
    # (tandem_kv_transfer_failures_total{reason="peer_unavailable"}, timing-dependent), and the
    # launcher restarts it. (Stalling an instance with SIGSTOP instead provoked no failed pull
    # here: the pulls of a tiny model's KV take about a millisecond.)
    pid = cluster.child_pid("prefill", 0)
    if check(pid, "no prefill-0 child to kill"):
        log(f"killing prefill-0 (pid {pid})")
        os.kill(pid, signal.SIGKILL)
    for w in workers:
        w.join(timeout=LOAD_S + 90)
    for _ in range(3):
        note("strict class", completion(url, "strict"))
    return got


def check_queries(dashboard, prom_url, log):
    """Every panel's every target through /api/v1/query (see the module docstring)."""
    # The `model` variable's query.
    series, err = prom_query(prom_url, "count by (model) (tandem_num_requests_running)")
    models = {s["metric"].get("model") for s in series}
    check(MODEL in models, f"the model variable would not offer {MODEL}: {models} {err}")

    # Per-class and per-role panels show every class and role, not just one (the latency
    # histograms and the slo_class variable's query included).
    for expr, label, want in (
            ("tandem_time_to_first_token_seconds_count", "slo_class",
             {"default", "interactive", "batch"}),
            ("tandem_time_per_output_token_seconds_count", "slo_class", {"interactive", "batch"}),
            ("tandem:goodput:rate5m", "slo_class", {"interactive", "batch"}),
            ("tandem:slo_attainment:ratio5m", "slo_class", {"interactive", "batch"}),
            ("tandem_router_slo_requests_total", "result", {"attained", "rejected"}),
            ("tandem_router_slo_target_seconds", "slo_class",
             {"default", "interactive", "batch", "strict"}),
            ("tandem_recommended_replicas", "role", {"prefill", "decode"}),
            ("tandem_num_requests_waiting", "role", {"prefill", "decode"}),
            ("tandem_kv_cache_usage_ratio", "role", {"prefill", "decode"})):
        series, err = prom_query(prom_url, f'count by ({label}) ({expr}{{model="{MODEL}"}})')
        have = {s["metric"].get(label) for s in series}
        check(want <= have, f"{expr}: {label} {sorted(want - have)} missing (have "
                            f"{sorted(have)}) {err or ''}")

    empty, fallback_only, ran = [], [], 0
    for p in data_panels(dashboard):
        for t in p.get("targets", []):
            expr = substitute(t["expr"], MODEL)
            ran += 1
            series, err = prom_query(prom_url, expr)
            local = not any(m in expr for m in NOT_LOCAL)
            if not finite(series):
                if local:
                    why = err or f"{len(series)} series, none finite"
                    empty.append(f"{p['title']!r} [{t['refId']}]: {expr} ({why})")
                else:
                    log(f"no data, as expected off Kubernetes: {p['title']!r} [{t['refId']}]")
                continue
            if FALLBACK in expr:
                real, _ = prom_query(prom_url, expr.replace(FALLBACK, ""))
                if not real:
                    fallback_only.append(f"{p['title']!r} [{t['refId']}]")
            # A row repeated per class: its queries with each class that had traffic.
            for cls in (("interactive", "batch") if "$slo_class" in t["expr"] else ()):
                one = substitute(t["expr"], MODEL, cls)
                ran += 1
                series, err = prom_query(prom_url, one)
                if not finite(series) or {s["metric"].get("slo_class") for s in series} != {cls}:
                    empty.append(f"{p['title']!r} [{t['refId']}] for {cls}: {one} "
                                 f"({err or [s['metric'] for s in series]})")
    log(f"ran {ran} queries")
    for what in ("sum by (reason) (tandem_kv_transfer_failures_total)",
                 "sum by (result) (tandem_router_placements_total)",
                 "sum by (code) (tandem_request_failure_total)",
                 "sum by (slo_class, result) (tandem_router_slo_requests_total)",
                 "sum by (role) (tandem_recommended_replicas)"):
        series, _ = prom_query(prom_url, what)
        log(f"{what}: " + ", ".join(
            f"{','.join(s['metric'].values()) or '-'}={float(s['value'][1]):g}"
            for s in series))
    if fallback_only:
        log("only the `or on() vector(0)` fallback (the event did not happen here): "
            + "; ".join(fallback_only))
    for e in empty:
        check(False, "panel query returns no data: " + e)


def main():
    promtool = shutil.which("promtool")
    if not promtool or not os.access(PROMETHEUS, os.X_OK):
        print("skipped: promtool or /usr/bin/prometheus not installed (Debian: prometheus)")
        return 77
    if not os.access(BIN, os.X_OK):
        print(f"skipped: no tandem binary at {BIN}")
        return 77
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:6.1f} s] {msg}", flush=True)

    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    work = tempfile.mkdtemp(prefix="tandem-grafana-")
    lint(dashboard, promtool, work)
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1

    cluster = prom = prom_log = None
    try:
        model_dir = make_tiny_model(BIN, work)
        lm = os.path.join(work, "lm.yaml")
        t = time.time()
        subprocess.run([BIN, "profile", "--model-preset", "tiny", "--threads", "1", "--out", lm],
                       check=True, capture_output=True, timeout=120)
        log(f"tandem profile: {time.time() - t:.1f} s")
        cluster = TandemCluster("grafana", BIN, model_dir, work, prefill=2, decode=2,
                                model_name=MODEL, ready_timeout_s=90)
        cluster.config["router"].update({
            "latency_model": lm, "recommend_interval_s": 1, "recommend_window_s": 20,
            "max_concurrent_requests": 4})
        cluster.config["slo"] = {
            "ttft_s": 60, "tpot_s": 10, "attainment_target": 0.9,
            "classes": [{"name": "interactive", "ttft_s": 10, "tpot_s": 2},
                        {"name": "batch", "ttft_s": 60, "tpot_s": 10},
                        # No placement predicts a TTFT of 1 us: 429 (once the router has load
                        # reports; the first ones may be admitted and then miss).
                        {"name": "strict", "ttft_s": 1e-6, "tpot_s": 1e-6}]}
        cluster.write_config()
        os.environ["TANDEM_API_KEYS"] = API_KEY  # the launcher's router inherits it
        t = time.time()
        cluster.start()
        check(cluster.wait_usable({"prefill": 2, "decode": 2}, timeout=30),
              f"router does not see 2 prefill + 2 decode: {cluster.usable()}")
        log(f"cluster ready: {time.time() - t:.1f} s")
        targets = [f"127.0.0.1:{cluster.router_port}"] + [
            f"127.0.0.1:{port}" for _, port in cluster.metrics_ports]
        prom, prom_url, prom_log = start_prometheus(work, targets)
        log(f"prometheus at {prom_url} scraping {len(targets)} targets")

        got = drive_load(cluster, log)
        log("load done: " + ", ".join(
            f"{what}: " + " ".join(f"{s}x{v.count(s)}" for s in sorted(set(v)))
            for what, v in sorted(got.items())))
        check(got.get("no key", [None])[0] == 401, f"no key: {got.get('no key')}")
        check(200 in got.get("interactive", []) and 200 in got.get("batch", []),
              "no request succeeded in both SLO classes")
        # Every scraped target up, once the killed instance is back.
        deadline = time.time() + 30
        while time.time() < deadline:
            up, _ = prom_query(prom_url, "up == 1")
            if len(up) == len(targets):
                break
            time.sleep(1)
        check(len(up) == len(targets), f"only {len(up)} of {len(targets)} targets up")
        # Two more evaluations of the recording rules and scrapes after the last request.
        time.sleep(3)

        check_queries(dashboard, prom_url, log)
    finally:
        if prom is not None:
            try:
                os.killpg(prom.pid, signal.SIGTERM)
                prom.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(prom.pid, signal.SIGKILL)
                prom.wait()
            except ProcessLookupError:
                pass
            prom_log.close()
        if cluster is not None:
            cluster.stop()
        if FAILURES:
            for name in ("grafana.log", "prometheus.log"):
                tail = ""
                try:
                    with open(os.path.join(work, name)) as f:
                        tail = "".join(f.readlines()[-30:])
                except OSError:
                    pass
                print(f"--- {name} (last lines)\n{tail}")
        shutil.rmtree(work, ignore_errors=True)
    log(f"done: {len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
