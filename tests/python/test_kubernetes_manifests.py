#!/usr/bin/env python3
"""Static checks of deploy/kubernetes: every overlay renders with `kubectl kustomize`; the output
passes `kubernetes-validate --strict` for KUBERNETES_VERSION (the version the README names) and
yamllint; the custom resources (ServiceMonitor, PodMonitor, PrometheusRule, ScaledObject) validate
against the upstream CRD schemas kept in deploy/kubernetes/schemas; and the properties an operator
relies on hold, each its own test with a message that names what is wrong: probes on ports that
exist, grace periods that cover preStop and drain, rollouts and PDBs that never remove the last
decode instance, GPU pools, the NetworkPolicy, the config accepted by `tandem check-config` with
the ports the manifests expose, live-reload mounts, the scrape config. Exit 0 = pass (77: no
kubectl)."""
import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile

import jsonschema
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_util  # noqa: E402
from k8s_util import (OVERLAYS, KUBERNETES, SOURCE, component, deployment_of,  # noqa: E402
                      env_value, flag_value, main_container, named, of_kind)

KUBERNETES_VERSION = "1.32.0"   # README "Kubernetes" names it
BINARY = os.environ.get("TANDEM_BINARY", os.path.join(SOURCE, "build", "tandem"))
ROLES = ("router", "prefill", "decode")
INSTANCE_ROLES = ("prefill", "decode")
DRAIN_DEFAULT_S = 30   # common/serving/role_main.cc: --drain-timeout-s default (every role)
GRACE_MARGIN_S = 10
CRD_KINDS = {
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
    "ScaledObject": "keda.sh_scaledobjects.yaml",
}

RENDERED = {}   # overlay -> (text, docs)


def docs_of(overlay):
    return RENDERED[overlay][1]


def all_docs():
    return [(overlay, d) for overlay in OVERLAYS for d in docs_of(overlay)]


# --- rendering and schemas ------------------------------------------------------------------

def test_every_overlay_renders():
    for overlay in OVERLAYS:
        try:
            RENDERED[overlay] = k8s_util.render(overlay)
        except subprocess.CalledProcessError as e:
            raise AssertionError(f"overlays/{overlay} does not render: {e.stderr}")
        kinds = {d["kind"] for d in docs_of(overlay)}
        for kind in ("Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget",
                     "NetworkPolicy"):
            assert kind in kinds, f"overlays/{overlay} renders no {kind}"


def test_kubernetes_validate_strict():
    for overlay in OVERLAYS:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(RENDERED[overlay][0])
            f.flush()
            out = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict",
                                  "-k", KUBERNETES_VERSION, f.name],
                                 capture_output=True, text=True, timeout=300)
        text = out.stdout + out.stderr
        # Custom resources have no built-in schema: they are checked against the CRDs below.
        unknown = set(re.findall(r"Couldn't find schema for kind (\w+)", text))
        errors = [line for line in text.splitlines() if not line.startswith(("INFO", "WARN"))]
        assert out.returncode == 0 and not errors, \
            f"overlays/{overlay} fails kubernetes-validate --strict {KUBERNETES_VERSION}:\n" \
            + "\n".join(errors)
        assert unknown <= set(CRD_KINDS), \
            f"overlays/{overlay}: kinds without any schema check: " \
            f"{sorted(unknown - set(CRD_KINDS))}"


def test_yamllint():
    config = os.path.join(SOURCE, ".yamllint")
    for overlay in OVERLAYS:
        # Less the Grafana dashboard's ConfigMap: its data is JSON with long lines (PromQL,
        # descriptions), not YAML anyone writes; tests/python/test_grafana_dashboard.py lints it.
        text = "\n---\n".join(d for d in RENDERED[overlay][0].split("\n---\n")
                               if 'grafana_dashboard: "1"' not in d)
        out = subprocess.run([sys.executable, "-m", "yamllint", "-s", "-c", config, "-"],
                             input=text, capture_output=True, text=True)
        assert out.returncode == 0, f"rendered overlays/{overlay} fails yamllint:\n{out.stdout}"
    # From the repository root, so that .yamllint's ignore patterns (upstream CRDs) apply.
    out = subprocess.run([sys.executable, "-m", "yamllint", "-s", "-c", config, "deploy"],
                         capture_output=True, text=True, cwd=SOURCE)
    assert out.returncode == 0, f"deploy/ fails yamllint:\n{out.stdout}"


