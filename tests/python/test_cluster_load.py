#!/usr/bin/env python3
"""Load test of a `tandem up` cluster (tiny model, prefill + decode over UCX tcp), with a real
Prometheus server scraping every role.

1. 2,000 requests at concurrency 64, a seeded mix of prompt lengths (1-200 tokens), max_tokens
   (1-64), streaming and not, chat and completions, plus a few deliberately invalid ones. Every
   request must be accounted for: completed (finish_reason stop/length with consistent usage) or
   an HTTP error / in-stream error event it was told about. Nothing may be lost (no exception
   other than a typed HTTP error, no hang). The router's own success/failure counters must
   agree with the client's tally, and every instance must have done some of the work.
   (Streams are parsed per the SSE spec, split on CR/LF only: the tiny model emits U+0085,
   which JSON may carry unescaped and httpx's aiter_lines would split on.)
2. Memory: RSS (VmRSS) of the launcher and every child after a warm-up of 200 requests and at
   the end; growth must stay under 25 %. No child may have been restarted.
3. After the load every KV pool is free again (tandem_kv_cache_usage_ratio == 0) and nothing
   is running (tandem_num_requests_running == 0 / waiting == 0) on every instance and the router;
   a sampler during the load shows the decode KV gauges did rise above 0.
4. `prometheus` (own config and storage dir, scrape_interval 1s) scrapes the router and every
   instance's metrics port: `up` == 1 for each target, each role's own series are stored, and
   the TTFT histogram answers tandem_time_to_first_token_seconds_count and histogram_quantile.

Client-side latencies include the Python client's own CPU time (httpx, 64 streams in one event
loop on a shared 2-core box: several hundred ms at p50, while curl next to it sees ~15 ms);
the router-side means printed next to them are what the servers measure.

Env: TANDEM_BINARY; TANDEM_LOAD_PREFILL / TANDEM_LOAD_DECODE (instances, default 2 each);
TANDEM_E2E_LOG_DIR (keep the cluster and prometheus logs). Exit 0 = pass. Everything is
stopped in finally blocks (SIGTERM, then SIGKILL after a timeout).
"""
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import httpx

from cluster_util import (FAILURES, TandemCluster, check, free_base, http_get, make_tiny_model,
                          stop_process, tail_file)

BIN = os.environ.get("TANDEM_BINARY") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "tandem")
MODEL = "tiny-test"
READY_TIMEOUT_S = 90
SEED = 20240605
NUM_REQUESTS = 2000
WARMUP = 200
CONCURRENCY = 64
REQUEST_TIMEOUT_S = 60      # one request, connect to last byte
WARMUP_TIMEOUT_S = 60       # all requests of the warm-up
LOAD_TIMEOUT_S = 150        # all requests of the load phase
IDLE_TIMEOUT_S = 20         # cluster idle (no running request, KV pools free) after a phase
PROMETHEUS_TIMEOUT_S = 30   # prometheus ready and answering
MAX_RSS_GROWTH = 0.25


# --- processes -----------------------------------------------------------------------------------


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def parse_metrics(body):
    """{name: [(labels_text, value)]} of a Prometheus text exposition."""
    out = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        try:
            out.setdefault(name, []).append((labels.rstrip("}"), float(value)))
        except ValueError:
            pass
    return out


class Cluster(TandemCluster):
    def __init__(self, name, model_dir, workdir, prefill, decode):
        # Generous SLOs: this checks accounting and resources on a shared CPU, not admission.
        super().__init__(name, BIN, model_dir, workdir, prefill, decode, model_name=MODEL,
                         slo=(120, 30), extra={"logging": {"level": "warn"}},
                         ready_timeout_s=READY_TIMEOUT_S)


# --- the request mix --------------------------------------------------------------------------

