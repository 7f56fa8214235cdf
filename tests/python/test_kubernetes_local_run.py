#!/usr/bin/env python3
"""The rendered manifests drive a real run: renders overlays/cpu and starts every Deployment as
a pod would start, without Kubernetes. For each pod: its own network namespace (a veth on a
bridge in a hub namespace; addresses only in namespaces this test makes), its own mount
namespace with a root filesystem (an overlay over the host's / or over $TANDEM_IMAGE_ROOTFS,
read-only like readOnlyRootFilesystem) where the ConfigMaps, emptyDirs and a generated
/etc/hosts are mounted at the manifests' mountPaths, and the container's command and args,
untouched, run there under chroot as the pod's runAsUser with its env (downward-API values
filled in: status.podIP is the pod's address; secrets from the rendered Secret). Init containers
run first (the cpu overlay makes the model that way). The headless Services resolve through the
/etc/hosts of every pod, so the router's DNS discovery is what finds the instances.

Then every probe the manifests name (path and port) must answer 200, each pod listens only on its
containerPorts and the UCX range, runs as its runAsUser, and the router must serve a chat
completion with an API key from the Secret (and refuse one without). The router's ConfigMap is
then updated as kubelet does it (atomic `..data` swap) and its SLO target should follow by itself
(router.config_watch_interval_s) and must follow after SIGHUP. At the end every pod gets
SIGTERM and must exit within its terminationGracePeriodSeconds less its preStop sleep.

Without $TANDEM_IMAGE_ROOTFS the host build of tandem ($TANDEM_BINARY) is bind-mounted at the
path the Deployments' command names (/usr/local/bin/tandem); with it (an image's exported
filesystem, e.g. `podman export` unpacked) the image's own binary runs. Needs root, ip, unshare,
chroot and curl (exit 77 otherwise). Exit 0 = pass."""
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_util  # noqa: E402
from k8s_util import main_container, of_kind, named  # noqa: E402

BINARY = os.environ.get("TANDEM_BINARY", os.path.join(k8s_util.SOURCE, "build", "tandem"))
BUILD_DIR = os.environ.get("TANDEM_BUILD_DIR", os.path.join(k8s_util.SOURCE, "build"))


def image_rootfs():
    """$TANDEM_IMAGE_ROOTFS, else the image CTest's fixture image/build exported
    (build/image/rootfs.path), else "" (the host build)."""
    if os.environ.get("TANDEM_IMAGE_ROOTFS"):
        return os.environ["TANDEM_IMAGE_ROOTFS"]
    path_file = os.path.join(BUILD_DIR, "image", "rootfs.path")
    if os.path.exists(path_file):
        with open(path_file) as f:
            return f.read().strip()
    return ""


ROOTFS = image_rootfs()
OVERLAY = "cpu"
NAMESPACE = "default"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # a container's default
TAG = f"tk{os.getpid() % 100000}"                # prefix of every netns and link made here
SUBNET = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"   # /24 inside the namespaces only
STARTUP_TIMEOUT_S = 120   # bound on any pod's start (init containers, probes)
REQUEST_TIMEOUT_S = 60


def sh(*cmd, check=True, timeout=30):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip()}")
    return out


