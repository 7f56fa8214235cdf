#!/usr/bin/env python3
"""The attacks, scripted: an attacker on the same machine who does not know the cluster secret
tries the control plane and the public API of a running cluster, and every attack fails.

One `tandem up` cluster (1 prefill, 1 decode, tiny model, an API key in $TANDEM_API_KEYS,
control.handshake_timeout_s 1 s). The attacker:
  1. pre-auth Hello(role=router) to decode, over and over while a legitimate request streams
     through the router: each connection gets at most the 40-byte handshake challenge and is
     closed, no control frame comes back, and the stream's tokens are those of a quiet run;
  2. pre-auth Submit to prefill (alone, and after a Hello) naming a decode_address the test
     listens on: no connection ever arrives there, prefill's request counters do not move;
  3. the handshake of common/net/control_auth.h in Python with a wrong secret, and with
     prefill's own proof reflected back: closed after the handshake bytes, nothing pipelined
     behind the proof (Hello + Submit) runs; with the right secret (read from the file that
     `tandem up` made) the same code gets decode's and prefill's Hello, and a Submit naming the
     trap listener makes prefill dial it and stream tokens to the attacker: the positive
     controls that show the negative checks would have seen a success (run last);
  4. 100 hostile connections at once to decode's control port (garbage, short garbage, silence,
     one byte a second, frame headers declaring a 32 MiB body, alone or streamed, before or
     after a valid challenge): decode's RSS grows by less than 64 MiB, every connection is
     closed within handshake_timeout_s + slack, requests through the router give the same
     tokens during and after;
  5. the public API without a key and with a wrong one: 401;
  6. file descriptors: the cluster runs with RLIMIT_NOFILE 256 (soft and hard, as in a container
     started with --ulimit nofile=256), and the attacker holds 400 connections to decode's control
     port for 6 s, reopening the ones the instance closes 4 times a second: decode keeps fds
     for itself (its listener holds fewer connections than its fd limit allows), so its /health
     answers (the launcher would kill it after launcher.health_failures missed polls),
     requests through the router give the same tokens, and the log is not flooded with accept
     errors.
No instance may crash or restart meanwhile. Prints a table of the attacks and the RSS numbers.

Env: TANDEM_BINARY; TANDEM_E2E_LOG_DIR (keep the cluster log). Exit 0 = pass."""
import hashlib
import hmac
import http.client
import json
import os
import random
import resource
import selectors
import socket
import struct
import sys
import tempfile
import threading
import time

from cluster_util import FAILURES, TandemCluster, check, http_get, make_tiny_model

BIN = os.environ.get("TANDEM_BINARY") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "tandem")
API_KEY = "sk-tandem-attacks-3b9e0c"
HANDSHAKE_TIMEOUT_S = 1.0
CLOSE_SLACK_S = 6.0  # beyond handshake_timeout_s, for a loaded 2-core machine
TRAP_WAIT_S = 3.0  # how long the trap listener waits for a connection that must not come
RSS_BOUND_KB = 64 * 1024
STREAM_TOKENS = 400
FD_LIMIT = 256  # RLIMIT_NOFILE of the whole cluster
FD_FLOOD = 400  # connections the attacker holds open in attack 6
FD_FLOOD_S = 6.0  # ... for this long: beyond launcher.health_failures x health_interval_s
PROMPT = [5, 9, 11, 13, 17]

# --- The control wire (common/net/wire_codec.h, control_wire.h, control_auth.h) ------------

CONTROL_MAGIC = 0x4C544354  # "TCTL"
CONTROL_VERSION = 7  # kControlVersion (common/net/control_wire.h)
HELLO, LOAD_REPORT, SUBMIT, CANCEL, TOKENS, FINISH = 1, 2, 3, 4, 5, 6
ROLE_ROUTER, ROLE_PREFILL, ROLE_DECODE = 0, 1, 2
AUTH_MAGIC = b"TDMC"
CHALLENGE_BYTES = 40
PROOF_BYTES = 32