def strict_schema(schema):
    """An openAPIV3Schema as Kubernetes applies it to a structural CRD, for jsonschema: fields it
    does not name are pruned there (silently: a typo'd field is lost), refused here."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(schema)
    # metadata is ObjectMeta, checked by the API server, not the CRD.
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def crd_validator(kind):
    with open(os.path.join(KUBERNETES, "schemas", CRD_KINDS[kind])) as f:
        crd = yaml.safe_load(f)
    assert crd["spec"]["names"]["kind"] == kind
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    return (f'{crd["spec"]["group"]}/{version["name"]}',
            jsonschema.Draft7Validator(strict_schema(version["schema"]["openAPIV3Schema"])))


def test_custom_resources_match_upstream_crds():
    seen = set()
    for kind in CRD_KINDS:
        api_version, validator = crd_validator(kind)
        for overlay, doc in all_docs():
            if doc["kind"] != kind:
                continue
            seen.add(kind)
            assert doc["apiVersion"] == api_version, \
                f"{overlay}: {kind} {doc['metadata']['name']} is {doc['apiVersion']}, the CRD " \
                f"serves {api_version}"
            errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                      for e in validator.iter_errors(doc)]
            assert not errors, f"{overlay}: {kind} {doc['metadata']['name']}: {errors}"
        # The check must be able to fail: a misspelt field is refused.
        assert not validator.is_valid({"apiVersion": api_version, "kind": kind,
                                       "metadata": {"name": "x"}, "spec": {"selectr": {}}}), \
            f"the {kind} schema accepts an unknown field: strictness is lost"
    assert seen == set(CRD_KINDS), f"no overlay renders {sorted(set(CRD_KINDS) - seen)}"


def test_prometheusrule_carries_the_rules_file():
    script = os.path.join(KUBERNETES, "make-prometheusrule.py")
    out = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    with open(os.path.join(SOURCE, "deploy", "prometheus", "tandem-rules.yaml")) as f:
        groups = yaml.safe_load(f)["groups"]
    rules = of_kind(docs_of("gpu"), "PrometheusRule")
    assert len(rules) == 1, f"the gpu overlay renders {len(rules)} PrometheusRules, expected 1"
    assert rules[0]["spec"]["groups"] == groups, \
        "the PrometheusRule's spec.groups differ from deploy/prometheus/tandem-rules.yaml"


def test_grafana_dashboard_configmap():
    """The monitoring component ships deploy/grafana/tandem-dashboard.json, unchanged, as a
    ConfigMap that Grafana's dashboard sidecar loads (label grafana_dashboard: "1")."""
    with open(os.path.join(SOURCE, "deploy", "grafana", "tandem-dashboard.json")) as f:
        dashboard = f.read()
    seen = False
    for overlay in OVERLAYS:
        maps = [c for c in of_kind(docs_of(overlay), "ConfigMap")
                if c["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
        if of_kind(docs_of(overlay), "PrometheusRule"):   # the monitoring component
            assert len(maps) == 1, \
                f"{overlay}: {len(maps)} ConfigMaps labelled grafana_dashboard, expected 1"
            assert maps[0]["data"].get("tandem-dashboard.json") == dashboard, \
                f"{overlay}: the dashboard ConfigMap differs from deploy/grafana/" \
                "tandem-dashboard.json: cp it to deploy/kubernetes/components/monitoring/"
            seen = True
    assert seen, "no overlay renders the Grafana dashboard ConfigMap"


# --- what an operator relies on --------------------------------------------------------------

def container_ports(container):
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def test_probes_point_at_container_ports():
    for overlay, dep in all_docs():
        if dep["kind"] != "Deployment":
            continue
        c = main_container(dep)
        ports = container_ports(c)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe in c, f"{overlay}: {dep['metadata']['name']} has no {probe}"
            port = c[probe]["httpGet"]["port"]
            assert port in ports or port in ports.values(), \
                f"{overlay}: {dep['metadata']['name']} {probe} uses port {port!r}, but the " \
                f"container exposes {ports}"


def test_startup_probe_outlasts_a_model_load():
    for overlay, dep in all_docs():
        if dep["kind"] != "Deployment" or component(dep) not in INSTANCE_ROLES:
            continue
        p = main_container(dep)["startupProbe"]
        budget = p.get("periodSeconds", 10) * p.get("failureThreshold", 3)
        assert budget >= 600, \
            f"{overlay}: {dep['metadata']['name']}'s startupProbe gives a loading model only " \
            f"{budget} s before liveness counts (want >= 600)"


def drain_seconds(dep):
    return float(flag_value(main_container(dep)["args"], "drain-timeout-s", DRAIN_DEFAULT_S))


def test_grace_period_covers_prestop_and_drain():
    for overlay, dep in all_docs():
        if dep["kind"] != "Deployment":
            continue
        spec = dep["spec"]["template"]["spec"]
        pre_stop = main_container(dep).get("lifecycle", {}).get("preStop", {})
        sleep = pre_stop.get("sleep", {}).get("seconds", 0)
        need = sleep + drain_seconds(dep) + GRACE_MARGIN_S
        grace = spec.get("terminationGracePeriodSeconds", 30)
        assert grace >= need, \
            f"{overlay}: {dep['metadata']['name']}: terminationGracePeriodSeconds {grace} < " \
            f"preStop {sleep} + drain {drain_seconds(dep)} + margin {GRACE_MARGIN_S}: the " \
            f"drain would be killed"


def test_rollout_never_removes_the_last_decode_instance():
    for overlay in OVERLAYS:
        docs = docs_of(overlay)
        for role in ROLES:
            strategy = deployment_of(docs, role)["spec"]["strategy"]
            assert strategy["type"] == "RollingUpdate", f"{overlay}: {role} is not RollingUpdate"
            unavailable = strategy["rollingUpdate"]["maxUnavailable"]
            assert unavailable in (0, "0", "0%"), \
                f"{overlay}: tandem-{role} rollout maxUnavailable is {unavailable}, must be 0"
            pdbs = [p for p in of_kind(docs, "PodDisruptionBudget")
                    if p["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/component")
                    == role]
            assert len(pdbs) == 1 and pdbs[0]["spec"].get("minAvailable", 0) >= 1, \
                f"{overlay}: no PodDisruptionBudget keeps one {role} pod through a node drain"
            pdb_sel = pdbs[0]["spec"]["selector"]["matchLabels"]
            pod_labels = deployment_of(docs, role)["spec"]["template"]["metadata"]["labels"]
            assert pdb_sel.items() <= pod_labels.items(), \
                f"{overlay}: the {role} PDB selects {pdb_sel}, not the pods ({pod_labels})"


def test_gpu_overlay_uses_distinct_gpu_pools():
    docs = docs_of("gpu")
    pools = {}
    for role in INSTANCE_ROLES:
        dep = deployment_of(docs, role)
        spec = dep["spec"]["template"]["spec"]
        c = main_container(dep)
        for part in ("requests", "limits"):
            gpus = int(c["resources"].get(part, {}).get("nvidia.com/gpu", 0))
            assert gpus >= 1, f"gpu: tandem-{role} {part} no nvidia.com/gpu"
        assert spec.get("nodeSelector"), f"gpu: tandem-{role} has no nodeSelector"
        pools[role] = spec["nodeSelector"]
        tolerated = {(t.get("key"), t.get("value")) for t in spec.get("tolerations", [])}
        assert any(k == "nvidia.com/gpu" for k, _ in tolerated), \
            f"gpu: tandem-{role} does not tolerate the nvidia.com/gpu taint"
        for key, value in spec["nodeSelector"].items():
            assert (key, value) in tolerated, \
                f"gpu: tandem-{role} selects {key}={value} but does not tolerate its taint"
        shm = [v for v in spec["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert any(mounts.get(v["name"]) == "/dev/shm" for v in shm), \
            f"gpu: tandem-{role} has no memory-backed /dev/shm"
    assert pools["prefill"] != pools["decode"], \
        f"gpu: prefill and decode select the same node pool {pools['prefill']}"
    for role in ROLES:
        image = main_container(deployment_of(docs, role))["image"]
        assert "cuda" in image.split(":")[-1], f"gpu: tandem-{role} runs {image}, not the GPU image"


def ucx_ports(container):
    value = env_value(container, "UCX_TCP_PORT_RANGE")
    assert value and "-" in value, "an instance has no UCX_TCP_PORT_RANGE: its KV ports are " \
                                   "ephemeral and no NetworkPolicy can name them"
    lo, hi = map(int, value.split("-"))
    return lo, hi


def selects(selector, labels):
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        have = e["key"] in labels and (e["operator"] != "In" or labels[e["key"]] in e["values"])
        if e["operator"] in ("In", "Exists") and not have:
            return False
        if e["operator"] == "NotIn" and labels.get(e["key"]) in e["values"]:
            return False
    return True


def rule_allows(rule, port):
    ports = rule.get("ports")
    if not ports:
        return True
    return any(p.get("port") == port or (p.get("endPort") and p["port"] <= port <= p["endPort"])
               for p in ports)


def test_networkpolicy_covers_every_internal_port():
    for overlay in OVERLAYS:
        docs = docs_of(overlay)
        policies = of_kind(docs, "NetworkPolicy")
        tandem_pod = deployment_of(docs, "router")["spec"]["template"]["metadata"]["labels"]
        for role in ROLES:
            dep = deployment_of(docs, role)
            labels = dep["spec"]["template"]["metadata"]["labels"]
            mine = [p for p in policies if selects(p["spec"]["podSelector"], labels)
                    and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
            assert mine, f"{overlay}: no NetworkPolicy selects the {role} pods: all ports open"
            rules = [r for p in mine for r in p["spec"].get("ingress", [])]
            c = main_container(dep)
            if role == "router":
                http = container_ports(c)["http"]
                assert any(rule_allows(r, http) and not r.get("from") for r in rules), \
                    f"{overlay}: the router's port {http} is not open to clients"
                continue
            lo, hi = ucx_ports(c)
            internal = list(container_ports(c).values()) + [lo, hi]
            for port in internal:
                from_tandem = [r for r in rules if rule_allows(r, port) and any(
                    "podSelector" in f and "namespaceSelector" not in f
                    and selects(f["podSelector"], tandem_pod) for f in r.get("from", []))]
                assert from_tandem, \
                    f"{overlay}: {role} port {port} is not open to the other Tandem pods"
                open_to_all = [r for r in rules if rule_allows(r, port) and not r.get("from")]
                assert not open_to_all, \
                    f"{overlay}: {role} internal port {port} is open to everyone"


# What a build without the CUDA backend refuses in a GPU config, and the flags that move it to
# the CPU so that the rest of the config is still checked (tests/gpu/without_gpu.sh checks the
# GPU overlay's config, unchanged, with the CUDA build).
NEEDS_CUDA = ("cannot be served by this build", "needs a build with CUDA")
ON_CPU = ["--prefill.device=cpu", "--decode.device=cpu", "--transfer.backend=ucx"]


def effective_config(overlay, config_text, tmp):
    path = os.path.join(tmp, f"{overlay}-cluster.yaml")
    with open(path, "w") as f:
        f.write(config_text)
    env = dict(os.environ, TANDEM_CLUSTER_SECRET="x" * 32)

    def check(*flags):
        return subprocess.run([BINARY, "check-config", path, *flags], capture_output=True,
                              text=True, timeout=120, env=env)

    out = check()
    refused = [line for line in out.stderr.splitlines() if re.match(r"^\S+:\d+:\d+: ", line)]
    if out.returncode != 0 and refused and all(any(n in line for n in NEEDS_CUDA)
                                               for line in refused):
        out = check(*ON_CPU)   # a CPU build: only the GPU parts were refused
    assert out.returncode == 0, \
        f"{overlay}: `tandem check-config` refuses the ConfigMap's cluster.yaml:\n{out.stderr}"
    return yaml.safe_load(out.stdout)


def test_gpu_overlay_serves_on_the_gpus_and_moves_kv_over_nccl():
    """The gpu overlay's pods compute on their GPU and move the KV with NCCL; NCCL's ports (the
    kernel picks them) are open between the instance pods and to nobody else."""
    docs = docs_of("gpu")
    config = yaml.safe_load(next(c["data"]["cluster.yaml"] for c in of_kind(docs, "ConfigMap")
                                 if "cluster.yaml" in c["data"]))
    for role in INSTANCE_ROLES:
        assert config[role].get("device") == "cuda", \
            f"gpu: {role}.device is {config[role].get('device')!r}: the pods' GPUs sit idle"
    assert config["transfer"]["backend"] == "nccl", \
        f"gpu: transfer.backend {config['transfer']['backend']!r} cannot move KV between GPU pods"
    policies = of_kind(docs, "NetworkPolicy")
    for role in INSTANCE_ROLES:
        labels = deployment_of(docs, role)["spec"]["template"]["metadata"]["labels"]
        rules = [r for p in policies if selects(p["spec"]["podSelector"], labels)
                 for r in p["spec"].get("ingress", [])]
        for port in (32768, 45000, 60999):   # the kernel's default ephemeral range
            peers = [r for r in rules if rule_allows(r, port)]
            assert peers, f"gpu: {role} port {port} (NCCL) is closed to the other instances"
            assert all(r.get("from") for r in peers), f"gpu: {role} port {port} is open to all"
        router = deployment_of(docs, "router")["spec"]["template"]["metadata"]["labels"]
        assert not any(rule_allows(r, 45000) and any(
            "podSelector" in f and selects(f["podSelector"], router) for f in r.get("from", []))
            for r in rules), f"gpu: NCCL's ports on {role} are open to the router"


def test_config_accepted_by_tandem_and_ports_match():
    assert os.access(BINARY, os.X_OK), f"no tandem binary at {BINARY}"
    with tempfile.TemporaryDirectory() as tmp:
        for overlay in OVERLAYS:
            docs = docs_of(overlay)
            maps = {c["metadata"]["name"]: c["data"]["cluster.yaml"]
                    for c in of_kind(docs, "ConfigMap") if "cluster.yaml" in c["data"]}
            assert len(set(maps.values())) == 1, \
                f"{overlay}: the router's and the instances' ConfigMaps differ"
            config = effective_config(overlay, next(iter(maps.values())), tmp)
            router = container_ports(main_container(deployment_of(docs, "router")))
            assert router.get("http") == config["router"]["port"], \
                f"{overlay}: router.port {config['router']['port']} is not the router's " \
                f"containerPort {router}"
            for role in ROLES:
                mounts = [m["mountPath"] for m in
                          main_container(deployment_of(docs, role))["volumeMounts"]]
                assert config["model"]["path"] in mounts, \
                    f"{overlay}: model.path {config['model']['path']} is not a volume of " \
                    f"tandem-{role} (mounts: {mounts})"
            for role in INSTANCE_ROLES:
                section = config[role]
                ports = container_ports(main_container(deployment_of(docs, role)))
                assert ports.get("control") == section["port"], \
                    f"{overlay}: {role}.port {section['port']} != containerPort {ports}"
                assert ports.get("metrics") == section["metrics_port"], \
                    f"{overlay}: {role}.metrics_port {section['metrics_port']} != {ports}"
                name, port = section["dns_name"].rsplit(":", 1)
                service = named(docs, "Service", name)
                assert service["spec"].get("clusterIP") == "None", \
                    f"{overlay}: {role}.dns_name names {name}, which is not headless"
                assert int(port) in [p["port"] for p in service["spec"]["ports"]] \
                    and int(port) == section["port"], \
                    f"{overlay}: {role}.dns_name port {port} is not {name}'s control port"


def test_config_mounts_reload_and_roll():
    for overlay in OVERLAYS:
        docs = docs_of(overlay)
        for role in ROLES:
            dep = deployment_of(docs, role)
            spec = dep["spec"]["template"]["spec"]
            c = main_container(dep)
            config_path = flag_value(c["args"], "config")
            mount = [m for m in c["volumeMounts"] if config_path.startswith(m["mountPath"] + "/")]
            assert len(mount) == 1, f"{overlay}: {role}'s --config {config_path} is not mounted"
            assert "subPath" not in mount[0], \
                f"{overlay}: {role} mounts its config with subPath: kubelet never updates it"
            volume = next(v for v in spec["volumes"] if v["name"] == mount[0]["name"])
            name = volume["configMap"]["name"]
            if role == "router":
                assert name == "tandem-router-config", \
                    f"{overlay}: the router's ConfigMap is {name}: a hashed name would roll the " \
                    f"router instead of reloading its SLOs"
            else:
                assert re.fullmatch(r"tandem-config-[a-z0-9]{10}", name), \
                    f"{overlay}: {role}'s ConfigMap {name} has no name hash: a change would not " \
                    f"roll the pods"


def test_pods_are_locked_down():
    for overlay, dep in all_docs():
        if dep["kind"] != "Deployment":
            continue
        spec = dep["spec"]["template"]["spec"]
        name = dep["metadata"]["name"]
        assert spec["securityContext"].get("runAsNonRoot") is True, \
            f"{overlay}: {name} may run as root"
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c.get("securityContext", {})
            assert sc.get("readOnlyRootFilesystem") is True, \
                f"{overlay}: {name}/{c['name']} has a writable root filesystem"
            assert sc.get("allowPrivilegeEscalation") is False, \
                f"{overlay}: {name}/{c['name']} allows privilege escalation"
            assert c["command"] == ["/usr/local/bin/tandem"], \
                f"{overlay}: {name}/{c['name']} runs {c['command']}, not /usr/local/bin/tandem " \
                f"(the image's path)"
            assert "memory" in c.get("resources", {}).get("limits", {}), \
                f"{overlay}: {name}/{c['name']} has no memory limit"
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert "/tmp" in mounts, f"{overlay}: {name}/{c['name']} has no writable /tmp"
            for key in ("app.kubernetes.io/name", "app.kubernetes.io/component",
                        "app.kubernetes.io/part-of"):
                assert key in dep["spec"]["template"]["metadata"]["labels"], \
                    f"{overlay}: {name}'s pods lack the label {key}"


def test_scaledobjects_follow_the_recommended_replicas():
    docs = docs_of("gpu")
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in of_kind(docs, "ScaledObject")}
    for role in INSTANCE_ROLES:
        dep = deployment_of(docs, role)
        s = scaled.get(dep["metadata"]["name"])
        assert s, f"gpu: no ScaledObject scales tandem-{role}"
        assert s["spec"]["minReplicaCount"] == 1, f"gpu: tandem-{role} may scale below 1"
        queries = [t["metadata"]["query"] for t in s["spec"]["triggers"]
                   if t["type"] == "prometheus"]
        assert queries and all(f'tandem_recommended_replicas{{role="{role}"}}' in q
                               for q in queries), \
            f"gpu: tandem-{role} does not scale on tandem_recommended_replicas{{role=\"{role}\"}}"
        assert "replicas" not in dep["spec"], \
            f"gpu: tandem-{role} sets replicas, which every apply resets under the autoscaler"


def relabel_keeps(config, pod_labels, port_name):
    """Whether the scrape config's relabel rules keep a pod target (phase Running)."""
    meta = {"__meta_kubernetes_pod_container_port_name": port_name,
            "__meta_kubernetes_pod_phase": "Running"}
    for k, v in pod_labels.items():
        meta["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k)] = v
    for rule in config["relabel_configs"]:
        action = rule.get("action", "replace")
        if action not in ("keep", "drop"):
            continue
        value = rule.get("separator", ";").join(meta.get(s, "") for s in rule["source_labels"])
        match = re.fullmatch(rule["regex"], value) is not None
        if (action == "keep") != match:
            return False
    return True


def test_prometheus_scrape_config_finds_every_metrics_port():
    path = os.path.join(SOURCE, "deploy", "prometheus", "prometheus.yml")
    with open(path) as f:
        config = yaml.safe_load(f)
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "tandem")
    for role in ROLES:
        dep = deployment_of(docs_of("cpu"), role)
        c = main_container(dep)
        labels = dep["spec"]["template"]["metadata"]["labels"]
        metrics_port = c["livenessProbe"]["httpGet"]["port"] if role != "router" else "http"
        kept = [p["name"] for p in c["ports"] if relabel_keeps(job, labels, p["name"])]
        assert kept == [metrics_port], \
            f"prometheus.yml scrapes {kept} of the {role} pods, want [{metrics_port}]"
    # The rest of the file through promtool (Debian's promtool has no Kubernetes discovery, so
    # that part is swapped for a static target).
    promtool = shutil.which("promtool")
    if promtool:
        job["kubernetes_sd_configs"] = None
        del job["kubernetes_sd_configs"]
        job["static_configs"] = [{"targets": ["127.0.0.1:9000"]}]
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(os.path.join(os.path.dirname(path), "tandem-rules.yaml"), tmp)
            check = os.path.join(tmp, "prometheus.yml")
            with open(check, "w") as f:
                yaml.safe_dump(config, f)
            out = subprocess.run([promtool, "check", "config", check], capture_output=True,
                                 text=True)
            assert out.returncode == 0, f"promtool check config:\n{out.stdout}{out.stderr}"


# A GPU latency model for `tandem plan` (two shapes; made up: the test checks the overlay carries
# whatever the plan chose, not the numbers).
PLAN_LATENCY_MODEL = """latency_model:
  - {model: m, device: h100, tensor_parallel: 1, prefill: {c1: 0.01, c2: 0.0001, c3: 0},
     decode: {c4: 0.02, c5: 0.001, c6: 0}, kv_bytes_per_token: 100000}
  - {model: m, device: h100, tensor_parallel: 2, prefill: {c1: 0.01, c2: 0.00004, c3: 0},
     decode: {c4: 0.015, c5: 0.0008, c6: 0}, kv_bytes_per_token: 100000}
"""


def test_plan_writes_an_overlay_that_renders_the_plan():
    """`tandem plan --kustomize-out` writes an overlay over the gpu one: it renders, passes
    kubernetes-validate --strict and the CRD schemas, and carries the plan's counts (replicas and
    the autoscalers' floor), GPUs per instance and shapes."""
    assert os.access(BINARY, os.X_OK), f"no tandem binary at {BINARY}"
    with tempfile.TemporaryDirectory(prefix="tandem-plan-") as tmp:
        tree = os.path.join(tmp, "kubernetes")
        shutil.copytree(KUBERNETES, tree, ignore=shutil.ignore_patterns("secrets"))
        shutil.copytree(os.path.join(tree, "example-secrets"),
                        os.path.join(tree, "overlays", "gpu", "secrets"))
        lm = os.path.join(tmp, "lm.yaml")
        with open(lm, "w") as f:
            f.write(PLAN_LATENCY_MODEL)
        overlay = os.path.join(tree, "overlays", "planned")
        out = subprocess.run([BINARY, "plan", "--latency-model", lm, "--workload", "chatbot",
                              "--slo-ttft", "0.5", "--slo-tpot", "0.1", "--gpus", "8",
                              "--num-requests", "100", "--out", os.path.join(tmp, "plan.yaml"),
                              "--kustomize-out", overlay],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"tandem plan failed:\n{out.stdout}{out.stderr}"
        with open(os.path.join(tmp, "plan.yaml")) as f:
            plan = yaml.safe_load(f)
        rendered = subprocess.run([k8s_util.kubectl(), "kustomize", overlay],
                                  capture_output=True, text=True, timeout=120)
        assert rendered.returncode == 0, f"the plan's overlay does not render:\n{rendered.stderr}"
        rendered_path = os.path.join(tmp, "rendered.yaml")
        with open(rendered_path, "w") as f:
            f.write(rendered.stdout)
        valid = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k",
                                KUBERNETES_VERSION, rendered_path],
                               capture_output=True, text=True, timeout=300)
        errors = [line for line in (valid.stdout + valid.stderr).splitlines()
                  if not line.startswith(("INFO", "WARN"))]
        assert valid.returncode == 0 and not errors, \
            "the plan's overlay fails kubernetes-validate --strict:\n" + "\n".join(errors)
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    for kind in ("ScaledObject",):
        _, validator = crd_validator(kind)
        for doc in of_kind(docs, kind):
            assert validator.is_valid(doc), f"the plan's {kind} {doc['metadata']['name']} " \
                f"fails its CRD schema"
    for role in INSTANCE_ROLES:
        section = plan[role]
        dep = deployment_of(docs, role)
        assert dep["spec"].get("replicas") == section["instances"], \
            f"tandem-{role} replicas {dep['spec'].get('replicas')}, the plan says " \
            f"{section['instances']}"
        scaled = named(docs, "ScaledObject", f"tandem-{role}")
        assert scaled["spec"]["minReplicaCount"] == section["instances"], \
            f"ScaledObject tandem-{role} floor is not the plan's {section['instances']}"
        c = main_container(dep)
        gpus = section["tensor_parallel"] * section["pipeline_parallel"]
        for bound in ("requests", "limits"):
            assert str(c["resources"][bound].get("nvidia.com/gpu")) == str(gpus), \
                f"tandem-{role} {bound} nvidia.com/gpu is not the plan's {gpus}"
        for key in ("tensor_parallel", "pipeline_parallel", "max_batch_size"):
            assert f"--{role}.{key}={section[key]}" in c["args"], \
                f"tandem-{role} args lack --{role}.{key}={section[key]}: {c['args']}"


TESTS = [
    test_every_overlay_renders,
    test_kubernetes_validate_strict,
    test_yamllint,
    test_custom_resources_match_upstream_crds,
    test_prometheusrule_carries_the_rules_file,
    test_grafana_dashboard_configmap,
    test_probes_point_at_container_ports,
    test_startup_probe_outlasts_a_model_load,
    test_grace_period_covers_prestop_and_drain,
    test_rollout_never_removes_the_last_decode_instance,
    test_gpu_overlay_uses_distinct_gpu_pools,
    test_gpu_overlay_serves_on_the_gpus_and_moves_kv_over_nccl,
    test_networkpolicy_covers_every_internal_port,
    test_config_accepted_by_tandem_and_ports_match,
    test_config_mounts_reload_and_roll,
    test_pods_are_locked_down,
    test_scaledobjects_follow_the_recommended_replicas,
    test_prometheus_scrape_config_finds_every_metrics_port,
    test_plan_writes_an_overlay_that_renders_the_plan,
]


def main():
    if not k8s_util.kubectl():
        k8s_util.exit_skip("no kubectl")
    try:
        test_every_overlay_renders()
    except AssertionError as e:
        print("FAIL test_every_overlay_renders:", e)
        print("0 passed, 1 failed")
        return 1
    return k8s_util.run_tests(TESTS)


if __name__ == "__main__":
    sys.exit(main())
