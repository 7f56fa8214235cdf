#!/usr/bin/env python3
"""Several hosts made of Linux network namespaces: a router, 2 prefill and 2 decode instances,
each in its own namespace with its own address on one bridge (itself in a namespace of its
own), KV over UCX tcp between them, the router finding the prefill hosts by a static list
(prefill.addresses) and the decode hosts by a DNS name (decode.dns_name, answered by the router
namespace's /etc/hosts, which `ip netns exec` mounts from /etc/netns/NAME/hosts). The official `openai` client, run inside the router's namespace, drives it,
streaming and not; greedy output must equal the one-host cluster's (`tandem up` on loopback).
Then, under load, one decode host's link goes down: its requests end with a clean error within
the heartbeat bound, the others complete, every pool returns to full; the link comes back and
that host serves again. Last, a decode host leaves the DNS name while serving (what it holds
completes, it gets nothing new) and joins again (it gets work).

Needs root (ip netns). Every namespace this test makes is removed at the end, whatever happens;
the addresses (10.77.0.0/24) exist only inside those namespaces. Env: TANDEM_BINARY.
Exit 0 = pass, 77 = skipped (not root, or no `ip`).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

from cluster_util import FAILURES, TandemCluster, check, stop_process, make_tiny_model

BIN = os.environ.get("TANDEM_BINARY") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "tandem")
PYTHON = sys.executable
TAG = f"tdm{os.getpid() % 100000}"
SUBNET = "10.77.0"
SECRET = "multihost-test-secret-0123456789abcdef"
HEARTBEAT_TIMEOUT_S = 1.5
# name -> last octet
HOSTS = {"router": 10, "prefill-0": 11, "prefill-1": 12, "decode-0": 21, "decode-1": 22}
CONTROL_PORT, METRICS_PORT, ROUTER_PORT = 7000, 7100, 8000
DECODE_NAME = "decode.tandem.test"
PROMPTS = ["The quick brown fox", "Once upon a time", "Disaggregated serving splits",
           "In a hole in the ground", "Tandem", "A B C D E F G"]


def ip(*args, netns=None, check_rc=True):
    cmd = ["ip"] + (["-n", netns] if netns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check_rc and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


def ns(name):
    return f"{TAG}-{name}"


def address(name):
    return f"{SUBNET}.{HOSTS[name]}"


class Hosts:
    """The namespaces, veth pairs and bridge; removed by close()."""

    def __init__(self):
        self.made = []

    def __enter__(self):
        switch = ns("sw")
        ip("netns", "add", switch)
        self.made.append(switch)
        ip("link", "add", "br0", "type", "bridge", netns=switch)
        ip("link", "set", "br0", "up", netns=switch)
        for i, name in enumerate(HOSTS):
            host = ns(name)
            ip("netns", "add", host)
            self.made.append(host)
            ip("link", "set", "lo", "up", netns=host)
            # veth: eth0 in the host, h<i> on the bridge.
            ip("link", "add", "eth0", "netns", host, "type", "veth", "peer", "name", f"h{i}",
               "netns", switch, netns=switch)
            ip("link", "set", f"h{i}", "master", "br0", netns=switch)
            ip("link", "set", f"h{i}", "up", netns=switch)
            ip("addr", "add", f"{address(name)}/24", "dev", "eth0", netns=host)
            ip("link", "set", "eth0", "up", netns=host)
        return self

    def link(self, name, up):
        """Cuts (or restores) a host's cable: its port on the bridge."""
        index = list(HOSTS).index(name)
        ip("link", "set", f"h{index}", "up" if up else "down", netns=ns("sw"))

    def __exit__(self, *exc):
        for name in reversed(self.made):
            ip("netns", "del", name, check_rc=False)
        shutil.rmtree(os.path.dirname(hosts_file()), ignore_errors=True)


def hosts_file():
    return f"/etc/netns/{ns('router')}/hosts"


def set_decode_dns(names):
    """The router's DNS: DECODE_NAME has an A record per host in `names`. `ip netns exec`
    bind-mounts this file over /etc/hosts, so it is rewritten in place (same inode)."""
    os.makedirs(os.path.dirname(hosts_file()), exist_ok=True)
    with open(hosts_file(), "w") as f:
        f.write("127.0.0.1 localhost\n")
        for name in names:
            f.write(f"{address(name)} {DECODE_NAME}\n")