def frame(msg_type, body):
    return struct.pack("<IHHI", CONTROL_MAGIC, CONTROL_VERSION, msg_type, len(body)) + body


def wstr(b):
    return struct.pack("<I", len(b)) + b


def i32s(values):
    return struct.pack("<I", len(values)) + b"".join(struct.pack("<i", v) for v in values)


def hello_frame(role=ROLE_ROUTER, instance_id=None, name=b"router"):
    instance_id = instance_id or random.getrandbits(63) + 1
    body = (struct.pack("<BQ", role, instance_id) + wstr(name) + wstr(b"tiny-test") + wstr(b"")
            + wstr(b"") + struct.pack("<iq", 0, 0))
    return frame(HELLO, body)


def submit_frame(request_id, decode_address, decode_session, max_tokens=8):
    sampling = (struct.pack("<fifffff", 0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0)  # greedy
                + struct.pack("<BQi", 1, 7, max_tokens) + i32s([])
                + struct.pack("<BBiB", 1, 0, 0, 0)  # ignore_eos, no logprobs, raw mode
                + struct.pack("<iI", 0, 0))  # min_tokens 0, no logit_bias
    body = (wstr(request_id.encode()) + i32s(PROMPT) + sampling + wstr(decode_address.encode())
            + struct.pack("<QQ", 1, decode_session))
    return frame(SUBMIT, body)


def frames_in(data):
    """[(type, body)] of the whole control frames at the start of `data`."""
    out = []
    while len(data) >= 12:
        magic, _, msg_type, n = struct.unpack("<IHHI", data[:12])
        if magic != CONTROL_MAGIC or len(data) < 12 + n:
            break
        out.append((msg_type, data[12:12 + n]))
        data = data[12 + n:]
    return out


def challenge(nonce):
    return AUTH_MAGIC + struct.pack("<HH", 1, 0) + nonce


def proof(secret, dialer, dialer_nonce, listener_nonce):
    label = b"tandem-control-v1 dialer" if dialer else b"tandem-control-v1 listener"
    return hmac.new(secret, label + dialer_nonce + listener_nonce, hashlib.sha256).digest()


# --- Sockets -------------------------------------------------------------------------------

def connect(port, timeout=5):
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def recv_exact(sock, n, timeout):
    """n bytes, or fewer when the peer closed or `timeout` passed."""
    sock.settimeout(timeout)
    data = b""
    try:
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                break
            data += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    return data


def drain_until_closed(sock, timeout):
    """(bytes received, closed by the peer, seconds waited) within `timeout`."""
    start = time.time()
    data = b""
    while time.time() - start < timeout:
        sock.settimeout(max(0.05, timeout - (time.time() - start)))
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        except ConnectionResetError:
            return data, True, time.time() - start
        if not chunk:
            return data, True, time.time() - start
        data += chunk
    return data, False, time.time() - start


def pre_auth_reply_ok(data):
    """What a listener may send a peer that has proved nothing: its challenge, nothing else."""
    return len(data) in (0, CHALLENGE_BYTES) and (not data or data.startswith(AUTH_MAGIC))