class Network:
    """A hub namespace with a bridge, and one namespace per pod (and one for the client) wired to
    it. delete() removes every namespace (and with them the links); safe to call twice."""

    def __init__(self):
        self.names = []
        self.hub = self.add_ns("hub")
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        self.next_host = 2

    def add_ns(self, name):
        ns = f"{TAG}-{name}"
        sh("ip", "netns", "add", ns)
        self.names.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        return ns

    def add_pod(self, name):
        """(netns, IP) of a new namespace on the bridge."""
        ns = self.add_ns(name)
        ip = f"{SUBNET}.{self.next_host}"
        hub_end = f"{TAG}v{self.next_host}"
        self.next_host += 1
        sh("ip", "-n", self.hub, "link", "add", hub_end, "type", "veth", "peer", "name", "eth0",
           "netns", ns)
        sh("ip", "-n", self.hub, "link", "set", hub_end, "master", "br0", "up")
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        return ns, ip

    def add_client(self):
        """A namespace on the bridge for the test's own requests (curl runs there)."""
        ns = self.add_ns("client")
        hub_end = f"{TAG}vc"
        sh("ip", "-n", self.hub, "link", "add", hub_end, "type", "veth", "peer", "name", "eth0",
           "netns", ns)
        sh("ip", "-n", self.hub, "link", "set", hub_end, "master", "br0", "up")
        sh("ip", "-n", ns, "addr", "add", f"{SUBNET}.250/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        return ns

    def delete(self):
        for ns in reversed(self.names):
            sh("ip", "netns", "delete", ns, check=False)
        self.names = []


def write_atomically(path, files, mode):
    """Writes a ConfigMap or Secret volume as kubelet's AtomicWriter does: the files in a fresh
    `..<timestamp>` directory, `..data` a symlink to it, and each key a symlink through `..data`;
    an update makes a new directory and renames a new `..data` over the old one, so a reader sees
    the old or the new set, never a mix, and the key's own path never changes (a watcher must
    follow the `..data` swap)."""
    stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.") + str(time.monotonic_ns())
    os.makedirs(os.path.join(path, stamp))
    for key, data in files.items():
        with open(os.path.join(path, stamp, key), "wb") as f:
            f.write(data)
        os.chmod(os.path.join(path, stamp, key), mode)
    old = os.readlink(os.path.join(path, "..data")) if os.path.islink(
        os.path.join(path, "..data")) else None
    os.symlink(stamp, os.path.join(path, "..data_tmp"))
    os.rename(os.path.join(path, "..data_tmp"), os.path.join(path, "..data"))
    for key in files:
        if not os.path.islink(os.path.join(path, key)):
            os.symlink(os.path.join("..data", key), os.path.join(path, key))
    if old:
        shutil.rmtree(os.path.join(path, old))


def quantity_bytes(q):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
             "G": 10**9}
    for suffix, factor in units.items():
        if str(q).endswith(suffix):
            return int(float(str(q)[:-len(suffix)]) * factor)
    return int(float(q))