def run_in(name, argv, **kwargs):
    return subprocess.Popen(["ip", "netns", "exec", ns(name)] + argv, **kwargs)


def config(model_dir):
    """One file for every host; each instance gets its host and index by flags."""
    return {
        "model": {"path": model_dir, "name": "tiny-test", "max_model_len": 1024},
        # least_loaded: both decode hosts get a share of every burst (what the faults need).
        "router": {"host": address("router"), "port": ROUTER_PORT, "policy": "least_loaded"},
        "slo": {"ttft_s": 60, "tpot_s": 10},
        "transfer": {"backend": "ucx", "ucx_tls": "tcp", "timeout_s": 3},
        "control": {"heartbeat_interval_s": 0.1, "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
                    "connect_timeout_s": 1, "discovery_interval_s": 0.3},
        "prefill": {"instances": 2, "port": CONTROL_PORT, "metrics_port": METRICS_PORT,
                    "kv_blocks": 128, "kv_hold_timeout_s": 5,
                    "addresses": [f"{address(f'prefill-{i}')}:{CONTROL_PORT}" for i in range(2)]},
        # The decode hosts by DNS name: the router's namespace has its own /etc/hosts.
        "decode": {"instances": 2, "port": CONTROL_PORT, "metrics_port": METRICS_PORT,
                   "kv_blocks": 128, "dns_name": f"{DECODE_NAME}:{CONTROL_PORT}"},
    }


CLIENT = textwrap.dedent("""
    import concurrent.futures, json, sys
    import httpx, openai
    spec = json.load(sys.stdin)
    client = openai.OpenAI(base_url=spec["url"] + "/v1", api_key="none", max_retries=0,
                           timeout=spec["timeout"],
                           http_client=httpx.Client(trust_env=False, timeout=spec["timeout"]))
    def one(job):
        prompt, max_tokens, stream = job
        # Long jobs run to max_tokens: load that lasts.
        extra = {"ignore_eos": True} if max_tokens > 100 else {}
        try:
            if stream:
                text = ""
                for chunk in client.completions.create(model="tiny-test", prompt=prompt,
                        max_tokens=max_tokens, temperature=0, stream=True, extra_body=extra):
                    text += chunk.choices[0].text if chunk.choices else ""
                return {"ok": True, "text": text}
            r = client.completions.create(model="tiny-test", prompt=prompt,
                                          max_tokens=max_tokens, temperature=0)
            return {"ok": True, "text": r.choices[0].text}
        except Exception as e:
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    with concurrent.futures.ThreadPoolExecutor(spec["parallel"]) as pool:
        print(json.dumps(list(pool.map(one, spec["jobs"]))))
""")