class Trap:
    """A TCP listener that records every connection made to it (the attacker's fake decode)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.arrivals = []  # [(time, first bytes)]
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            first = recv_exact(conn, CHALLENGE_BYTES, 2)
            self.arrivals.append((time.time(), first))
            conn.close()

    def wait(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline and not self.arrivals:
            time.sleep(0.05)
        return list(self.arrivals)

    def close(self):
        self.stop = True
        self.thread.join(timeout=5)
        self.sock.close()


# --- The cluster, seen from outside ---------------------------------------------------------

def metrics(port):
    """{sample: value} of an instance's /metrics."""
    body = http_get(f"http://127.0.0.1:{port}/metrics")[1]
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def request_counters(port):
    """The counters of work done: every *_total and histogram *_count sample."""
    return {k: v for k, v in metrics(port).items()
            if k.split("{")[0].endswith(("_total", "_count"))}


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def listener_pid(port):
    """The pid of the process holding the listening socket on 127.0.0.1:port (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


def api(cluster, path, body=None, key=API_KEY, timeout=120):
    """(status, headers, body text) of a raw HTTP request to the router."""
    conn = http.client.HTTPConnection("127.0.0.1", cluster.router_port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    conn.request("POST" if body is not None else "GET", path,
                 body=json.dumps(body) if body is not None else None, headers=headers)
    r = conn.getresponse()
    out = r.status, dict(r.getheaders()), r.read().decode(errors="replace")
    conn.close()
    return out


class Stream:
    """One greedy streaming completion through the router, on a thread: `first` is set at its
    first chunk, `done` at its end; `text` is what it generated, `error` what went wrong."""

    def __init__(self, cluster, max_tokens=STREAM_TOKENS):
        self.cluster, self.max_tokens = cluster, max_tokens
        self.first, self.done = threading.Event(), threading.Event()
        self.text, self.error, self.finish = "", None, None
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.cluster.router_port, timeout=120)
            conn.request("POST", "/v1/completions", body=json.dumps(
                {"model": "tiny-test", "prompt": PROMPT, "max_tokens": self.max_tokens,
                 "temperature": 0, "ignore_eos": True, "stream": True}),
                headers={"Content-Type": "application/json",
                         "Authorization": f"Bearer {API_KEY}"})
            r = conn.getresponse()
            if r.status != 200:
                self.error = f"HTTP {r.status}: {r.read()[:300]!r}"
                return
            for raw in r:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    self.error = str(event["error"])
                    return
                choice = event["choices"][0]
                self.text += choice.get("text") or ""
                self.finish = choice.get("finish_reason") or self.finish
                self.first.set()
            conn.close()
        except Exception as e:  # a reset or a hang is a failure of the cluster
            self.error = repr(e)
        finally:
            self.first.set()
            self.done.set()

    def result(self, timeout=120):
        self.done.wait(timeout)
        if not self.done.is_set():
            self.error = self.error or f"no end within {timeout} s"
        return self.text if self.error is None and self.finish == "length" else None


ROWS = []  # (attack, what the attacker did, what happened)


def row(attack, did, result):
    ROWS.append((attack, did, result))


# --- The attacks ----------------------------------------------------------------------------

def attack_api(cluster):
    body = {"model": "tiny-test", "prompt": "hi", "max_tokens": 2}
    for label, key in (("no key", None), ("wrong key", "sk-wrong"), ("empty bearer", "")):
        status, headers, text = api(cluster, "/v1/completions", body, key=key)
        check(status == 401 and headers.get("WWW-Authenticate") == "Bearer"
              and "invalid_api_key" in text, f"API with {label}: {status} {text[:200]}")
        row("5 public API", f"POST /v1/completions, {label}", f"HTTP {status}")
    status, _, text = api(cluster, "/v1/models", key="sk-wrong")
    check(status == 401, f"/v1/models with a wrong key: {status}")
    row("5 public API", "GET /v1/models, wrong key", f"HTTP {status}")
    status, _, text = api(cluster, "/v1/completions", body)
    check(status == 200, f"API with the key: {status} {text[:200]}")
    row("5 public API", "POST /v1/completions, right key (control)", f"HTTP {status}")


def attack_hello(cluster, decode_port, baseline):
    """1: pre-auth Hello(role=router) to decode, repeatedly while a stream runs."""
    stream = Stream(cluster)
    check(stream.first.wait(60), "the stream under attack never started")
    attempts, during, replies, not_closed = 0, 0, [], 0
    while not stream.done.is_set() or attempts == 0:
        with connect(decode_port) as s:
            s.sendall(hello_frame())
            data, closed, _ = drain_until_closed(s, HANDSHAKE_TIMEOUT_S + CLOSE_SLACK_S)
        attempts += 1
        during += not stream.done.is_set()
        if not pre_auth_reply_ok(data):
            replies.append(data[:80])
        not_closed += not closed
        if attempts >= 200:
            break
    text = stream.result()
    check(during >= 1, f"no attack ran while the stream was open ({attempts} attempts)")
    check(not replies, f"decode answered a pre-auth Hello: {replies[:3]}")
    check(not not_closed, f"{not_closed} pre-auth Hello connection(s) not closed")
    check(text is not None, f"the stream under attack failed: {stream.error}")
    check(text == baseline, "the stream under attack gave other tokens than a quiet run")
    row("1 pre-auth Hello", f"{attempts} x Hello(role=router) to decode, {during} while a "
        f"{STREAM_TOKENS}-token stream ran",
        f"closed {attempts - not_closed}/{attempts}, frames back {len(replies)}, stream "
        f"{'same tokens' if text == baseline else 'DIFFERENT'}")


def attack_submit(cluster, prefill_port, prefill_metrics):
    """2: pre-auth Submit to prefill naming the trap as its decode instance."""
    before = request_counters(prefill_metrics)
    trap = Trap()
    session = random.getrandbits(63) + 1
    payloads = {"Submit": submit_frame("attack-submit", trap.address, session),
                "Hello+Submit": hello_frame(instance_id=session)
                + submit_frame("attack-hello-submit", trap.address, session)}
    results = []
    for label, payload in payloads.items():
        with connect(prefill_port) as s:
            s.sendall(payload)
            data, closed, waited = drain_until_closed(s, HANDSHAKE_TIMEOUT_S + CLOSE_SLACK_S)
        check(closed and pre_auth_reply_ok(data),
              f"pre-auth {label} to prefill: closed {closed}, got {data[:80]!r}")
        results.append(f"{label}: {'closed' if closed else 'OPEN'} after {waited:.2f} s, "
                       f"{len(data)} B back")
    arrivals = trap.wait(TRAP_WAIT_S)
    trap.close()
    after = request_counters(prefill_metrics)
    changed = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
    check(not arrivals, f"prefill dialed the attacker's decode_address: {arrivals}")
    check(not changed, f"prefill's counters moved after pre-auth Submits: {changed}")
    row("2 pre-auth Submit", "Submit, and Hello+Submit, to prefill with decode_address = trap",
        "; ".join(results) + f"; trap connections in {TRAP_WAIT_S:.0f} s: {len(arrivals)}; "
        f"prefill counters changed: {len(changed)}")


def handshake(port, secret, reflect=False):
    """Runs the dialer side of the handshake; returns (socket, listener nonce, listener proof,
    our nonce). With reflect, sends the listener's own proof back as ours."""
    s = connect(port)
    nonce = os.urandom(32)
    s.sendall(challenge(nonce))
    got = recv_exact(s, CHALLENGE_BYTES + PROOF_BYTES, 5)
    if len(got) != CHALLENGE_BYTES + PROOF_BYTES or not got.startswith(AUTH_MAGIC):
        raise RuntimeError(f"no challenge and proof from port {port}: {got!r}")
    listener_nonce, listener_proof = got[8:CHALLENGE_BYTES], got[CHALLENGE_BYTES:]
    s.sendall(listener_proof if reflect else proof(secret, True, nonce, listener_nonce))
    return s, listener_nonce, listener_proof, nonce


