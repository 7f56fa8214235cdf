"""Helpers shared by the tests of deploy/kubernetes: rendering an overlay with `kubectl kustomize`
(with the sample secrets of deploy/kubernetes/example-secrets, since an overlay's own secrets/
are the operator's and never committed), and picking objects out of the rendered documents.

Not a test itself (CTest runs only test_*.py)."""
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

SOURCE = os.path.abspath(os.environ.get(
    "TANDEM_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")))
KUBERNETES = os.path.join(SOURCE, "deploy", "kubernetes")
OVERLAYS = ("cpu", "gpu")
SKIP = 77  # CTest's SKIP_RETURN_CODE


def kubectl():
    """The kubectl binary, or None."""
    return shutil.which("kubectl")


def render(overlay):
    """(text, [documents]) of `kubectl kustomize` on overlays/OVERLAY, rendered from a copy of
    deploy/kubernetes whose overlay holds the sample secrets. Raises CalledProcessError with
    kubectl's message when the overlay does not render."""
    with tempfile.TemporaryDirectory(prefix="tandem-k8s-") as tmp:
        tree = os.path.join(tmp, "kubernetes")
        shutil.copytree(KUBERNETES, tree, ignore=shutil.ignore_patterns("secrets"))
        secrets = os.path.join(tree, "overlays", overlay, "secrets")
        shutil.copytree(os.path.join(tree, "example-secrets"), secrets)
        out = subprocess.run([kubectl(), "kustomize", os.path.join(tree, "overlays", overlay)],
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise subprocess.CalledProcessError(out.returncode, "kubectl kustomize", out.stdout,
                                                out.stderr)
    return out.stdout, [d for d in yaml.safe_load_all(out.stdout) if d]


def of_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def named(docs, kind, name):
    """The one object of `kind` called `name` (AssertionError naming it when absent)."""
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def component(obj):
    return obj["metadata"].get("labels", {}).get("app.kubernetes.io/component")


def deployment_of(docs, role):
    return named(docs, "Deployment", f"tandem-{role}")


def main_container(deployment):
    return deployment["spec"]["template"]["spec"]["containers"][0]


def env_value(container, name):
    """A container's literal env value (None when absent or from a reference)."""
    for e in container.get("env", []):
        if e["name"] == name:
            return e.get("value")
    return None


def flag_value(args, flag, default=None):
    """The value of `--flag=V` or `--flag V` in a container's args."""
    for i, a in enumerate(args):
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
        if a == f"--{flag}" and i + 1 < len(args):
            return args[i + 1]
    return default


def run_tests(tests):
    """Runs each test function, prints PASS/FAIL with the failure's message, and returns the exit
    status (0 when all passed). The closing line is 'N passed, N failed' for CI's reader."""
    failed = 0
    for test in tests:
        try:
            test()
            print(f"PASS {test.__name__}", flush=True)
        except Exception as e:  # one test's failure must not hide the others'
            failed += 1
            print(f"FAIL {test.__name__}: {type(e).__name__}: {e}", flush=True)
    print(f"{len(tests) - failed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


def exit_skip(why):
    print("SKIP:", why, flush=True)
    sys.exit(SKIP)