WORDS = ("the a of to and in is it you that he was for on are with as his they be at one have "
         "this from or had by hot word but what some we can out other were all there when up use "
         "your how said an each she which do their time if will way about many then them write "
         "would like so these her long make thing see him two has look more day could go come "
         "did number sound no most people my over know water than call first who may down side "
         "been now find any new work part take get place made live where after back little only "
         "round man year came show every good me give our under name very through just form "
         "sentence great think say help low line differ turn cause much mean before move right "
         "boy old too same tell does set three want air well also play small end put home read "
         "hand port large spell add even land here must big high such follow act why ask men "
         "change went light kind off need house picture try us again animal point mother world").split()


def make_requests(vocab):
    """A seeded list of request specs: (kind, body, expect) where expect says what must come back."""
    rng = random.Random(SEED)
    specs = []
    for i in range(NUM_REQUESTS):
        r = rng.random()
        length = (rng.randint(1, 32) if r < 0.6 else
                  rng.randint(33, 120) if r < 0.9 else rng.randint(121, 200))
        max_tokens = rng.randint(1, 64)
        chat = rng.random() < 0.4
        stream = rng.random() < 0.5
        body = {"model": MODEL, "max_tokens": max_tokens}
        if rng.random() < 0.5:
            body["temperature"] = 0
        else:
            body["temperature"] = 0.8
            body["top_p"] = 0.95
            body["seed"] = rng.randrange(1 << 30)
        ignore_eos = rng.random() < 0.5
        if ignore_eos:
            body["ignore_eos"] = True
        stop = None
        if rng.random() < 0.1:
            stop = [rng.choice(WORDS)]
            body["stop"] = stop
        include_usage = stream and rng.random() < 0.8
        if stream:
            body["stream"] = True
            if include_usage:
                body["stream_options"] = {"include_usage": True}
        prompt_len = None
        if chat:
            # About one token a word for this tokenizer: 1-200 tokens, give or take.
            words = max(1, length * 2 // 3)
            body["messages"] = [{"role": "user",
                                 "content": " ".join(rng.choice(WORDS) for _ in range(words))}]
        else:
            body["prompt"] = [rng.randrange(3, min(vocab, 2000)) for _ in range(length)]
            prompt_len = length
        # About 2 % invalid, each answered with a known status.
        invalid = None
        x = rng.random()
        if x < 0.01:
            body["max_tokens"] = -1
            invalid = 400
        elif x < 0.02:
            body["model"] = "no-such-model"
            invalid = 404
        specs.append({
            "i": i, "path": "/v1/chat/completions" if chat else "/v1/completions",
            "kind": ("chat" if chat else "completion") + ("/stream" if stream else ""),
            "body": body, "stream": stream, "include_usage": include_usage,
            "max_tokens": max_tokens, "prompt_len": prompt_len,
            "exact_length": ignore_eos and stop is None, "invalid": invalid,
        })
    return specs


def check_usage(spec, usage, finish, problems):
    if usage is None:
        problems.append("no usage")
        return
    p, c, t = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
    if not (isinstance(p, int) and isinstance(c, int) and t == p + c):
        problems.append(f"usage inconsistent {usage}")
        return
    if spec["prompt_len"] is not None and p != spec["prompt_len"]:
        problems.append(f"prompt_tokens {p} != {spec['prompt_len']}")
    if p <= 0:
        problems.append(f"prompt_tokens {p}")
    if not 1 <= c <= spec["max_tokens"]:
        problems.append(f"completion_tokens {c} outside 1..{spec['max_tokens']}")
    if finish == "length" and c != spec["max_tokens"]:
        problems.append(f"finish length with {c} != max_tokens {spec['max_tokens']}")
    if spec["exact_length"] and (finish != "length" or c != spec["max_tokens"]):
        problems.append(f"ignore_eos: finish {finish} with {c} of {spec['max_tokens']} tokens")


async def sse_lines(response):
    """The lines of an event stream, split on CR, LF or CRLF only (the SSE spec). Not
    httpx's aiter_lines: it splits on str.splitlines() boundaries too, and U+0085 or U+2028
    may stand unescaped inside a JSON string (the tiny model does emit U+0085)."""
    buffer = b""
    async for data in response.aiter_bytes():
        buffer += data
        lines = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        buffer = lines.pop()
        for line in lines:
            yield line
    if buffer:
        yield buffer


async def one_request(client, base_url, spec):
    """Returns a result dict: outcome is 'ok', 'http_error', 'stream_error' or 'lost'."""
    t0 = time.monotonic()
    res = {"spec": spec, "outcome": "lost", "detail": "", "ttft": None, "e2e": None}
    problems = []
    try:
        if not spec["stream"]:
            r = await client.post(base_url + spec["path"], json=spec["body"])
            res["e2e"] = time.monotonic() - t0
            if r.status_code != 200:
                res["outcome"] = "http_error"
                res["status"] = r.status_code
                res["retry_after"] = r.headers.get("retry-after")
                try:
                    err = r.json()["error"]
                    res["detail"] = f"{err.get('type')}: {err.get('message')}"
                except Exception:
                    problems.append(f"HTTP {r.status_code} without an OpenAI error body: {r.text[:200]}")
            else:
                data = r.json()
                choices = data.get("choices") or []
                finish = choices[0].get("finish_reason") if len(choices) == 1 else None
                if finish not in ("stop", "length"):
                    problems.append(f"finish_reason {finish!r}")
                check_usage(spec, data.get("usage"), finish, problems)
                res["outcome"] = "ok"
                res["finish"] = finish
        else:
            async with client.stream("POST", base_url + spec["path"], json=spec["body"]) as r:
                if r.status_code != 200:
                    body = await r.aread()
                    res["e2e"] = time.monotonic() - t0
                    res["outcome"] = "http_error"
                    res["status"] = r.status_code
                    res["retry_after"] = r.headers.get("retry-after")
                    try:
                        err = json.loads(body)["error"]
                        res["detail"] = f"{err.get('type')}: {err.get('message')}"
                    except Exception:
                        problems.append(f"HTTP {r.status_code} without an OpenAI error body")
                else:
                    finishes, usage, done, error, chunks = [], None, False, None, 0
                    async for line in sse_lines(r):
                        if not line.startswith(b"data: "):
                            continue
                        payload = line[6:]
                        if payload == b"[DONE]":
                            done = True
                            continue
                        if done:
                            problems.append("data after [DONE]")
                        try:
                            event = json.loads(payload)
                        except ValueError as e:
                            raise ValueError(f"{e}: {payload[:300]!r}") from None
                        if "error" in event:
                            error = event["error"]
                            continue
                        chunks += 1
                        if res["ttft"] is None:
                            res["ttft"] = time.monotonic() - t0
                        if event.get("usage"):
                            usage = event["usage"]
                        for choice in event.get("choices") or []:
                            if choice.get("finish_reason"):
                                finishes.append(choice["finish_reason"])
                    res["e2e"] = time.monotonic() - t0
                    if not done:
                        problems.append("stream ended without [DONE]")
                    if error is not None:
                        res["outcome"] = "stream_error"
                        res["detail"] = f"{error.get('type')}: {error.get('message')}"
                    else:
                        if len(finishes) != 1 or finishes[0] not in ("stop", "length"):
                            problems.append(f"finish_reasons {finishes}")
                        finish = finishes[0] if finishes else None
                        if spec["include_usage"]:
                            check_usage(spec, usage, finish, problems)
                        elif usage is not None:
                            problems.append("usage chunk without include_usage")
                        res["outcome"] = "ok"
                        res["finish"] = finish
    except httpx.HTTPError as e:  # timeout, reset, protocol error: the request was lost
        res["outcome"] = "lost"
        res["detail"] = f"{type(e).__name__}: {e}"
    except Exception as e:  # a malformed body: also a failure, but keep going
        res["outcome"] = "lost"
        res["detail"] = f"{type(e).__name__}: {e!r}"
    res["problems"] = problems
    return res


async def run_phase(base_url, specs, phase_timeout):
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=10)
    results = [None] * len(specs)
    queue = list(reversed(range(len(specs))))

    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        async def worker():
            while queue:
                k = queue.pop()
                # One request is bounded on its own too (httpx's timeout is per read).
                try:
                    results[k] = await asyncio.wait_for(
                        one_request(client, base_url, specs[k]), REQUEST_TIMEOUT_S * 2)
                except asyncio.TimeoutError:
                    results[k] = {"spec": specs[k], "outcome": "lost", "problems": [],
                                  "detail": "no answer within the bound (hang)", "e2e": None,
                                  "ttft": None}

        workers = [asyncio.create_task(worker()) for _ in range(CONCURRENCY)]
        done, pending = await asyncio.wait(workers, timeout=phase_timeout)
        for t in pending:
            t.cancel()
        for t in done:
            if t.exception():
                print("worker died:", repr(t.exception()), flush=True)
    return results


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def account(results):
    """Prints the table; returns {outcome: count}. Lost / inconsistent requests are failures."""
    table = {}
    totals = {"ok": 0, "http_error": 0, "stream_error": 0, "lost": 0}
    unexpected = []
    for k, res in enumerate(results):
        if res is None:
            totals["lost"] += 1
            unexpected.append(f"request {k}: never ran (phase timed out)")
            continue
        spec = res["spec"]
        outcome = res["outcome"]
        totals[outcome] += 1
        if outcome == "ok":
            column = f"ok/{res.get('finish')}"
        elif outcome == "http_error":
            column = f"http {res['status']}"
        else:
            column = outcome
        row = table.setdefault(spec["kind"], {})
        row[column] = row.get(column, 0) + 1
        if res["problems"]:
            unexpected.append(f"request {spec['i']} ({spec['kind']}): {res['problems']}")
        if outcome == "lost":
            unexpected.append(f"request {spec['i']} ({spec['kind']}) lost: {res['detail']}")
        if spec["invalid"] is not None:
            if outcome != "http_error" or res["status"] != spec["invalid"]:
                unexpected.append(f"request {spec['i']}: invalid, expected HTTP {spec['invalid']}, "
                                  f"got {outcome} {res.get('status')} {res['detail']}")
        elif outcome == "http_error":
            # A valid request may be refused for load (429, with Retry-After), never broken.
            if res["status"] != 429 or not res.get("retry_after"):
                unexpected.append(f"request {spec['i']} ({spec['kind']}): HTTP {res['status']} "
                                  f"{res['detail']}")
        elif outcome == "stream_error":
            unexpected.append(f"request {spec['i']} ({spec['kind']}): error event {res['detail']}")
    columns = sorted({c for row in table.values() for c in row})
    print(f"{'kind':<20}" + "".join(f"{c:>14}" for c in columns) + f"{'total':>8}")
    for kind in sorted(table):
        row = table[kind]
        print(f"{kind:<20}" + "".join(f"{row.get(c, 0):>14}" for c in columns)
              + f"{sum(row.values()):>8}")
    print(f"{'all':<20}" + "".join(f"{sum(r.get(c, 0) for r in table.values()):>14}"
                                   for c in columns) + f"{len(results):>8}")
    print("outcomes:", totals, f"({sum(totals.values())}/{len(results)} accounted for)", flush=True)
    for u in unexpected[:30]:
        print("  ", u)
    check(not unexpected, f"{len(unexpected)} request(s) lost or inconsistent (first above)")
    check(sum(totals.values()) == len(results), "requests missing from the tally")
    e2e = [r["e2e"] for r in results if r and r["outcome"] == "ok" and r["e2e"] is not None]
    print(f"client means (s): e2e {statistics.fmean(e2e) if e2e else float('nan'):.3f}", end="; ")
    ttft = [r["ttft"] for r in results if r and r["outcome"] == "ok" and r["ttft"] is not None]
    print(f"client latency (s): e2e p50 {percentile(e2e, .5):.3f} p90 {percentile(e2e, .9):.3f} "
          f"p99 {percentile(e2e, .99):.3f} max {max(e2e, default=float('nan')):.3f}; "
          f"stream TTFT p50 {percentile(ttft, .5):.3f} p90 {percentile(ttft, .9):.3f} "
          f"p99 {percentile(ttft, .99):.3f}", flush=True)
    return totals