def attack_wrong_secret(cluster, prefill_port, decode_port, prefill_metrics, secret):
    """3: the handshake with a wrong secret, and reflecting prefill's proof; Hello + Submit
    pipelined behind the proof."""
    before = request_counters(prefill_metrics)
    trap = Trap()
    for label, port, wrong, reflect in (
            ("wrong secret", prefill_port, os.urandom(32).hex().encode(), False),
            ("secret + 'x'", prefill_port, secret + b"x", False),
            ("reflected proof", prefill_port, None, True),
            ("wrong secret", decode_port, os.urandom(32).hex().encode(), False)):
        s, listener_nonce, listener_proof, nonce = handshake(port, wrong, reflect)
        # The listener's proof is right (it holds the secret): our Python HMAC matches its C++.
        check(hmac.compare_digest(listener_proof, proof(secret, False, nonce, listener_nonce)),
              "the listener's proof does not match the Python HMAC: the handshake here is wrong")
        session = random.getrandbits(63) + 1
        try:
            s.sendall(hello_frame(instance_id=session)
                      + submit_frame(f"attack-{label}", trap.address, session))
        except OSError:
            pass  # already closed
        data, closed, waited = drain_until_closed(s, HANDSHAKE_TIMEOUT_S + CLOSE_SLACK_S)
        s.close()
        who = "prefill" if port == prefill_port else "decode"
        check(closed and not data, f"{label} to {who}: closed {closed}, got {data[:80]!r}")
        row("3 handshake", f"{label} to {who}, then Hello+Submit(trap)",
            f"{'closed' if closed else 'OPEN'} after {waited:.2f} s, {len(data)} B after the "
            "handshake")
    arrivals = trap.wait(TRAP_WAIT_S)
    trap.close()
    changed = {k: (before.get(k), v) for k, v in request_counters(prefill_metrics).items()
               if before.get(k) != v}
    check(not arrivals, f"prefill dialed the trap after a failed handshake: {arrivals}")
    check(not changed, f"prefill's counters moved after failed handshakes: {changed}")
    row("3 handshake", "(all of the above)", f"trap connections: {len(arrivals)}; prefill "
        f"counters changed: {len(changed)}")


