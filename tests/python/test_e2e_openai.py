#!/usr/bin/env python3
"""End to end: `tandem up` (2 prefill + 2 decode over UCX tcp) driven by the official `openai`
client, compared token for token with a colocated cluster (colocated.scheduling chunked and
prefill_first) and with the engine alone; promtool
on every role's /metrics; kill -9 of a decode and then a prefill instance under 20 streams (on
the small preset, whose streams last seconds).

Env: TANDEM_BINARY (the tandem executable). Exit 0 = pass. Every cluster is stopped in a
finally block (SIGTERM to the launcher, then SIGKILL to it and its children).
"""
import concurrent.futures
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import openai
import tokenizers

from cluster_util import FAILURES, TandemCluster, check, http_get, make_tiny_model

BIN = os.environ.get("TANDEM_BINARY") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "tandem")
READY_TIMEOUT_S = 90
SEED = 1234


class Cluster(TandemCluster):
    def __init__(self, name, model_dir, workdir, prefill=0, decode=0, colocated=0,
                 model_name="tiny-test"):
        # Generous SLOs: this checks correctness on a shared CPU, not admission.
        super().__init__(name, BIN, model_dir, workdir, prefill, decode, colocated,
                         model_name=model_name, slo=(60, 10), ready_timeout_s=READY_TIMEOUT_S)

    def reload(self, policy):
        """Switches the router's placement policy through SIGHUP (launcher -> router)."""
        self.config["router"]["policy"] = policy
        self.write_config()
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 10
        while time.time() < deadline:
            if f"policy {policy}" in self.tail(200):
                return True
            time.sleep(0.1)
        return False

    def client(self):
        # An explicit httpx client: openai 1.51's default wrapper passes `proxies`, which
        # httpx >= 0.28 no longer takes.
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0,
                             timeout=120, http_client=httpx.Client(trust_env=False, timeout=120))


