"""Helpers shared by the Python tests that start real Tandem clusters: failure bookkeeping,
free loopback ports, plain HTTP GETs, the launcher's child processes, and TandemCluster (one
`tandem up` on loopback ports, started, inspected and stopped).

Not a test itself (CTest runs only test_*.py)."""
import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.request

FAILURES = []


def check(cond, message):
    """Records a failure (the test exits non-zero at the end) and goes on."""
    if not cond:
        FAILURES.append(message)
        print("FAIL:", message, flush=True)
    return cond


def report(cond, message):
    """check(), printing the passing checks too: for tests whose log is their evidence."""
    print(("ok    " if cond else "FAIL  ") + message, flush=True)
    if not cond:
        FAILURES.append(message)
    return cond


def make_tiny_model(binary, work, name="tiny"):
    """Writes the built-in tiny test model under work/name (`tandem make-model`); returns its
    directory."""
    model_dir = os.path.join(work, name)
    subprocess.run([binary, "make-model", "--preset", "tiny", "--out", model_dir], check=True,
                   capture_output=True, timeout=120)
    return model_dir


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


def metric(port, name):
    """The summed value of `name` over its samples on the instance whose /metrics is on
    127.0.0.1:`port` (None if absent)."""
    body = http_get(f"http://127.0.0.1:{port}/metrics")[1]
    values = [float(l.split()[-1]) for l in body.splitlines()
              if l.startswith(name + "{") or l.startswith(name + " ")]
    return sum(values) if values else None


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


def tail_file(path, n):
    """The last n lines of a log file ("" if it cannot be read)."""
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def stop_process(proc, timeout):
    """SIGTERM, then SIGKILL after `timeout` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for_ready_line(proc, log_path, ready_line, timeout_s, tail_lines=40):
    """Waits until `ready_line` is in the last 400 lines of a `tandem serve` log. RuntimeError
    with the log's tail when the process exits first, or (after stopping it) when `timeout_s`
    pass."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("tandem serve exited: " + tail_file(log_path, tail_lines))
        if ready_line in tail_file(log_path, 400):
            return
        time.sleep(0.25)
    stop_process(proc, 10)
    raise RuntimeError(f"tandem serve not ready in {timeout_s} s: " +
                       tail_file(log_path, tail_lines))


class TandemCluster:
    """A cluster run by `tandem up` on free loopback ports (router, control and metrics ports),
    from a config written as JSON (JSON is YAML) to workdir/NAME.yaml; its log goes to
    workdir/NAME.log (copied to $TANDEM_E2E_LOG_DIR on stop when that is set). `config` may be
    changed before start(); call write_config() after."""

    def __init__(self, name, binary, model_dir, workdir, prefill=0, decode=0, colocated=0,
                 model_name="tiny-test", slo=(60, 10), extra=None, ready_timeout_s=90):
        self.name = name
        self.binary = binary
        self.ready_timeout_s = ready_timeout_s
        self.router_port = free_base(1)
        sections = {}
        self.metrics_ports = []  # [(instance name, port)]
        for section, n in (("prefill", prefill), ("decode", decode), ("colocated", colocated)):
            entry = {"instances": n}
            if n:
                entry["port"] = free_base(n)
                entry["metrics_port"] = free_base(n)
                entry["threads"] = 1
                self.metrics_ports += [(f"{section}-{i}", entry["metrics_port"] + i)
                                       for i in range(n)]
            sections[section] = entry
        self.config = {
            "model": {"path": model_dir, "name": model_name, "max_model_len": 1024},
            "router": {"host": "127.0.0.1", "port": self.router_port, "policy": "goodput"},
            "slo": {"ttft_s": slo[0], "tpot_s": slo[1]},
            "transfer": {"backend": "ucx", "ucx_tls": "tcp"},
            **sections,
            **(extra or {}),
        }
        self.config_path = os.path.join(workdir, f"{name}.yaml")
        self.write_config()
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.url = f"http://127.0.0.1:{self.router_port}"
        self.proc = None
        self.log = None
        self.known_children = set()

    def write_config(self):
        with open(self.config_path, "w") as f:
            json.dump(self.config, f, indent=1)

    def start(self, preexec_fn=None):
        """Starts `tandem up` and waits until the router's /ready answers 200 and the launcher
        has printed its ready line. `preexec_fn` runs in the child before exec (e.g. to set a
        resource limit that the whole cluster inherits)."""
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([self.binary, "up", self.config_path], stdout=self.log,
                                     stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
        deadline = time.time() + self.ready_timeout_s
        while time.time() < deadline:
            self.known_children.update(pid for pid, _ in children_of(self.proc.pid))
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: tandem up exited: {self.tail()}")
            # The launcher's own line: from then on it restarts a child that exits (before, a
            # child that exits stops the cluster).
            if self.ready() and "tandem: ready at" in self.tail(400):
                self.known_children.update(pid for pid, _ in children_of(self.proc.pid))
                return
            time.sleep(0.25)
        raise RuntimeError(f"{self.name}: not ready after {self.ready_timeout_s} s: {self.tail()}")

    def ready(self):
        try:
            return http_get(self.url + "/ready", timeout=2)[0] == 200
        except Exception:
            return False

    def usable(self):
        """{role: instances the router can place on}, from its
        tandem_router_instances_usable gauge ({} when /metrics does not answer)."""
        try:
            body = http_get(self.url + "/metrics", timeout=2)[1]
        except Exception:
            return {}
        out = {}
        for line in body.splitlines():
            if line.startswith("tandem_router_instances_usable{"):
                role = line.split('instance_role="', 1)[1].split('"', 1)[0]
                out[role] = int(float(line.split()[-1]))
        return out

    def wait_usable(self, want, timeout=30):
        """Waits until the router can place on `want` ({role: count}) instances: /ready
        answers once one path through the cluster works, not when every instance is up."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = self.usable()
            if all(got.get(role, 0) >= n for role, n in want.items()):
                return True
            time.sleep(0.1)
        return False

    def wait_ready(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.ready():
                return True
            time.sleep(0.2)
        return False

    def processes(self):
        """{name: pid} for the launcher and each child (named by role and --index)."""
        out = {"launcher": self.proc.pid}
        for pid, cmd in children_of(self.proc.pid):
            self.known_children.add(pid)
            if len(cmd) < 2:
                continue
            name = cmd[1]
            if "--index" in cmd:
                name += "-" + cmd[cmd.index("--index") + 1]
            out[name] = pid
        return out

    def child_pid(self, role, index):
        return self.processes().get(f"{role}-{index}")

    def tail(self, n=40):
        return tail_file(self.log_path, n)

    def stop(self):
        """SIGTERM to the launcher (SIGKILL after 30 s), then SIGKILL to every child it had."""
        if self.proc is None:
            return
        keep = os.environ.get("TANDEM_E2E_LOG_DIR")
        self.known_children.update(pid for pid, _ in children_of(self.proc.pid))
        stop_process(self.proc, 30)
        for pid in self.known_children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()
        self.proc = None
        if keep:
            os.makedirs(keep, exist_ok=True)
            with open(self.log_path) as src, open(os.path.join(keep, self.name + ".log"), "w") as dst:
                dst.write(src.read())
