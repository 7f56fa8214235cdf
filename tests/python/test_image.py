#!/usr/bin/env python3
"""The CPU container image (deploy/image), run the way a container runtime would run it, but with
chroot: containers cannot be run through crun on these machines.

Needs the exported image filesystem from the CTest fixture `tandem_image` (test image/build:
tests/image/build_image.sh writes its path to $TANDEM_BUILD_DIR/image/rootfs.path and the image
config to image-cpu.json). Checks:
  1. the image config: non-root numeric user, the tandem binary as entrypoint, /models a volume,
     OCI labels;
  2. the runtime filesystem holds no compiler or build tool (gcc, cc, c++, cmake, ninja, make, ld)
     and no -dev package;
  3. every shared library the binary links resolves inside the image, and `tandem --version`
     runs there as uid/gid 10001;
  4. `tandem serve` (router + prefill + decode over UCX) runs from the image as uid 10001 in its
     own network, mount, PID and IPC namespaces: the root filesystem mounted read-only (a write
     to it fails), tmpfs on /tmp and /dev/shm, /proc and a minimal /dev, the image's env and
     workdir, the model (made on the host with `tandem make-model --preset tiny`) bind-mounted
     read-only on /models; the router listens on 0.0.0.0:8000 inside the namespace and this test
     reaches it from the host over a veth pair: /ready, then a chat completion answered 200 with
     a choice.
Teardown always stops the processes (SIGTERM, then SIGKILL to the namespace's init, which ends
the PID namespace), and removes the network namespace and the veth pair; the mounts live in the
private mount namespace and go with it. Every wait is bounded.

Env: TANDEM_BINARY (the host's tandem, for make-model), TANDEM_BUILD_DIR. Exit 0 = pass,
77 = skipped (not root, or the image was not built).
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from cluster_util import FAILURES, check, children_of, make_tiny_model, tail_file

BUILD_DIR = os.environ.get("TANDEM_BUILD_DIR") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build")
BIN = os.environ.get("TANDEM_BINARY") or os.path.join(BUILD_DIR, "tandem")
UID = 10001
READY_TIMEOUT_S = 180
# No proxy from the environment: the router is on a veth address of this machine.
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def skip(reason):
    print("skipped:", reason)
    sys.exit(77)


def image_config():
    with open(os.path.join(BUILD_DIR, "image", "image-cpu.json")) as f:
        return json.load(f)[0]["Config"]


def check_config(config):
    check(config.get("User") == f"{UID}:{UID}", f"image user {config.get('User')!r}, want {UID}:{UID}")
    check(config.get("Entrypoint") == ["/usr/local/bin/tandem"],
          f"image entrypoint {config.get('Entrypoint')!r}")
    check("/models" in (config.get("Volumes") or {}), f"/models not a volume: {config.get('Volumes')}")
    labels = config.get("Labels") or {}
    for key in ("title", "description", "version", "revision"):
        check(labels.get(f"org.opencontainers.image.{key}"), f"label org.opencontainers.image.{key} missing")


def check_no_build_tools(rootfs):
    for name in ("gcc", "cc", "c++", "g++", "cpp", "cmake", "ninja", "make", "ld", "as", "clang",
                 "nvcc"):
        for d in ("usr/bin", "usr/local/bin", "bin", "usr/sbin", "sbin"):
            path = os.path.join(rootfs, d, name)
            check(not os.path.lexists(path), f"build tool in the runtime image: /{d}/{name}")
    status = subprocess.run(["chroot", rootfs, "dpkg-query", "-W", "-f", "${Package}\\n"],
                            capture_output=True, text=True, timeout=60)
    check(status.returncode == 0, f"dpkg-query in the image failed: {status.stderr}")
    packages = status.stdout.split()
    # (gcc-12-base is not a compiler: it is libgcc's and libstdc++'s documentation package.)
    tools = re.compile(r"(gcc|g\+\+|cpp|clang|binutils)(-[0-9.]+)?|cmake|ninja-build|make"
                       r"|build-essential|.*-dev|cuda-.*")
    bad = [p for p in packages if tools.fullmatch(p)]
    check(not bad, f"build packages in the runtime image: {bad}")
    print(f"runtime image: {len(packages)} Debian packages, no build tools", flush=True)


def check_binary(rootfs):
    ldd = subprocess.run(["chroot", rootfs, "ldd", "/usr/local/bin/tandem"], capture_output=True,
                         text=True, timeout=60)
    check(ldd.returncode == 0 and "not found" not in ldd.stdout,
          f"unresolved libraries in the image: {ldd.stdout} {ldd.stderr}")
    version = subprocess.run(["chroot", f"--userspec={UID}:{UID}", rootfs,
                              "/usr/local/bin/tandem", "--version"],
                             capture_output=True, text=True, timeout=60)
    # (Without /proc, as here, UCX logs that it cannot read the boot id: noise.)
    line = re.search(r"^tandem \S+$", version.stdout, re.M)
    check(version.returncode == 0 and line,
          f"tandem --version as {UID}: rc {version.returncode}: {version.stdout} {version.stderr}")
    print(f"in the image, as uid {UID}:", line.group(0) if line else version.stdout, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30, **kw)


def mount_script(rootfs, root, model_dir, env, workdir, argv):
    """The shell that runs as init of the new PID namespace (inside the new mount namespace):
    mounts the image the way a runtime with a read-only root filesystem would, checks that the
    root cannot be written, then becomes the container's process (as uid 10001)."""
    q = shlex.quote
    return "\n".join([
        "set -eu",
        f"R={q(root)}",
        # The image, read-only (a bind mount of the exported directory, remounted ro).
        f"mount --bind {q(rootfs)} \"$R\"",
        "mount -o remount,bind,ro \"$R\"",
        # What the runtime provides: /proc of this PID namespace, sysfs of this network
        # namespace (UCX reads interfaces there), a minimal /dev, tmpfs for /tmp and /dev/shm.
        "mount -t proc -o nosuid,nodev,noexec proc \"$R/proc\"",
        "mount -t sysfs -o ro,nosuid,nodev,noexec sysfs \"$R/sys\"",
        "mount -t tmpfs -o nosuid,mode=755,size=1m tmpfs \"$R/dev\"",
        "for d in null zero full random urandom tty; do",
        "  touch \"$R/dev/$d\"; mount --bind /dev/$d \"$R/dev/$d\"",
        "done",
        "ln -s /proc/self/fd \"$R/dev/fd\"",
        "for i in 0:stdin 1:stdout 2:stderr; do ln -s /proc/self/fd/${i%%:*} \"$R/dev/${i#*:}\"; done",
        "mkdir \"$R/dev/shm\"",
        "mount -t tmpfs -o nosuid,nodev,mode=1777,size=512m tmpfs \"$R/dev/shm\"",
        "mount -t tmpfs -o nosuid,nodev,mode=1777,size=256m tmpfs \"$R/tmp\"",
        # The model volume, read-only.
        f"mount --bind {q(model_dir)} \"$R/models\"",
        "mount -o remount,bind,ro \"$R/models\"",
        # A read-only root: even root cannot write to it.
        "if chroot \"$R\" /bin/sh -c ': > /etc/tandem-write-probe' 2>/dev/null; then",
        "  echo 'FAIL: the root filesystem is writable'; exit 3",
        "fi",
        "echo 'image mounted: root read-only, /tmp and /dev/shm tmpfs'",
        f"exec chroot --userspec={UID}:{UID} \"$R\" /usr/bin/env -i -C {q(workdir)} "
        + " ".join(q(e) for e in env) + " " + " ".join(q(a) for a in argv),
    ])