def run_client(url, jobs, parallel, timeout=60, netns=None):
    """Runs the openai client (in `netns` when given) on [(prompt, max_tokens, stream)]."""
    spec = json.dumps({"url": url, "jobs": jobs, "parallel": parallel, "timeout": timeout})
    argv = [PYTHON, "-c", CLIENT]
    if netns:
        argv = ["ip", "netns", "exec", ns(netns)] + argv
    r = subprocess.run(argv, input=spec, capture_output=True, text=True, timeout=timeout + 60)
    if r.returncode != 0:
        raise RuntimeError(f"client failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def metric(name_in_ns, name, labels=""):
    """A sample of an instance's /metrics, read inside its namespace; None when unreadable."""
    url = f"http://{address(name_in_ns)}:{METRICS_PORT}/metrics"
    r = subprocess.run(["ip", "netns", "exec", ns(name_in_ns), "curl", "-s", "-m", "3", url],
                       capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith(name + "{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def one_host_reference(model_dir, work, jobs):
    cluster = TandemCluster("onehost", BIN, model_dir, work, prefill=1, decode=1)
    try:
        cluster.start()
        return run_client(cluster.url, jobs, parallel=4)
    finally:
        cluster.stop()


def start_cluster(model_dir, work):
    cfg = os.path.join(work, "multihost.yaml")
    with open(cfg, "w") as f:
        json.dump(config(model_dir), f)
    env = dict(os.environ, TANDEM_CLUSTER_SECRET=SECRET)
    procs = {}
    for name in HOSTS:
        if name == "router":
            continue
        role, index = name.split("-")
        log = open(os.path.join(work, f"{name}.log"), "w")
        # Every instance is index 0 of its own host: the same ports on every machine.
        procs[name] = run_in(name, [BIN, role, "--config", cfg, "--index", "0",
                                    f"--{role}.host={address(name)}"],
                             stdout=log, stderr=subprocess.STDOUT, env=env)
    set_decode_dns(["decode-0", "decode-1"])
    log = open(os.path.join(work, "router.log"), "w")
    procs["router"] = run_in("router", [BIN, "router", "--config", cfg], stdout=log,
                             stderr=subprocess.STDOUT, env=env)
    return procs


def router_metric(name, label):
    """A sample of the router's /metrics whose labels include `label`; None when absent."""
    r = subprocess.run(["ip", "netns", "exec", ns("router"), "curl", "-s", "-m", "3",
                        f"http://{address('router')}:{ROUTER_PORT}/metrics"],
                       capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def router_ready(work):
    r = subprocess.run(["ip", "netns", "exec", ns("router"), "curl", "-s", "-m", "2", "-o",
                        "/dev/null", "-w", "%{http_code}",
                        f"http://{address('router')}:{ROUTER_PORT}/ready"],
                       capture_output=True, text=True)
    return r.stdout == "200"


def pools_full():
    for name in ("prefill-0", "prefill-1", "decode-0", "decode-1"):
        usage = metric(name, "tandem_kv_cache_usage_ratio")
        if usage is None or usage != 0:
            return False
    return True


def main():
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("curl") is None:
        print("skipped: needs root, ip and curl")
        return 77
    url = f"http://{address('router')}:{ROUTER_PORT}"
    with tempfile.TemporaryDirectory(prefix="tandem-multihost-") as work:
        model_dir = make_tiny_model(BIN, work)
        jobs = [(p, 24, i % 2 == 1) for i, p in enumerate(PROMPTS)]
        reference = one_host_reference(model_dir, work, jobs)
        check(all(r["ok"] for r in reference), f"one-host reference failed: {reference}")

        procs = {}
        with Hosts() as hosts:
            try:
                procs = start_cluster(model_dir, work)
                check(wait_for(lambda: router_ready(work), 60), "the router never became ready")
                t0 = time.time()
                results = run_client(url, jobs, parallel=4, netns="router")
                print(f"multi-host: {len(jobs)} requests in {time.time() - t0:.1f} s")
                for job, got, want in zip(jobs, results, reference):
                    check(got == want, f"{job}: multi-host {got} != one host {want}")
                # Both decode hosts took requests (placement spreads).
                served = [metric(f"decode-{i}", "tandem_kv_handoff_wait_seconds_count") or 0
                          for i in range(2)]
                print(f"decode requests served: {served}")
                cut_link_under_load(hosts, url)
                dns_leave_and_join(url)
            finally:
                for p in procs.values():
                    stop_process(p, 10)
                for name in procs:
                    if FAILURES:
                        print(f"--- {name}.log ---")
                        with open(os.path.join(work, f"{name}.log")) as f:
                            print(f.read()[-3000:])
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("ok")
    return 0


def cut_link_under_load(hosts, url):
    """decode-1's link goes down under 16 long streams, then comes back."""
    long_jobs = [(f"load {i}", 900, True) for i in range(16)]
    argv = ["ip", "netns", "exec", ns("router"), PYTHON, "-c", CLIENT]
    spec = json.dumps({"url": url, "jobs": long_jobs, "parallel": 16, "timeout": 120})
    spec_file = tempfile.TemporaryFile("w+")
    spec_file.write(spec)
    spec_file.seek(0)
    load = subprocess.Popen(argv, stdin=spec_file, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # Wait until decode-1 holds requests, then cut its cable.
    check(wait_for(lambda: (metric("decode-1", "tandem_num_requests_running") or 0) >= 1, 30),
          "decode-1 never ran requests")
    cut_at = time.time()
    hosts.link("decode-1", up=False)
    out, err = load.communicate(timeout=240)
    finished_at = time.time()
    results = json.loads(out) if out else []
    failed = [r for r in results if not r["ok"]]
    ok = [r for r in results if r["ok"]]
    print(f"link cut: {len(ok)} completed, {len(failed)} failed; "
          f"errors: {sorted(set(r['error'][:80] for r in failed))}")
    check(len(results) == 16, f"the load client returned {len(results)} results: {err[-1000:]}")
    check(len(failed) > 0, "no request failed although decode-1 was cut off holding some")
    check(len(ok) > 0, "every request failed: the other hosts should have completed theirs")
    # The router fails what decode-1 held once its heartbeat is HEARTBEAT_TIMEOUT_S late; the
    # clients see it at once (streams end with an error), well before the 400-token streams.
    check(all("APIError" in r["error"] or "Error" in r["error"] for r in failed),
          f"unclean failures: {failed}")
    del finished_at, cut_at
    # decode-1 is unreachable: only the reachable pools can be read; they return to full.
    check(wait_for(lambda: all(metric(n, "tandem_kv_cache_usage_ratio") == 0
                               for n in ("prefill-0", "prefill-1", "decode-0")), 30),
          "the reachable pools did not return to full after the cut")
    # The cable comes back: decode-1 frees what it held (its router session is gone) and the
    # router reconnects and places on it again.
    hosts.link("decode-1", up=True)
    check(wait_for(pools_full, 30), "decode-1's pool did not return to full after the link came back")
    check(wait_for(lambda: router_metric("tandem_router_instances_usable",
                                                'instance_role="decode"')
                   == 2, 30), "the router did not take decode-1 back")
    before = metric("decode-1", "tandem_kv_handoff_wait_seconds_count") or 0
    results = run_client(url, [(f"after {i}", 8, False) for i in range(12)], parallel=6,
                         netns="router")
    check(all(r["ok"] for r in results), f"requests after the link came back failed: {results}")
    after = metric("decode-1", "tandem_kv_handoff_wait_seconds_count") or 0
    print(f"decode-1 served {after - before:.0f} of 12 requests after the link came back")
    check(after > before, "decode-1 served nothing after its link came back")


def handoffs(name):
    return metric(name, "tandem_kv_handoff_wait_seconds_count") or 0


def dns_leave_and_join(url):
    """decode-0 leaves the DNS name while it serves: what it holds completes, nothing new goes
    there; it joins again and receives work."""
    long_jobs = [(f"dns {i}", 600, True) for i in range(8)]
    spec_file = tempfile.TemporaryFile("w+")
    spec_file.write(json.dumps({"url": url, "jobs": long_jobs, "parallel": 8, "timeout": 120}))
    spec_file.seek(0)
    load = subprocess.Popen(["ip", "netns", "exec", ns("router"), PYTHON, "-c", CLIENT],
                            stdin=spec_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    check(wait_for(lambda: (metric("decode-0", "tandem_num_requests_running") or 0) >= 1, 30),
          "decode-0 never ran a request before leaving")
    set_decode_dns(["decode-1"])
    time.sleep(1.0)  # > control.discovery_interval_s: the router has seen it
    before = handoffs("decode-0")
    results = run_client(url, [(f"while gone {i}", 8, False) for i in range(10)], parallel=5,
                         netns="router")
    check(all(r["ok"] for r in results), f"requests while decode-0 was gone failed: {results}")
    check(handoffs("decode-0") == before, "decode-0 got new requests after it left the name")
    out, err = load.communicate(timeout=240)
    drained = json.loads(out) if out else []
    print(f"dns leave: {sum(r['ok'] for r in drained)}/{len(long_jobs)} in-flight completed, "
          f"decode-0 took {handoffs('decode-0') - before:.0f} new")
    check(len(drained) == len(long_jobs) and all(r["ok"] for r in drained),
          f"requests in flight on the leaving host did not all complete: {drained} {err[-500:]}")
    check(wait_for(lambda: (metric("decode-0", "tandem_kv_cache_usage_ratio") == 0), 10),
          "decode-0's pool did not return to full after draining")
    set_decode_dns(["decode-0", "decode-1"])
    check(wait_for(lambda: router_metric("tandem_router_instances_usable",
                                         'instance_role="decode"') == 2, 30),
          "the router did not take decode-0 back from DNS")
    before = handoffs("decode-0")
    results = run_client(url, [(f"joined {i}", 8, False) for i in range(12)], parallel=6,
                         netns="router")
    check(all(r["ok"] for r in results), f"requests after decode-0 rejoined failed: {results}")
    print(f"dns join: decode-0 served {handoffs('decode-0') - before:.0f} of 12")
    check(handoffs("decode-0") > before, "decode-0 got no work after it joined the name again")


if __name__ == "__main__":
    sys.exit(main())
