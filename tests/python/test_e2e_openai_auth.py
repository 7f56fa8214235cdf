#!/usr/bin/env python3
"""API keys end to end, with the official `openai` client: `tandem up` (1 colocated instance)
with keys from router.api_keys_file (relative to the config) and $TANDEM_API_KEYS. The right key
gets completions (streaming and not), a wrong one openai.AuthenticationError, none OpenAI's 401;
/health and /metrics stay open; no key reaches the log or /metrics. A key file that others can
read stops `tandem check-config` naming router.api_keys_file.

Env: TANDEM_BINARY (the tandem executable). Exit 0 = pass."""
import os
import subprocess
import sys
import tempfile
import time

import httpx
import openai

from cluster_util import FAILURES, TandemCluster, check, http_get, make_tiny_model

BIN = os.environ.get("TANDEM_BINARY") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "tandem")
FILE_KEY = "sk-tandem-file-7f3a9c"
ENV_KEY = "sk-tandem-env-51d2e8"


def client(cluster, key):
    # An explicit httpx client: openai 1.51's default wrapper passes `proxies`, which
    # httpx >= 0.28 no longer takes.
    return openai.OpenAI(base_url=cluster.url + "/v1", api_key=key, max_retries=0, timeout=120,
                         http_client=httpx.Client(trust_env=False, timeout=120))


def authorized_checks(cluster):
    for key in (FILE_KEY, ENV_KEY):
        out = client(cluster, key).completions.create(model="tiny-test", prompt="Hello",
                                                       max_tokens=4, temperature=0)
        check(out.choices[0].finish_reason in ("stop", "length"), f"completion: {out}")
    chunks = list(client(cluster, FILE_KEY).chat.completions.create(
        model="tiny-test", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
        stream=True))
    check(chunks and chunks[-1].choices[0].finish_reason in ("stop", "length"),
          f"stream ended with {chunks[-1] if chunks else None}")


def refused_checks(cluster):
    try:
        client(cluster, "sk-wrong").completions.create(model="tiny-test", prompt="Hi",
                                                       max_tokens=2)
        check(False, "a wrong key got a completion")
    except openai.AuthenticationError as e:
        check(e.status_code == 401 and e.code == "invalid_api_key", f"wrong key: {e}")
    try:
        list(client(cluster, "sk-wrong").chat.completions.create(
            model="tiny-test", messages=[{"role": "user", "content": "Hi"}], stream=True))
        check(False, "a wrong key got a stream")
    except openai.AuthenticationError:
        pass
    r = httpx.post(cluster.url + "/v1/completions", json={"model": "tiny-test", "prompt": "x"},
                   trust_env=False)
    check(r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer",
          f"no key: {r.status_code} {r.headers}")
    check(r.json()["error"]["message"].startswith("You didn't provide an API key"), r.text)
    check(http_get(cluster.url + "/health")[0] == 200, "/health closed")
    status, metrics = http_get(cluster.url + "/metrics")
    check(status == 200, "/metrics closed by default")
    check('reason="invalid"} 2' in metrics and 'reason="missing"} 1' in metrics,
          "tandem_router_unauthorized_requests_total: " +
          "\n".join(l for l in metrics.splitlines() if "unauthorized" in l))
    for key in (FILE_KEY, ENV_KEY):
        check(key not in metrics, "a key in /metrics")


def main():
    if not os.path.exists(BIN):
        print("no tandem binary at", BIN)
        return 1
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="tandem-auth-") as work:
        model_dir = make_tiny_model(BIN, work)
        keys_path = os.path.join(work, "keys.txt")
        with open(os.open(keys_path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(f"# test keys\n{FILE_KEY}\n")

        cluster = TandemCluster("auth", BIN, model_dir, work, colocated=1)
        cluster.config["router"]["api_keys_file"] = "keys.txt"  # relative to the config file
        cluster.write_config()

        # A key file that others can read is refused before anything starts.
        os.chmod(keys_path, 0o644)
        out = subprocess.run([BIN, "check-config", cluster.config_path], capture_output=True,
                             text=True, timeout=60)
        check(out.returncode != 0 and "router.api_keys_file" in out.stderr
              and "mode 0644" in out.stderr, f"check-config on a 0644 key file: {out.stderr}")
        os.chmod(keys_path, 0o600)

        os.environ["TANDEM_API_KEYS"] = ENV_KEY  # inherited by `tandem up` and its router
        try:
            cluster.start()
            print(f"cluster ready ({time.time() - t0:.1f} s)", flush=True)
            refused_checks(cluster)
            authorized_checks(cluster)
        except Exception:
            print(cluster.tail(80))
            raise
        finally:
            cluster.stop()
            del os.environ["TANDEM_API_KEYS"]
        log = open(cluster.log_path).read()
        check(FILE_KEY not in log and ENV_KEY not in log, "a key in the log")
        check("API keys required: 2 key(s)" in log, "the router did not say it needs keys")
    print(f"done in {time.time() - t0:.1f} s; {len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