def http_json(url, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with HTTP.open(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def serve_in_namespaces(rootfs, config, work):
    model_dir = make_tiny_model(BIN, work, "tiny")
    # The container user reads the model: world-readable files in world-searchable directories.
    for dirpath, dirnames, filenames in os.walk(model_dir):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    root = os.path.join(work, "root")
    os.makedirs(root)

    tag = f"{os.getpid() % 100000}"
    ns, veth = f"tandem-img-{tag}", f"tdimg{tag}"
    subnet = f"10.231.{os.getpid() % 250}"
    host_ip, ns_ip = f"{subnet}.1", f"{subnet}.2"
    log_path = os.path.join(work, "serve.log")
    proc = None
    started = time.time()
    try:
        run(["ip", "netns", "add", ns])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        run(["ip", "addr", "add", f"{host_ip}/30", "dev", veth])
        run(["ip", "link", "set", veth, "up"])
        run(["ip", "-n", ns, "addr", "add", f"{ns_ip}/30", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])

        env = config.get("Env") or []
        workdir = config.get("WorkingDir") or "/"
        argv = config["Entrypoint"] + [
            "serve", "--model.path=/models", "--model.name=tiny-test",
            "--model.max_model_len=1024", "--router.host=0.0.0.0", "--router.port=8000",
            "--slo.ttft_s=60", "--slo.tpot_s=10"]
        script = mount_script(rootfs, root, model_dir, env, workdir, argv)
        log = open(log_path, "w")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, "unshare", "--mount", "--pid", "--ipc", "--uts", "--fork",
             "--kill-child", "--propagation", "private", "sh", "-c", script],
            stdout=log, stderr=subprocess.STDOUT)
        url = f"http://{ns_ip}:8000"
        deadline = time.time() + READY_TIMEOUT_S
        ready = False
        while time.time() < deadline and proc.poll() is None:
            try:
                if http_json(url + "/ready", timeout=2)[0] == 200 and \
                        "tandem: ready at" in tail_file(log_path, 200):
                    ready = True
                    break
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.5)
        if not check(ready, f"tandem serve in the image not ready after {time.time() - started:.0f} s "
                            f"(exit {proc.poll()}): {tail_file(log_path, 40)}"):
            return
        print(f"tandem serve in the image ready in {time.time() - started:.1f} s", flush=True)

        # Every tandem process runs as the image's user.
        pids = [pid for pid in all_descendants(proc.pid) if comm(pid) == "tandem"]
        check(len(pids) >= 4, f"want the launcher, router, prefill and decode; got {pids}")
        for pid in pids:
            uid = status_field(pid, "Uid")
            check(uid and all(u == str(UID) for u in uid), f"process {pid} runs as uid {uid}")
        print(f"{len(pids)} tandem processes in the namespaces, all uid {UID}", flush=True)

        status, body = http_json(url + "/v1/chat/completions", {
            "model": "tiny-test", "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8, "temperature": 0}, timeout=120)
        ok = check(status == 200, f"chat completion: {status} {body[:500]}")
        if ok:
            reply = json.loads(body)
            choices = reply.get("choices") or []
            check(len(choices) == 1 and isinstance(choices[0].get("message", {}).get("content"), str)
                  and choices[0].get("finish_reason") in ("stop", "length"),
                  f"chat completion without a choice: {body[:500]}")
            print("chat completion from the image:", json.dumps(choices[:1])[:300], flush=True)
    finally:
        stop(proc)
        if proc is not None:
            log.close()
        subprocess.run(["ip", "link", "del", veth], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        check(subprocess.run(["ip", "netns", "pids", ns], capture_output=True).returncode != 0,
              f"network namespace {ns} left behind")
        with open("/proc/self/mountinfo") as f:
            check(root not in f.read(), f"a mount under {root} left behind on the host")
        if FAILURES:
            print("---- serve log ----\n" + tail_file(log_path, 60), flush=True)


def all_descendants(pid):
    out, todo = [], [pid]
    while todo:
        for child, _ in children_of(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def status_field(pid, name):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return line.split()[1:]
    except OSError:
        pass
    return None


def stop(proc):
    """SIGTERM to the namespace's init (tandem serve: it drains and stops its children), then
    SIGKILL to it, which kills everything in the PID namespace; unshare (--kill-child) and the
    mount namespace go with it."""
    if proc is None:
        return
    inits = [pid for pid, _ in children_of(proc.pid)]
    for pid in inits:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        for pid in inits:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait(timeout=30)


def main():
    if os.geteuid() != 0:
        skip("running the image with chroot and namespaces needs root")
    path_file = os.path.join(BUILD_DIR, "image", "rootfs.path")
    if not os.path.exists(path_file):
        skip(f"no exported image ({path_file}): the fixture image/build did not run or was skipped")
    with open(path_file) as f:
        rootfs = f.read().strip()
    for tool in ("chroot", "unshare", "ip"):
        if shutil.which(tool) is None:
            skip(f"{tool} missing")
    started = time.time()
    config = image_config()
    check_config(config)
    check_no_build_tools(rootfs)
    check_binary(rootfs)
    work = tempfile.mkdtemp(prefix="tandem-image-")
    try:
        serve_in_namespaces(rootfs, config, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"== image test: {time.time() - started:.1f} s", flush=True)
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