# --- cluster state ----------------------------------------------------------------------------

def scrape(port):
    return parse_metrics(http_get(f"http://127.0.0.1:{port}/metrics")[1])


def metric_sum(metrics, name, label_filter=""):
    return sum(v for labels, v in metrics.get(name, []) if label_filter in labels)


def wait_idle(cluster, timeout):
    """Waits until the router runs nothing and every instance has a free KV pool and no running
    or waiting request. Returns the last state seen {target: {gauge: value}}."""
    targets = [("router", cluster.router_port)] + cluster.metrics_ports
    gauges = ("tandem_num_requests_running", "tandem_num_requests_waiting",
              "tandem_kv_cache_usage_ratio")
    deadline = time.time() + timeout
    state = {}
    while True:
        state, idle = {}, True
        for name, port in targets:
            try:
                m = scrape(port)
            except Exception as e:
                state[name] = {"error": repr(e)}
                idle = False
                continue
            state[name] = {g: metric_sum(m, g) for g in gauges if g in m}
            if any(v != 0 for v in state[name].values()):
                idle = False
            if name != "router" and "tandem_kv_cache_usage_ratio" not in m:
                state[name]["missing"] = "tandem_kv_cache_usage_ratio"
                idle = False
        if idle or time.time() >= deadline:
            return idle, state
        time.sleep(0.25)