def positive_hello(port, secret, want_role, who):
    """The right secret: the instance answers a Hello(role=router) with its own Hello."""
    s, _, _, _ = handshake(port, secret)
    s.sendall(hello_frame())
    data = recv_exact(s, 12, 10)
    body_len = struct.unpack("<I", data[8:12])[0] if len(data) == 12 else 0
    data += recv_exact(s, body_len, 10)
    s.close()
    frames = frames_in(data)
    ok = bool(frames) and frames[0][0] == HELLO and frames[0][1][0] == want_role
    check(ok, f"right secret: no Hello from {who}: {data[:80]!r}")
    row("3 handshake", f"right secret to {who}, Hello(role=router) (control)",
        f"got {who}'s Hello" if ok else "NO HELLO")


def positive_submit(prefill_port, secret):
    """The right secret: a Submit naming the trap makes prefill dial it and stream tokens."""
    trap = Trap()
    session = random.getrandbits(63) + 1
    s, _, _, _ = handshake(prefill_port, secret)
    s.sendall(hello_frame(instance_id=session)
              + submit_frame("control-submit", trap.address, session))
    arrivals = trap.wait(15)
    data, _, _ = drain_until_closed(s, 3)
    s.close()
    trap.close()
    types = {t for t, _ in frames_in(data)}
    dialed = bool(arrivals) and arrivals[0][1].startswith(AUTH_MAGIC)
    check(dialed, f"right secret: prefill did not dial the trap: {arrivals}")
    check(TOKENS in types or FINISH in types, f"right secret: no Tokens/Finish: {types}")
    row("3 handshake", "right secret to prefill, Hello + Submit(trap) (control)",
        f"prefill dialed the trap: {dialed}; frames back: "
        f"{sorted({1: 'Hello', 2: 'LoadReport', 5: 'Tokens', 6: 'Finish'}.get(t, t) for t in types)}")


FLOOD = (  # (kind, connections)
    ("garbage 4 KiB", 20),
    ("garbage 16 B", 10),
    ("silent", 10),
    ("drip 1 B/s", 30),
    ("32 MiB header only", 10),
    ("32 MiB header + body", 10),
    ("challenge + 32 MiB header + body", 10),
)


def big_header():
    return struct.pack("<IHHI", CONTROL_MAGIC, CONTROL_VERSION, SUBMIT, 32 << 20)