def expand(text, env):
    """Kubernetes' $(VAR) expansion in command, args and env values ($$ escapes)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


class Pod:
    """One Deployment's pod: its namespace, address, volumes and processes."""

    def __init__(self, deployment, docs, network, work, hosts_file):
        self.name = deployment["metadata"]["name"]
        self.deployment = deployment
        self.spec = deployment["spec"]["template"]["spec"]
        self.docs = docs
        self.ns, self.ip = network.add_pod(self.name.replace("tandem-", ""))
        self.dir = os.path.join(work, self.name)
        os.makedirs(self.dir)
        self.hosts_file = hosts_file
        self.volumes = self.materialise_volumes()
        self.process = None
        self.log_path = None

    def materialise_volumes(self):
        """{volume name: host directory} holding what the pod would see there."""
        out = {}
        for v in self.spec.get("volumes", []):
            path = os.path.join(self.dir, "volumes", v["name"])
            os.makedirs(path)
            if "configMap" in v:
                cm = named(self.docs, "ConfigMap", v["configMap"]["name"])
                write_atomically(path, {k: t.encode() for k, t in cm.get("data", {}).items()},
                                 v["configMap"].get("defaultMode", 0o644))
            elif "secret" in v:
                secret = named(self.docs, "Secret", v["secret"]["secretName"])
                write_atomically(path, {k: base64.b64decode(d)
                                        for k, d in secret.get("data", {}).items()},
                                 v["secret"].get("defaultMode", 0o644))
            elif "emptyDir" in v:
                os.chmod(path, 0o777)   # as kubelet makes it
            else:
                raise AssertionError(f"{self.name}: volume {v['name']} is neither a ConfigMap, a "
                                     f"Secret nor an emptyDir: the local run cannot provide it")
            out[v["name"]] = path
        return out

    def env(self, container):
        env = {"PATH": PATH, "HOSTNAME": self.name, "HOME": "/"}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
                continue
            ref = e["valueFrom"]
            if "fieldRef" in ref:
                field = ref["fieldRef"]["fieldPath"]
                env[e["name"]] = {"status.podIP": self.ip, "metadata.name": self.name,
                                  "metadata.namespace": NAMESPACE, "spec.nodeName": "local",
                                  "status.hostIP": self.ip}[field]
            elif "resourceFieldRef" in ref:
                part, resource = ref["resourceFieldRef"]["resource"].split(".", 1)
                value = container["resources"][part][resource]
                env[e["name"]] = str(quantity_bytes(value))
            elif "secretKeyRef" in ref:
                secret = named(self.docs, "Secret", ref["secretKeyRef"]["name"])
                env[e["name"]] = base64.b64decode(secret["data"][ref["secretKeyRef"]["key"]]
                                                  ).decode().strip()
            elif "configMapKeyRef" in ref:
                cm = named(self.docs, "ConfigMap", ref["configMapKeyRef"]["name"])
                env[e["name"]] = cm["data"][ref["configMapKeyRef"]["key"]]
            else:
                raise AssertionError(f"{self.name}: env {e['name']}: unsupported {ref}")
        return env

    def script(self, container, env):
        """The shell script that builds the container's root in a private mount namespace and
        execs its command there, unchanged."""
        root = os.path.join(self.dir, "root-" + container["name"])
        layer = os.path.join(self.dir, "layer-" + container["name"])
        os.makedirs(root)
        os.makedirs(layer)
        lower = ROOTFS or "/"
        q = lambda s: "'" + s.replace("'", "'\\''") + "'"   # noqa: E731
        lines = ["set -eu",
                 # A writable layer over the image (or the host) so that mount points can be
                 # made, then remounted read-only below.
                 f"mount -t tmpfs tmpfs {q(layer)}",
                 f"mkdir {q(layer)}/upper {q(layer)}/work",
                 f"mount -t overlay overlay -o lowerdir={q(lower)},upperdir={q(layer)}/upper,"
                 f"workdir={q(layer)}/work {q(root)}",
                 f"mkdir -p {q(root)}/proc {q(root)}/dev {q(root)}/sys {q(root)}/etc",
                 f"mount --rbind /proc {q(root)}/proc",
                 f"mount --rbind /dev {q(root)}/dev",
                 f"mount --rbind /sys {q(root)}/sys",
                 # Service names resolve as the cluster's DNS would answer them.
                 f"touch {q(root)}/etc/hosts",
                 f"mount --bind {q(self.hosts_file)} {q(root)}/etc/hosts"]
        if not ROOTFS:
            # The host build at the path the Deployment's command names.
            target = container["command"][0]
            lines += [f"mkdir -p {q(root + os.path.dirname(target))}",
                      f"touch {q(root + target)}",
                      f"mount --bind {q(os.path.abspath(BINARY))} {q(root + target)}"]
        for m in container.get("volumeMounts", []):
            target = root + m["mountPath"]
            lines += [f"mkdir -p {q(target)}",
                      f"mount --bind {q(self.volumes[m['name']])} {q(target)}"]
            if m.get("readOnly"):
                lines.append(f"mount -o remount,bind,ro {q(target)}")
        sc = container.get("securityContext", {})
        if sc.get("readOnlyRootFilesystem"):
            lines.append(f"mount -o remount,ro {q(root)}")
        pod_sc = self.spec.get("securityContext", {})
        user = sc.get("runAsUser", pod_sc.get("runAsUser"))
        group = sc.get("runAsGroup", pod_sc.get("runAsGroup", user))
        userspec = f"--userspec={user}:{group} " if user is not None else ""
        argv = [expand(a, env) for a in container["command"] + container.get("args", [])]
        lines.append(f"exec chroot {userspec}{q(root)} " + " ".join(q(a) for a in argv))
        return "\n".join(lines)

    def start(self, container, log_name):
        env = self.env(container)
        self.log_path = os.path.join(self.dir, log_name + ".log")
        log = open(self.log_path, "w")
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns, "unshare", "-m",
                                 "--propagation", "private", "bash", "-c",
                                 self.script(container, env)],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return proc

    def run_init_containers(self):
        for c in self.spec.get("initContainers", []):
            proc = self.start(c, "init-" + c["name"])
            try:
                rc = proc.wait(timeout=STARTUP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = "timeout"
            assert rc == 0, f"{self.name}: init container {c['name']} ended with {rc}: " \
                            f"{k8s_util_tail(self.log_path)}"

    def start_main(self):
        self.process = self.start(main_container(self.deployment), "main")

    def stop(self):
        """SIGTERM (as kubelet after preStop), then SIGKILL when the grace period is over.
        Returns (exit status, seconds it took) or None when it was not running."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else (self.process.returncode, 0.0)
        c = main_container(self.deployment)
        pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        grace = self.spec.get("terminationGracePeriodSeconds", 30) - pre_stop
        start = time.time()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return ("killed after grace", time.time() - start)
        return (self.process.returncode, time.time() - start)


def k8s_util_tail(path, n=30):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def hosts_file(path, pods, docs):
    """/etc/hosts for every pod: each Service name resolves to the pods it selects (a headless
    Service's DNS answer; for a ClusterIP Service, its pods stand in for the virtual IP)."""
    lines = ["127.0.0.1 localhost"]
    for svc in of_kind(docs, "Service"):
        selector = svc["spec"]["selector"]
        for pod in pods:
            labels = pod.deployment["spec"]["template"]["metadata"]["labels"]
            if selector.items() <= labels.items():
                name = svc["metadata"]["name"]
                lines.append(f"{pod.ip} {name} {name}.{NAMESPACE}.svc "
                             f"{name}.{NAMESPACE}.svc.cluster.local")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(path, 0o644)


def curl(client_ns, url, *extra, timeout=10):
    """(HTTP status, body) of a request from the client namespace (status 0: no answer)."""
    out = subprocess.run(["ip", "netns", "exec", client_ns, "curl", "-sS", "-m", str(timeout),
                          "-o", "-", "-w", "\n%{http_code}", url, *extra],
                         capture_output=True, text=True, timeout=timeout + 10)
    body, _, code = out.stdout.rpartition("\n")
    return int(code or 0), body


def probes_of(pod):
    c = main_container(pod.deployment)
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = c[kind]["httpGet"]
        port = ports.get(get["port"], get["port"])
        yield kind, f"http://{pod.ip}:{port}{get['path']}"


def listening_port_failures(pod):
    c = main_container(pod.deployment)
    allowed = {p["containerPort"] for p in c.get("ports", [])}
    ucx = k8s_util.env_value(c, "UCX_TCP_PORT_RANGE")
    lo, hi = map(int, ucx.split("-")) if ucx else (0, -1)
    out = sh("ip", "netns", "exec", pod.ns, "ss", "-tlnH")
    ports = {int(line.split()[3].rsplit(":", 1)[1]) for line in out.stdout.splitlines()}
    stray = sorted(p for p in ports if p not in allowed and not lo <= p <= hi)
    print(f"{pod.name} listens on {sorted(ports)}", flush=True)
    return [f"{pod.name} listens on ports {stray}: neither a containerPort nor in "
            f"UCX_TCP_PORT_RANGE, so the NetworkPolicy blocks them"] if stray else []


def user_failures(pod):
    want = pod.spec.get("securityContext", {}).get("runAsUser")
    try:
        with open(f"/proc/{pod.process.pid}/status") as f:
            uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
    except (OSError, StopIteration):
        return [f"{pod.name} is not running"]
    return [] if want is None or uid == want else [f"{pod.name} runs as uid {uid}, not {want}"]


def wait_200(client_ns, url, deadline, pod):
    """Polls until 200, the deadline, or the pod's process is gone."""
    last = (0, "")
    while time.time() < deadline and pod.process.poll() is None:
        last = curl(client_ns, url, timeout=3)
        if last[0] == 200:
            return last
        time.sleep(0.5)
    return last


def probe_failures(client, pods):
    """Every probe path and port of every pod answers 200 (the router's readiness: once it can
    place a request), within one startup deadline."""
    failures = []
    deadline = time.time() + STARTUP_TIMEOUT_S
    for pod in pods:
        for kind, url in probes_of(pod):
            status, body = wait_200(client, url, deadline, pod)
            if status != 200:
                failures.append(f"{pod.name} {kind} {url} answered {status}: {body[:200]}")
            else:
                print(f"{pod.name} {kind} {url}: 200", flush=True)
            if pod.process.poll() is not None:
                failures.append(f"{pod.name} exited ({pod.process.returncode}): "
                                f"{k8s_util_tail(pod.log_path)}")
                break
    return failures


def completion_failures(client, router, docs):
    """A chat completion through the router with the Secret's first API key completes; one
    without a key gets 401."""
    c = main_container(router.deployment)
    secret = next(e["valueFrom"]["secretKeyRef"] for e in c["env"]
                  if e["name"] == "TANDEM_API_KEYS")
    keys = base64.b64decode(named(docs, "Secret", secret["name"])["data"][secret["key"]])
    api_key = keys.decode().split(",")[0].strip()
    config = yaml.safe_load(next(iter(of_kind(docs, "ConfigMap")))["data"]["cluster.yaml"])
    url = f"http://{router.ip}:{c['ports'][0]['containerPort']}/v1/chat/completions"
    body = json.dumps({"model": config["model"]["name"], "max_tokens": 8, "temperature": 0,
                       "messages": [{"role": "user", "content": "Hello"}]})
    failures = []
    status, _ = curl(client, url, "-H", "Content-Type: application/json", "-d", body)
    if status != 401:
        failures.append(f"a chat completion without an API key got {status}, not 401")
    status, text = curl(client, url, "-H", "Content-Type: application/json",
                        "-H", f"Authorization: Bearer {api_key}", "-d", body,
                        timeout=REQUEST_TIMEOUT_S)
    if status != 200:
        return failures + [f"chat completion: {status} {text[:300]}"]
    reply = json.loads(text)
    choice = reply["choices"][0]
    if choice["finish_reason"] not in ("stop", "length") or reply["usage"]["completion_tokens"] < 1:
        return failures + [f"chat completion did not complete: {text[:300]}"]
    print(f"chat completion: {reply['usage']['completion_tokens']} tokens, finish_reason "
          f"{choice['finish_reason']}", flush=True)
    return failures


def slo_ttft_target(client, router):
    """The router's tandem_router_slo_target_seconds for the default class's TTFT, or None."""
    port = main_container(router.deployment)["ports"][0]["containerPort"]
    status, text = curl(client, f"http://{router.ip}:{port}/metrics", timeout=5)
    for line in text.splitlines() if status == 200 else []:
        if line.startswith("tandem_router_slo_target_seconds{") and 'objective="ttft"' in line \
                and 'slo_class="default"' in line:
            return float(line.split()[-1])
    return None


def recommended_replicas_failures(client, router):
    """The router runs the replica recommendation the manifests turn on
    (components/replica-advice): tandem_recommended_replicas{role} for prefill and decode, >= 1,
    the series the ScaledObjects query."""
    port = main_container(router.deployment)["ports"][0]["containerPort"]
    status, text = curl(client, f"http://{router.ip}:{port}/metrics", timeout=5)
    found = {}
    for line in text.splitlines() if status == 200 else []:
        m = re.match(r'tandem_recommended_replicas\{[^}]*role="(prefill|decode)"[^}]*\} (\S+)$',
                     line)
        if m:
            found[m.group(1)] = float(m.group(2))
    if sorted(found) != ["decode", "prefill"] or min(found.values()) < 1:
        return [f"router /metrics has no tandem_recommended_replicas for both roles: {found}"]
    print(f"router recommends {found}", flush=True)
    return []


def config_reload_failures(client, router):
    """Changes slo.ttft_s in the router's ConfigMap volume as kubelet would (atomic ..data swap)
    and waits for the router's exported TTFT target to follow (the router polls its --config
    file every router.config_watch_interval_s)."""
    c = main_container(router.deployment)
    config_path = k8s_util.flag_value(c["args"], "config")
    mount = next(m for m in c["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    volume = router.volumes[mount["name"]]
    key = os.path.relpath(config_path, mount["mountPath"])
    with open(os.path.join(volume, key)) as f:
        config = yaml.safe_load(f)
    before = slo_ttft_target(client, router)
    want = float(config["slo"]["ttft_s"]) + 1.5
    config["slo"]["ttft_s"] = want
    # Kubelet rewrites every key of the ConfigMap (the latency model beside the config too).
    files = {}
    for name in os.listdir(os.path.join(volume, "..data")):
        with open(os.path.join(volume, "..data", name), "rb") as f:
            files[name] = f.read()
    files[key] = yaml.safe_dump(config).encode()
    write_atomically(volume, files, 0o644)
    got = wait_ttft_target(client, router, want, 10)
    if got == want:
        print(f"router reloaded its ConfigMap by itself: TTFT target {before} -> {got}",
              flush=True)
        return []
    failures = [f"the router did not reload its ConfigMap within 10 s: TTFT target {got}, "
                f"want {want}"]
    # SIGHUP rereads the same path: the kubelet layout (symlinks through ..data) must work.
    router.process.send_signal(signal.SIGHUP)
    got = wait_ttft_target(client, router, want, 10)
    if got != want:
        return failures + [f"after SIGHUP the router's TTFT target is {got}, not {want}: it "
                           f"cannot read the ConfigMap volume kubelet updated"]
    print(f"router reloaded its ConfigMap on SIGHUP: TTFT target {before} -> {got}", flush=True)
    return failures


def wait_ttft_target(client, router, want, seconds):
    deadline = time.time() + seconds
    got = slo_ttft_target(client, router)
    while time.time() < deadline and got != want:
        time.sleep(0.5)
        got = slo_ttft_target(client, router)
    return got


def stop_failures(pods):
    """SIGTERM to every pod, the router first (it drains): each must exit 0 within its grace
    period less its preStop sleep."""
    failures = []
    for pod in reversed(pods):
        result = pod.stop()
        if result is None:
            continue
        rc, took = result
        if rc != 0:
            failures.append(f"{pod.name} after SIGTERM: {rc} ({took:.1f} s): "
                            f"{k8s_util_tail(pod.log_path)}")
        else:
            print(f"{pod.name} stopped on SIGTERM in {took:.1f} s", flush=True)
    return failures


def skip_reason():
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces)"
    for tool in ("ip", "ss", "unshare", "chroot", "curl"):
        if not shutil.which(tool):
            return f"no {tool}"
    if not k8s_util.kubectl():
        return "no kubectl"
    return None


def main():
    if skip_reason():
        k8s_util.exit_skip(skip_reason())
    if not ROOTFS and not os.access(BINARY, os.X_OK):
        print(f"FAIL: no tandem binary at {BINARY}")
        return 1
    _, docs = k8s_util.render(OVERLAY)
    deployments = {d["metadata"]["name"]: d for d in of_kind(docs, "Deployment")}
    print(f"overlays/{OVERLAY}: {sorted(deployments)}; root: {ROOTFS or 'host, with ' + BINARY}")

    failures = []
    work = tempfile.mkdtemp(prefix="tandem-k8s-run-")
    network = None
    pods = []
    started = time.time()
    try:
        network = Network()
        client = network.add_client()
        # The instances before the router, as a rollout would bring them (the router copes with
        # either order: it rediscovers every control.discovery_interval_s).
        for name in ("tandem-prefill", "tandem-decode", "tandem-router"):
            pods.append(Pod(deployments.pop(name), docs, network, work,
                            os.path.join(work, "hosts")))
        assert not deployments, f"Deployments this test does not know: {sorted(deployments)}"
        hosts_file(os.path.join(work, "hosts"), pods, docs)
        for pod in pods:
            pod.run_init_containers()
            pod.start_main()
        print(f"pods started ({time.time() - started:.1f} s): "
              + ", ".join(f"{p.name} at {p.ip}" for p in pods), flush=True)
        failures += probe_failures(client, pods)
        # What each pod really listens on is what the manifests expose: containerPorts, plus the
        # UCX KV range the NetworkPolicy opens. And each runs as the pod's runAsUser.
        for pod in pods:
            failures += listening_port_failures(pod) + user_failures(pod)
        failures += completion_failures(client, pods[-1], docs)
        failures += recommended_replicas_failures(client, pods[-1])
        failures += config_reload_failures(client, pods[-1])
    except Exception as e:  # a setup failure is reported with the pods' logs, then torn down
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        failures += stop_failures(pods)
        if network:
            network.delete()
        if failures:
            for pod in pods:
                print(f"--- {pod.name} log ---\n{k8s_util_tail(pod.log_path)}")
        if os.environ.get("TANDEM_KEEP_TEST_LOGS"):
            print("logs kept in", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    left = [n for n in sh("ip", "netns", "list").stdout.split() if n.startswith(TAG + "-")]
    if left:
        failures.append(f"network namespaces left behind: {left}")
    for f in failures:
        print("FAIL:", f)
    print(f"local run from the rendered manifests: {time.time() - started:.1f} s")
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