class GaugeSampler:
    """Samples every target's gauges while the load runs: the peaks show that the load reached
    the servers and that the KV gauges move (so that "0 after the load" means something)."""

    def __init__(self, cluster, interval=0.2):
        self.targets = [("router", cluster.router_port)] + cluster.metrics_ports
        self.interval = interval
        self.peaks = {name: {} for name, _ in self.targets}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop_event.is_set():
            for name, port in self.targets:
                try:
                    m = scrape(port)
                except Exception:
                    continue
                for g in ("tandem_num_requests_running", "tandem_kv_cache_usage_ratio"):
                    if g in m:
                        peak = self.peaks[name]
                        peak[g] = max(peak.get(g, 0.0), metric_sum(m, g))
            self.stop_event.wait(self.interval)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        self.thread.join(timeout=10)


def sample_rss(cluster):
    return {name: rss_kib(pid) for name, pid in cluster.processes().items()}


# --- prometheus -------------------------------------------------------------------------------

class Prometheus:
    def __init__(self, workdir, targets):
        self.port = free_base(1)
        self.dir = os.path.join(workdir, "prometheus")
        os.makedirs(os.path.join(self.dir, "data"))
        self.targets = targets  # [(job, instance name, port)]
        jobs = {}
        for job, name, port in targets:
            jobs.setdefault(job, []).append(
                {"targets": [f"127.0.0.1:{port}"], "labels": {"tandem_instance": name}})
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": job, "metrics_path": "/metrics",
                                "static_configs": statics} for job, statics in jobs.items()],
        }
        self.config_path = os.path.join(self.dir, "prometheus.yml")
        with open(self.config_path, "w") as f:
            json.dump(config, f, indent=1)
        self.log_path = os.path.join(self.dir, "prometheus.log")
        self.proc = None
        self.log = None

    def start(self):
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={self.config_path}",
             f"--storage.tsdb.path={os.path.join(self.dir, 'data')}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def query(self, expr):
        url = (f"http://127.0.0.1:{self.port}/api/v1/query?"
               + urllib.parse.urlencode({"query": expr}))
        status, body = http_get(url, timeout=5)
        data = json.loads(body)
        if data.get("status") != "success":
            raise RuntimeError(f"query {expr}: {body[:300]}")
        return data["data"]["result"]

    def tail(self, n=20):
        return tail_file(self.log_path, n)

    def stop(self):
        stop_process(self.proc, 10)
        if self.log:
            self.log.close()
        keep = os.environ.get("TANDEM_E2E_LOG_DIR")
        if keep and os.path.exists(self.log_path):
            os.makedirs(keep, exist_ok=True)
            with open(self.log_path) as src, open(os.path.join(keep, "prometheus.log"), "w") as dst:
                dst.write(src.read())