def attack_flood(cluster, decode_port, decode_pid, baseline):
    """4: 100 hostile connections at once to decode's control port."""
    rss_before = [rss_kb(decode_pid)]
    for _ in range(4):
        time.sleep(0.1)
        rss_before.append(rss_kb(decode_pid))
    rss_before = max(rss_before)
    sel = selectors.DefaultSelector()
    conns = []
    drip_payload = challenge(os.urandom(32)) + os.urandom(PROOF_BYTES)
    for kind, n in FLOOD:
        for _ in range(n):
            s = connect(decode_port)
            s.setblocking(False)
            c = {"kind": kind, "sock": s, "opened": time.time(), "closed": None, "got": b"",
                 "out": b"", "stream": 0, "drip": 0}
            if kind == "garbage 4 KiB":
                c["out"] = os.urandom(4096)
            elif kind == "garbage 16 B":
                c["out"] = os.urandom(16)
            elif kind == "32 MiB header only":
                c["out"] = big_header()
            elif kind == "32 MiB header + body":
                c["out"], c["stream"] = big_header(), 32 << 20
            elif kind == "challenge + 32 MiB header + body":
                c["out"], c["stream"] = challenge(os.urandom(32)) + big_header(), 32 << 20
            conns.append(c)
            sel.register(s, selectors.EVENT_READ, c)
    stream = Stream(cluster)  # a legitimate request during the flood
    start = time.time()
    rss_peak, next_drip, chunk = rss_before, start, os.urandom(1 << 16)
    deadline = start + HANDSHAKE_TIMEOUT_S + CLOSE_SLACK_S + 5

    def closed(c):
        c["closed"] = time.time()
        sel.unregister(c["sock"])
        c["sock"].close()

    while time.time() < deadline and any(c["closed"] is None for c in conns):
        now = time.time()
        drip_now = now >= next_drip
        if drip_now:
            next_drip += 1.0
        for c in conns:
            if c["closed"] is not None:
                continue
            try:
                if c["kind"] == "drip 1 B/s" and drip_now and c["drip"] < len(drip_payload):
                    c["out"] += drip_payload[c["drip"]:c["drip"] + 1]
                    c["drip"] += 1
                if not c["out"] and c["stream"] > 0:
                    c["out"] = chunk[:min(len(chunk), c["stream"])]
                    c["stream"] -= len(c["out"])
                if c["out"]:
                    sent = c["sock"].send(c["out"])
                    c["out"] = c["out"][sent:]
            except BlockingIOError:
                pass  # the instance reads nothing more: its buffer and ours are full
            except OSError:
                closed(c)
        for key, _ in sel.select(timeout=0.05):
            c = key.data
            try:
                data = c["sock"].recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                c["got"] += data
            else:
                closed(c)
        rss_peak = max(rss_peak, rss_kb(decode_pid))
    for c in conns:
        if c["closed"] is None:
            sel.unregister(c["sock"])
            c["sock"].close()
    text = stream.result()
    after = Stream(cluster).result()
    rss_after = rss_kb(decode_pid)

    growth = rss_peak - rss_before
    check(growth < RSS_BOUND_KB, f"decode's RSS grew by {growth} kB under the flood")
    bound = HANDSHAKE_TIMEOUT_S + CLOSE_SLACK_S
    for kind, n in FLOOD:
        mine = [c for c in conns if c["kind"] == kind]
        open_ = [c for c in mine if c["closed"] is None]
        late = [c for c in mine if c["closed"] is not None and c["closed"] - c["opened"] > bound]
        # Before the handshake a listener sends its challenge and, after reading a valid one,
        # its proof; never a control frame.
        extra = [c["got"][:80] for c in mine
                 if not c["got"].startswith(AUTH_MAGIC) and c["got"]
                 or len(c["got"]) > CHALLENGE_BYTES + PROOF_BYTES]
        check(not open_, f"flood '{kind}': {len(open_)} connection(s) still open after "
              f"{deadline - start:.0f} s")
        check(not late, f"flood '{kind}': {len(late)} connection(s) closed later than {bound} s")
        check(not extra, f"flood '{kind}': unexpected bytes back: {extra[:2]}")
        times = [c["closed"] - c["opened"] for c in mine if c["closed"] is not None]
        row("4 flood", f"{n} x {kind}",
            f"closed {len(times)}/{n}, after {min(times):.2f}-{max(times):.2f} s"
            if times else f"closed 0/{n}")
    check(text is not None and text == baseline,
          f"the stream during the flood: {stream.error or 'other tokens'}")
    check(after is not None and after == baseline, "the request after the flood failed or differed")
    row("4 flood", f"decode RSS (pid {decode_pid})",
        f"before {rss_before / 1024:.1f} MiB, peak {rss_peak / 1024:.1f} MiB (+{growth / 1024:.1f} "
        f"MiB, bound {RSS_BOUND_KB // 1024}), after {rss_after / 1024:.1f} MiB")
    row("4 flood", "a stream during, a request after",
        f"during: {'same tokens' if text == baseline else 'FAILED/DIFFERENT'}; after: "
        f"{'same tokens' if after == baseline else 'FAILED/DIFFERENT'}")


