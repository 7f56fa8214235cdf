"""Helpers shared by the Python tests that start real Tandem clusters: failure bookkeeping,
free loopback ports, plain HTTP GETs and the launcher's child processes.

Not a test itself (CTest runs only test_*.py)."""
import os
import random
import socket
import urllib.request

FAILURES = []


def check(cond, message):
    """Records a failure (the test exits non-zero at the end) and goes on."""
    if not cond:
        FAILURES.append(message)
        print("FAIL:", message, flush=True)
    return cond


def port_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


TAKEN = set()


def free_base(count, rng=random.Random()):
    """A base port such that [base, base + count) are free on 127.0.0.1 and not handed out
    before; 20000-32000 stays below the kernel's range for outgoing connections."""
    for _ in range(500):
        base = rng.randrange(20000, 32000 - count)
        ports = range(base, base + count)
        if all(p not in TAKEN and port_free(p) for p in ports):
            TAKEN.update(ports)
            return base
    raise RuntimeError("no free ports")


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def children_of(pid):
    """[(pid, argv)] of the direct children of `pid`, read from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
                out.append((int(entry), [c.decode() for c in cmd if c]))
        except (OSError, IndexError, ValueError):
            pass
    return out