def prometheus_checks(prom):
    deadline = time.time() + PROMETHEUS_TIMEOUT_S
    expected = {(job, f"127.0.0.1:{port}") for job, _, port in prom.targets}
    up, ttft_count, last_error = {}, [], None
    while time.time() < deadline:
        if prom.proc.poll() is not None:
            break
        try:
            up = {(r["metric"]["job"], r["metric"]["instance"]): float(r["value"][1])
                  for r in prom.query("up")}
            ttft_count = prom.query("tandem_time_to_first_token_seconds_count")
            if (set(up) == expected and all(v == 1 for v in up.values())
                    and ttft_count and float(ttft_count[0]["value"][1]) > 0):
                break
        except Exception as e:
            last_error = e
        time.sleep(0.5)
    check(prom.proc.poll() is None, f"prometheus exited: {prom.tail()}")
    print("prometheus up:", {f"{job}@{inst}": v for (job, inst), v in sorted(up.items())},
          flush=True)
    check(set(up) == expected, f"prometheus targets {sorted(up)} != {sorted(expected)} "
                               f"(last error {last_error!r})")
    check(all(v == 1 for v in up.values()), f"prometheus: a target is down: {up}")
    check(ttft_count and float(ttft_count[0]["value"][1]) > 0,
          f"prometheus: no TTFT samples: {ttft_count} (last error {last_error!r})")
    if ttft_count:
        print("prometheus tandem_time_to_first_token_seconds_count:",
              [(r["metric"].get("job"), r["value"][1]) for r in ttft_count], flush=True)
    # The histogram is usable by the usual quantile query (the window spans the load).
    try:
        p90 = prom.query("histogram_quantile(0.9, sum(rate("
                         "tandem_time_to_first_token_seconds_bucket[5m])) by (le))")
        check(bool(p90), "prometheus: histogram_quantile over the TTFT buckets is empty")
        if p90:
            print(f"prometheus TTFT p90 over 5m: {float(p90[0]['value'][1]):.3f} s", flush=True)
    except Exception as e:
        check(False, f"prometheus quantile query failed: {e!r}")
    # Every role's own series reached the server, not just `up`.
    for job, series in (("prefill", "tandem_kv_cache_usage_ratio"),
                        ("decode", "tandem_kv_cache_usage_ratio"),
                        ("router", "tandem_request_success_total")):
        if any(j == job for j, _, _ in prom.targets):
            try:
                got = prom.query(f'{series}{{job="{job}"}}')
            except Exception as e:
                got = []
                print("query failed:", e)
            check(bool(got), f"prometheus has no {series} from the {job} role")