def attack_fds(cluster, decode_port, decode_metrics, decode_pid, baseline):
    """6: more connections than decode has file descriptors, held for FD_FLOOD_S."""
    log_lines = len(open(cluster.log_path).read().splitlines())
    sel = selectors.DefaultSelector()
    opened = refused = 0

    def open_one():
        nonlocal opened, refused
        try:
            s = connect(decode_port, timeout=1)
        except OSError:
            refused += 1
            return
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        opened += 1

    for _ in range(FD_FLOOD):
        open_one()
    streams, health_failures, health_polls, closed = [], 0, 0, 0
    start = time.time()
    next_health = start
    while time.time() < start + FD_FLOOD_S:
        if not streams or streams[-1].done.is_set():
            streams.append(Stream(cluster))
        if time.time() >= next_health:
            next_health += 0.25
            for _ in range(closed):  # take the places decode freed (4 times a second: a
                open_one()           # sustained flood that spares the machine's ports)
            closed = 0
            health_polls += 1
            try:
                health_failures += http_get(f"http://127.0.0.1:{decode_metrics}/health",
                                            timeout=3)[0] != 200
            except Exception:
                health_failures += 1
        for key, _ in sel.select(timeout=0.05):
            try:
                data = key.fileobj.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:  # closed by decode: its place is taken again at the next tick
                sel.unregister(key.fileobj)
                key.fileobj.close()
                closed += 1
    held = len(sel.get_map())
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    sel.close()
    texts = [st.result() for st in streams]
    after = Stream(cluster).result()
    accept_errors = sum("accept failed" in l or "accept:" in l
                        for l in open(cluster.log_path).read().splitlines()[log_lines:])
    good = sum(t == baseline for t in texts)
    check(cluster.child_pid("decode", 0) == decode_pid, "decode was restarted under the fd flood")
    check(health_failures == 0, f"decode's /health failed {health_failures} of {health_polls} "
          "polls under the fd flood")
    check(good == len(texts), f"{len(texts) - good} of {len(texts)} streams during the fd flood "
          "failed or differed")
    check(after == baseline, "the request after the fd flood failed or differed")
    check(accept_errors < 50, f"{accept_errors} accept errors logged under the fd flood")
    row("6 fd exhaustion", f"{FD_FLOOD} connections to decode (RLIMIT_NOFILE {FD_LIMIT}) held "
        f"{FD_FLOOD_S:.0f} s, reopening closed ones 4x/s",
        f"connects {opened} ({refused} failed), open at the end {held}; decode /health "
        f"failed {health_failures}/{health_polls}; streams same tokens {good}/{len(texts)}, after "
        f"{'same' if after == baseline else 'FAILED/DIFFERENT'}; accept errors logged "
        f"{accept_errors}; decode restarted: {cluster.child_pid('decode', 0) != decode_pid}")