def engine_alone(model_dir, prompt, max_tokens):
    """The engine's greedy ids and text for one prompt (bytes: no newline translation)."""
    out = subprocess.run([BIN, "generate", "--model", model_dir, "--prompt-ids",
                          ",".join(map(str, prompt)), "--max-tokens", str(max_tokens),
                          "--ignore-eos"], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ids_marker, text_marker = b"\ngenerated_ids:", b"\ntext: "
    i = out.stdout.find(ids_marker)
    j = out.stdout.find(text_marker)
    assert i >= 0 and j > i, out.stdout
    ids = [int(x) for x in out.stdout[i + len(ids_marker):j].split()]
    text = out.stdout[j + len(text_marker):]
    text = text[:-1] if text.endswith(b"\n") else text
    return ids, text.decode("utf-8", errors="replace")


def same_output(cluster_text, engine, tokenizer):
    """The cluster's text equals the engine's: its printed text, or (when that was cut by a NUL
    byte, which printf cannot print) its ids decoded by the HF tokenizer."""
    ids, text = engine
    return cluster_text == text or cluster_text == tokenizer.decode(ids,
                                                                    skip_special_tokens=True)


def make_prompts(vocab):
    rng = random.Random(SEED)
    prompts = []
    for i in range(50):
        length = rng.choice([1, 3, 8, 17, 40, 90, 160, 300])
        prompts.append(([rng.randrange(3, vocab) for _ in range(length)], rng.randrange(1, 24)))
    return prompts


def run_prompts(cluster, prompts):
    client = cluster.client()

    def one(item):
        prompt, max_tokens = item
        r = client.completions.create(model="tiny-test", prompt=prompt, max_tokens=max_tokens,
                                      temperature=0, extra_body={"ignore_eos": True})
        check(r.usage.prompt_tokens == len(prompt), f"{cluster.name}: prompt_tokens")
        check(r.usage.completion_tokens == max_tokens,
              f"{cluster.name}: completion_tokens {r.usage.completion_tokens} != {max_tokens}")
        return r.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return list(pool.map(one, prompts))


def api_checks(cluster):
    client = cluster.client()
    models = client.models.list()
    check([m.id for m in models.data] == ["tiny-test"], f"models: {models}")

    # Chat, not streamed and streamed (with usage): the same greedy text.
    messages = [{"role": "user", "content": "Hello there"}]
    r = client.chat.completions.create(model="tiny-test", messages=messages, max_tokens=12,
                                       temperature=0, extra_body={"ignore_eos": True})
    check(r.choices[0].finish_reason == "length", f"chat finish {r.choices[0].finish_reason}")
    check(r.usage.completion_tokens == 12, f"chat usage {r.usage}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + 12, "chat total_tokens")
    text = r.choices[0].message.content
    stream = client.chat.completions.create(model="tiny-test", messages=messages, max_tokens=12,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    parts, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    check("".join(parts) == text, f"chat stream text {''.join(parts)!r} != {text!r}")
    check(usage is not None and usage.completion_tokens == 12
          and usage.prompt_tokens == r.usage.prompt_tokens, f"chat stream usage {usage}")
    check(finish == "length", f"chat stream finish {finish}")

    # Completions, both ways.
    r = client.completions.create(model="tiny-test", prompt="Once upon a time", max_tokens=10,
                                  temperature=0, extra_body={"ignore_eos": True})
    check(r.usage.completion_tokens == 10, f"completion usage {r.usage}")
    text = r.choices[0].text
    stream = client.completions.create(model="tiny-test", prompt="Once upon a time",
                                       max_tokens=10, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    streamed = "".join(c.choices[0].text for c in stream if c.choices)
    check(streamed == text, f"completion stream {streamed!r} != {text!r}")

    # Errors arrive as the client's typed errors.
    try:
        client.completions.create(model="tiny-test", prompt="x", max_tokens=-1)
        check(False, "max_tokens=-1 accepted")
    except openai.BadRequestError as e:
        check("max_tokens" in str(e), f"400 does not name the field: {e}")
    try:
        client.chat.completions.create(model="no-such-model", messages=messages)
        check(False, "unknown model accepted")
    except openai.NotFoundError:
        pass
    # An SLO class the config does not define is refused, naming the header.
    try:
        client.completions.create(model="tiny-test", prompt="x", max_tokens=2,
                                  extra_headers={"x-tandem-slo-class": "no-such-class"})
        check(False, "unknown x-tandem-slo-class accepted")
    except openai.BadRequestError as e:
        check("x-tandem-slo-class" in str(e), f"400 does not name the header: {e}")


def promtool_checks(cluster):
    targets = [("router", cluster.router_port)] + cluster.metrics_ports
    for name, port in targets:
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        check(status == 200 and "tandem_" in body, f"{name} /metrics empty")
        out = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True,
                             text=True)
        check(out.returncode == 0, f"promtool rejects {name}'s metrics: {out.stdout}{out.stderr}")


def fault_check(cluster, role):
    # goodput sends everything to the decode instance with the most headroom; round_robin
    # spreads the streams over both, so that the kill hits some and spares others.
    check(cluster.reload("round_robin"), "SIGHUP reload to round_robin not applied")
    check(cluster.wait_usable({"prefill": 2, "decode": 2}), f"not every instance is up: "
          f"{cluster.usable()}")
    client = cluster.client()
    model = cluster.config["model"]["name"]
    # The small preset decodes 200 tokens for 10 streams in seconds of server time (the tiny
    # model would finish before the slow Python clients have all started).
    max_tokens = 200
    results = [None] * 20
    spans = [None] * 20  # (first token, end) wall times per stream
    # A prefill is killed once every stream has its first token (it has handed them all on by
    # then: nothing may fail). A decode is killed as soon as its own gauge says it holds
    # streams.
    started = threading.Barrier(21) if role == "prefill" else None

    def stream(i):
        got = 0
        try:
            s = client.completions.create(model=model, prompt=[5 + i, 9, 11, 13],
                                          max_tokens=max_tokens, temperature=0, stream=True,
                                          stream_options={"include_usage": True},
                                          extra_body={"ignore_eos": True})
            usage = None
            for chunk in s:
                if spans[i] is None:
                    spans[i] = (time.time(), None)
                    if started:
                        started.wait(timeout=60)
                if chunk.usage:
                    usage = chunk.usage
                got += 1
            results[i] = ("ok", usage.completion_tokens if usage else -1)
        except openai.APIError as e:
            results[i] = ("error", str(e))
        except Exception as e:  # a broken stream is a failure of the test
            results[i] = ("broken", repr(e))
        finally:
            if spans[i]:
                spans[i] = (spans[i][0], time.time())
            if started and spans[i] is None:
                started.abort()  # no first token: release the others rather than hang

    victim = f"{role}-0"
    pid = cluster.child_pid(role, 0)
    check(pid is not None, f"no {victim} process")
    gauges = dict(cluster.metrics_ports)

    def running(name):
        try:
            body = http_get(f"http://127.0.0.1:{gauges[name]}/metrics")[1]
        except Exception:
            return -1
        return sum(float(l.split()[-1]) for l in body.splitlines()
                   if l.startswith("tandem_num_requests_running"))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    if started:
        try:
            started.wait(timeout=60)
        except threading.BrokenBarrierError:
            pass
        held = running(victim)
    else:
        # Round robin hands decode-0 every other stream; kill once it holds five of them.
        held = running(victim)
        deadline = time.time() + 30
        while held < 5 and time.time() < deadline:
            time.sleep(0.01)
            held = running(victim)
    print(f"fault ({victim}): killing while it runs {held:.0f} request(s), "
          f"{role}-1 runs {running(role + '-1'):.0f}", flush=True)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    for t in threads:
        t.join(timeout=120)
    errors = [r for r in results if r and r[0] == "error"]
    oks = [r for r in results if r and r[0] == "ok"]
    print(f"fault ({victim}): {len(oks)} completed, {len(errors)} clean errors "
          f"(streams ended {time.time() - killed_at:.1f} s after the kill)", flush=True)
    lasted = sorted(end - first for first, end in filter(None, spans))
    ended_before = sum(1 for s in spans if s and s[1] < killed_at)
    print(f"fault ({victim}): streams lasted {lasted[0]:.2f}-{lasted[-1]:.2f} s from the first "
          f"token; {ended_before} had ended before the kill", flush=True)
    if role == "decode":  # a prefill hands its streams on within milliseconds
        check(len(errors) > 0, "fault: the kill hit no request (streams too short?)")
    check(len(oks) + len(errors) == 20, f"fault: unaccounted streams {results}")
    check(all(r[1] == max_tokens for r in oks), f"fault: short completions {oks}")
    if role == "decode":
        check(all(victim in r[1] for r in errors), f"fault: errors not naming {victim} {errors}")
    check(len(oks) > 0, f"fault: no request survived ({role}-1 should have served some)")

    # The supervisor brings the victim back and it serves again.
    deadline = time.time() + 60
    new_pid = None
    while time.time() < deadline:
        new_pid = cluster.child_pid(role, 0)
        if new_pid and new_pid != pid:
            break
        time.sleep(0.2)
    check(new_pid and new_pid != pid, f"{victim} was not restarted")
    victim_metrics = dict(cluster.metrics_ports)[victim]
    counter = ("tandem_decode_step_seconds_count" if role == "decode"
               else "tandem_prefill_batch_seconds_count")

    def steps():
        body = http_get(f"http://127.0.0.1:{victim_metrics}/metrics")[1]
        return sum(float(l.split()[-1]) for l in body.splitlines() if l.startswith(counter))

    served = False
    deadline = time.time() + 60
    while time.time() < deadline and not served:
        try:
            before = steps()
        except Exception:
            time.sleep(0.3)
            continue
        for i in range(6):
            client.completions.create(model=model, prompt=[7, 8, 9], max_tokens=4,
                                      temperature=0)
        served = steps() > before
        if not served:
            time.sleep(0.5)
    check(served, f"restarted {victim} did not serve requests")


def serving(cluster, work):
    """Starts `cluster`, runs work(cluster) and returns its result; prints the cluster's log
    tail when anything fails, and stops it whatever happens."""
    try:
        cluster.start()
        return work(cluster)
    except Exception:
        print(cluster.tail(80))
        raise
    finally:
        cluster.stop()


def main():
    if not os.path.exists(BIN):
        print("no tandem binary at", BIN)
        return 1
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="tandem-e2e-") as work:
        model_dir = make_tiny_model(BIN, work)
        with open(os.path.join(model_dir, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        prompts = make_prompts(vocab)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            engine_future = pool.map(lambda p: engine_alone(model_dir, p[0], p[1]), prompts)

            def disagg_checks(cluster):
                print(f"disaggregated cluster ready ({time.time() - t0:.1f} s)", flush=True)
                api_checks(cluster)
                out = run_prompts(cluster, prompts)
                promtool_checks(cluster)
                return out

            disagg_out = serving(Cluster("disagg", model_dir, work, prefill=2, decode=2),
                                 disagg_checks)
            print(f"disaggregated checks done ({time.time() - t0:.1f} s)", flush=True)

            # kill -9 under load, on a model slow enough that the streams outlive the kill.
            small_dir = os.path.join(work, "small")
            subprocess.run([BIN, "make-model", "--preset", "small", "--out", small_dir],
                           check=True, capture_output=True, timeout=120)
            serving(Cluster("disagg-faults", small_dir, work, prefill=2, decode=2,
                            model_name="small-test"),
                    lambda c: (fault_check(c, "decode"), fault_check(c, "prefill")))
            print(f"fault checks done ({time.time() - t0:.1f} s)", flush=True)

            def coloc_checks(cluster):
                out = run_prompts(cluster, prompts)
                promtool_checks(cluster)
                return out

            coloc_out = serving(Cluster("colocated", model_dir, work, colocated=2), coloc_checks)

            # The prefill-first colocated baseline (whole prompts in steps that pause decodes):
            # a different schedule, the same greedy tokens. A 64-token budget: the 90-300-token
            # prompts exceed it and run alone, whole.
            coloc_pf = Cluster("colocated-prefill-first", model_dir, work, colocated=2)
            coloc_pf.config["colocated"]["scheduling"] = "prefill_first"
            coloc_pf.config["colocated"]["token_budget"] = 64
            coloc_pf.write_config()
            coloc_pf_out = serving(coloc_pf, lambda c: run_prompts(c, prompts))
            engine_out = list(engine_future)
        tokenizer = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        for i, (a, b, c) in enumerate(zip(disagg_out, coloc_out, engine_out)):
            check(same_output(a, c, tokenizer), f"prompt {i}: disaggregated {a!r} != engine {c}")
            check(a == b, f"prompt {i}: disaggregated {a!r} != colocated {b!r}")
        for i, (b, d) in enumerate(zip(coloc_out, coloc_pf_out)):
            check(b == d, f"prompt {i}: colocated chunked {b!r} != prefill_first {d!r}")
    print(f"done in {time.time() - t0:.1f} s; {len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