# --- main -------------------------------------------------------------------------------------

def main():
    if not os.path.exists(BIN):
        print("no tandem binary at", BIN)
        return 1
    n_prefill = int(os.environ.get("TANDEM_LOAD_PREFILL", "2"))
    n_decode = int(os.environ.get("TANDEM_LOAD_DECODE", "2"))
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="tandem-load-") as work:
        model_dir = make_tiny_model(BIN, work)
        with open(os.path.join(model_dir, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        specs = make_requests(vocab)

        cluster = Cluster("load", model_dir, work, prefill=n_prefill, decode=n_decode)
        prom = None
        try:
            cluster.start()
            print(f"cluster ({n_prefill} prefill + {n_decode} decode) ready "
                  f"({time.time() - t0:.1f} s)", flush=True)
            targets = [("router", "router", cluster.router_port)] + [
                (name.split("-")[0], name, port) for name, port in cluster.metrics_ports]
            prom = Prometheus(work, targets)
            prom.start()

            pids_before = cluster.processes()
            t1 = time.time()
            warm = asyncio.run(run_phase(cluster.url, specs[:WARMUP], WARMUP_TIMEOUT_S))
            print(f"warm-up: {WARMUP} requests in {time.time() - t1:.1f} s", flush=True)
            idle, state = wait_idle(cluster, IDLE_TIMEOUT_S)
            check(idle, f"not idle after the warm-up: {state}")
            rss_warm = sample_rss(cluster)

            t2 = time.time()
            with GaugeSampler(cluster) as sampler:
                rest = asyncio.run(run_phase(cluster.url, specs[WARMUP:], LOAD_TIMEOUT_S))
            load_s = time.time() - t2
            print(f"load: {NUM_REQUESTS - WARMUP} requests in {load_s:.1f} s "
                  f"({(NUM_REQUESTS - WARMUP) / load_s:.1f} req/s)", flush=True)

            print("peaks during the load:", json.dumps(sampler.peaks), flush=True)
            for name, peak in sampler.peaks.items():
                if name.startswith("decode"):
                    check(peak.get("tandem_kv_cache_usage_ratio", 0) > 0,
                          f"{name}: KV usage never above 0 under load: {peak}")
            results = warm + rest
            totals = account(results)

            # 2. Every KV pool free again, nothing running anywhere.
            idle, state = wait_idle(cluster, IDLE_TIMEOUT_S)
            print("after the load:", json.dumps(state), flush=True)
            check(idle, f"cluster not idle {IDLE_TIMEOUT_S} s after the load "
                        f"(KV pools not freed or requests still running): {state}")

            # The router's own tally agrees with the client's.
            m = scrape(cluster.router_port)
            ok = metric_sum(m, "tandem_request_success_total")
            failed = {labels: v for labels, v in m.get("tandem_request_failure_total", [])}
            print(f"router counters: success {ok:.0f}, failure {failed}", flush=True)
            means = {h: metric_sum(m, h + "_sum") / max(1, metric_sum(m, h + "_count"))
                     for h in ("tandem_time_to_first_token_seconds",
                               "tandem_e2e_request_latency_seconds")}
            print("router-side means (s): " + ", ".join(f"{h} {v:.3f}" for h, v in means.items()),
                  flush=True)
            # Routing spread the work: every instance did some.
            for name, port in cluster.metrics_ports:
                counter = ("tandem_prefill_batch_seconds_count" if name.startswith("prefill")
                           else "tandem_decode_step_seconds_count")
                steps = metric_sum(scrape(port), counter)
                print(f"{name}: {counter} {steps:.0f}", flush=True)
                check(steps > 0, f"{name} did no work: routing did not use it")
            check(ok == totals["ok"], f"router counts {ok} successes, the client {totals['ok']}")
            check(sum(failed.values()) == totals["http_error"] + totals["stream_error"],
                  f"router counts failures {failed}, the client "
                  f"{totals['http_error'] + totals['stream_error']}")

            # Memory: no process grows without bound; none crashed and came back.
            rss_end = sample_rss(cluster)
            pids_after = cluster.processes()
            check(pids_after == pids_before,
                  f"processes changed under load (a crash and restart?): {pids_before} -> "
                  f"{pids_after}")
            check("restarting" not in cluster.tail(10000),
                  f"the supervisor restarted an instance: {cluster.tail(30)}")
            print(f"{'process':<12}{'RSS warm (MiB)':>16}{'RSS end (MiB)':>16}{'growth':>9}")
            for name in sorted(rss_warm):
                a, b = rss_warm[name], rss_end.get(name)
                if a is None or b is None:
                    check(False, f"no RSS for {name}: {a} -> {b}")
                    continue
                growth = (b - a) / a
                print(f"{name:<12}{a / 1024:>16.1f}{b / 1024:>16.1f}{growth * 100:>8.1f}%")
                check(growth < MAX_RSS_GROWTH,
                      f"{name}: RSS grew {growth * 100:.1f}% ({a} -> {b} KiB) over "
                      f"{NUM_REQUESTS - WARMUP} requests")

            # 3. Prometheus scraped every role and answers a TTFT query.
            prometheus_checks(prom)
        except Exception:
            print(cluster.tail(80))
            if prom:
                print(prom.tail())
            raise
        finally:
            if prom:
                prom.stop()
            cluster.stop()
    print(f"done in {time.time() - t0:.1f} s; {len(FAILURES)} failure(s)", flush=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