def read_secret(cluster):
    """The cluster secret from the file `tandem up` made, found through its log line
    '... on RUN_DIR/config.yaml' and the snapshot's control.secret_file."""
    log = open(cluster.log_path).read()
    marker = log.split(") on ", 1)[1].split(";", 1)[0].strip() if ") on " in log else None
    check(marker and marker.endswith("/config.yaml"), f"no snapshot path in the log: {marker}")
    snapshot = open(marker).read()
    path = None
    for line in snapshot.splitlines():
        if line.strip().startswith("secret_file:"):
            path = line.split(":", 1)[1].strip().strip('"')
    check(path is not None and os.path.isfile(path), f"no control.secret_file in {marker}")
    check(os.stat(path).st_mode & 0o077 == 0, f"{path} is open to group or others")
    return open(path, "rb").read().strip(b" \t\r\n")


def run(cluster):
    prefill_port = cluster.config["prefill"]["port"]
    decode_port = cluster.config["decode"]["port"]
    ports = dict(cluster.metrics_ports)
    prefill_metrics, decode_metrics = ports["prefill-0"], ports["decode-0"]
    pids = {name: cluster.child_pid(*name.split("-")) for name in ("prefill-0", "decode-0")}
    check(listener_pid(decode_port) == pids["decode-0"],
          f"decode's control port {decode_port} is held by pid {listener_pid(decode_port)}, "
          f"not decode-0 ({pids['decode-0']})")
    baseline = Stream(cluster).result()
    check(baseline is not None and len(baseline) > 0, "the quiet run failed")
    secret = read_secret(cluster)

    t = time.time()
    attack_api(cluster)
    attack_hello(cluster, decode_port, baseline)
    attack_submit(cluster, prefill_port, prefill_metrics)
    attack_wrong_secret(cluster, prefill_port, decode_port, prefill_metrics, secret)
    positive_hello(decode_port, secret, ROLE_DECODE, "decode")
    attack_flood(cluster, decode_port, pids["decode-0"], baseline)
    attack_fds(cluster, decode_port, decode_metrics, pids["decode-0"], baseline)
    positive_hello(prefill_port, secret, ROLE_PREFILL, "prefill")
    positive_submit(prefill_port, secret)  # last: it leaves prefill a request to time out
    now = {name: cluster.child_pid(*name.split("-")) for name in pids}
    check(now == pids, f"an instance restarted during the attacks: {pids} -> {now}")
    print(f"attacks took {time.time() - t:.1f} s", flush=True)


def print_table():
    widths = [max(len(r[i]) for r in ROWS + [("attack", "what", "result")]) for i in range(2)]
    print(f"\n{'attack':<{widths[0]}} | {'what the attacker did':<{widths[1]}} | result")
    print("-" * (widths[0] + widths[1] + 40))
    for a, d, r in ROWS:
        print(f"{a:<{widths[0]}} | {d:<{widths[1]}} | {r}")
    print(flush=True)


def main():
    if not os.path.exists(BIN):
        print("no tandem binary at", BIN)
        return 1
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="tandem-attacks-") as work:
        model_dir = make_tiny_model(BIN, work)
        cluster = TandemCluster(
            "attacks", BIN, model_dir, work, prefill=1, decode=1,
            extra={"control": {"handshake_timeout_s": HANDSHAKE_TIMEOUT_S}})
        for section in ("prefill", "decode"):
            cluster.config[section]["kv_blocks"] = 256
        cluster.write_config()
        os.environ["TANDEM_API_KEYS"] = API_KEY  # inherited by `tandem up` and its router
        try:
            cluster.start(preexec_fn=lambda: resource.setrlimit(
                resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT)))
            print(f"cluster ready ({time.time() - t0:.1f} s)", flush=True)
            run(cluster)
        except Exception:
            print(cluster.tail(80))
            raise
        finally:
            cluster.stop()
            del os.environ["TANDEM_API_KEYS"]
            print_table()
        log = open(cluster.log_path).read()
        check(API_KEY not in log, "the API key in the log")
    print(f"done in {time.time() - t0:.1f} s; {len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


def test_attacks():
    assert main() == 0


if __name__ == "__main__":
    sys.exit(main())
