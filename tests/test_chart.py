"""The Helm chart (charts/trainjob-scheduling), rendered by the real Helm engine for the default
values and several combinations: lint (strict), the Kubernetes 1.37 schemas (strict), the
published CRD schemas of the prometheus-operator and cert-manager objects, and the properties a
first `helm install` depends on, checked on the parsed objects against the service's own code
(its flag parser, its webhook routes, its metric registry)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from collections.abc import Awaitable
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml
from celpy.adapter import json_to_cel

from tests import chart_crds
from tests.chart import BASE, CHART, NAMESPACE, RELEASE, Json, Rendered, lint, render
from tests.chart import render_error as refused
from tests.harness import fixture, fixture_cache, fixture_names
from tests.paths import REPO, SAMPLES, SHARED
from webhook.admission.handlers import guard_trainjob_review, validate_trainjob_review
from webhook.admission.review import Decision, parse
from webhook.admission.routes import WEBHOOKS
from webhook.backends.native_versions import VERSIONS as NATIVE_VERSIONS
from webhook.backends.registry import all_backends, default_backends
from webhook.cli import _SERVE_OPTIONS, build_parser
from webhook.core.defaults import GANG_LABEL
from webhook.core.snapshot import SNAPSHOT_ANNOTATION as SNAP
from webhook.kube.cache import Cache
from webhook.metrics.feasibility import FeasibilityCollector
from webhook.metrics.gangs import GangTracker
from webhook.metrics.registry import Metrics

K8S = "1.37.0"
THIRD_PARTY = SHARED / "reference" / "crds" / "third-party"
SECRET = f"{BASE}-cert"
SELF = f"system:serviceaccount:{NAMESPACE}:{BASE}"

COMBINATIONS: dict[str, Json] = {
    "default": {},
    "cert-manager": {"certManagement": "certManager"},
    "cert-manager-issuer": {
        "certManagement": "certManager",
        "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}},
    },
    "crds": {"crds": {"install": True}},
    "monitoring": {
        "monitoring": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "prometheusRule": {"enabled": True},
            "dashboard": {"enabled": True},
        },
        "metricsReader": {
            "subjects": [
                {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
            ]
        },
    },
    "monitoring-cert-manager": {
        "certManagement": "certManager",
        "monitoring": {
            "serviceMonitor": {"enabled": True, "tokenSecret": {"name": "scraper", "key": "token"}},
            "prometheusRule": {"enabled": True},
        },
    },
    "network-policy": {"networkPolicy": {"enabled": True}},
    "one-replica": {"replicaCount": 1},
    "extra-args": {
        "extraArgs": ["--max-body-bytes=8388608", "--log-level=debug"],
        "extraEnv": [{"name": "WEBHOOK_BODY_TIMEOUT", "value": "5"}],
        "serve": {"watchNamespaces": ["team-a", "team-b"], "workers": 8},
        "image": {"digest": "sha256:" + "ab" * 32},
        "podAnnotations": {"sidecar.istio.io/inject": "false"},
        "podLabels": {"team": "platform"},
        "priorityClassName": "system-cluster-critical",
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "cleanup": {"deleteWebhookConfigurations": False},
    },
}
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "Issuer", "Certificate"}
THIRD_PARTY_FILES = {
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
    "Issuer": "cert-manager.io_issuers.yaml",
    "Certificate": "cert-manager.io_certificates.yaml",
}


@pytest.fixture(scope="module", params=sorted(COMBINATIONS))
def combination(request: pytest.FixtureRequest) -> tuple[str, Rendered]:
    name: str = request.param
    return name, render(COMBINATIONS[name])


@pytest.fixture(scope="module")
def default() -> Rendered:
    return render()


@pytest.fixture(scope="module")
def cert_manager() -> Rendered:
    return render(COMBINATIONS["cert-manager"])


# --- the engine's own checks, and the schemas ---------------------------------------------------


@pytest.mark.parametrize("name", ["default", "cert-manager", "crds", "monitoring", "extra-args"])
def test_helm_lint_strict_finds_nothing(name: str) -> None:
    report = lint(COMBINATIONS[name])
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 1 is info (no icon)
    assert not problems and not report["errors"], report


def _strict(schema: Any) -> Any:
    """A CRD's openAPIV3Schema as JSON Schema, strict about unknown fields as the API server is
    under strict field validation (kubectl's default); int-or-string and nullable as it reads
    them."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    out.pop("nullable", None)
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def _crd_validator(kind: str, api_version: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((THIRD_PARTY / THIRD_PARTY_FILES[kind]).read_text())
    version = api_version.split("/")[1]
    served = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    assert served, f"{api_version} {kind} is not served by {THIRD_PARTY_FILES[kind]}"
    schema = _strict(served[0]["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: checked as for all kinds
    return jsonschema.Draft7Validator(schema)


def _metadata_errors(obj: Json) -> list[str]:
    """ObjectMeta of a custom object, checked with the Kubernetes schema (through a ConfigMap)."""
    probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
    try:
        kubernetes_validate.validate(probe, K8S, strict=True)
    except kubernetes_validate.ValidationError as err:
        return [f"{obj['kind']} metadata: {err.message}"]
    return []


def test_every_object_passes_its_published_schema(combination: tuple[str, Rendered]) -> None:
    name, rendered = combination
    errors: list[str] = []
    for obj in rendered.objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in CRD_KINDS:
            validator = _crd_validator(obj["kind"], obj["apiVersion"])
            errors += [f"{where}: {e.json_path}: {e.message}" for e in validator.iter_errors(obj)]
            errors += _metadata_errors(obj)
            continue
        try:
            kubernetes_validate.validate(obj, K8S, strict=True)
        except kubernetes_validate.ValidationError as err:
            errors.append(f"{where}: {err.message}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{where}: no Kubernetes {K8S} schema for {obj['apiVersion']}")
    assert not errors, f"{name}: {errors}"
    assert {o["kind"] for o in rendered.objects} & CRD_KINDS or name not in (
        "cert-manager",
        "monitoring",
    )


def test_the_schema_checks_are_strict(default: Rendered) -> None:
    """The checks above would see a misspelt field (negative controls)."""
    deployment = copy.deepcopy(default.deployment)
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S, strict=True)
    monitor = render(COMBINATIONS["monitoring"]).one("ServiceMonitor")
    broken = copy.deepcopy(monitor)
    broken["spec"]["endpoints"][0]["tlsConfig"]["servername"] = "x"
    assert list(_crd_validator("ServiceMonitor", monitor["apiVersion"]).iter_errors(broken))


# --- workloads ----------------------------------------------------------------------------------


def _pod_labels(r: Rendered) -> dict[str, str]:
    labels: dict[str, str] = r.deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def _selected(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def test_the_deployment_is_production_grade(default: Rendered) -> None:
    spec = default.deployment["spec"]
    pod = spec["template"]["spec"]
    labels = _pod_labels(default)
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert _selected(spec["selector"]["matchLabels"], labels)
    for key in ("name", "instance", "version", "managed-by", "component", "part-of"):
        assert f"app.kubernetes.io/{key}" in labels, key
    assert _selected(default.one("Service")["spec"]["selector"], labels)
    assert _selected(default.one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"], labels)
    assert default.one("PodDisruptionBudget")["spec"]["minAvailable"] == 1
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert _selected(anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"], labels)
    spread = pod["topologySpreadConstraints"][0]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["maxSkew"] == 1
    assert _selected(spread["labelSelector"]["matchLabels"], labels)
    # Restricted: non-root, read-only root filesystem, no capabilities, RuntimeDefault seccomp.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = default.container["securityContext"]
    assert c["readOnlyRootFilesystem"] is True and c["allowPrivilegeEscalation"] is False
    assert c["capabilities"] == {"drop": ["ALL"]} and c["privileged"] is False
    assert {m["mountPath"] for m in default.container["volumeMounts"]} == {"/tmp"}
    assert default.container["image"] == "trainjob-scheduling-webhook:0.1.0"  # appVersion
    resources = default.container["resources"]
    assert resources["requests"]["memory"] and resources["limits"]["memory"]
    env = {e["name"]: e for e in default.container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def _sizing_rule() -> dict[str, float]:
    """The sizing rule's figures, as docs/architecture/benchmarks.md ("Sizing") writes them:
    written there once, and the chart's template must compute what they say."""
    page = (REPO / "docs" / "architecture" / "benchmarks.md").read_text()
    section = page[page.index("## Sizing") :]

    def figure(row: str, unit: str) -> float:
        found = re.search(rf"^\| {row}[^|]* \| ([\d/]+) ?{unit} \|", section, re.M)
        assert found, row
        number = found[1]
        if "/" in number:
            top, bottom = number.split("/")
            return int(top) / int(bottom)
        return int(number)

    return {
        "base": figure("base", "MiB"),
        "running": figure(r"per running TrainJob \(`sizing.expectedTrainJobs`\)", "KiB"),
        "finished": figure(r"per finished TrainJob \(`sizing.expectedFinishedTrainJobs`\)", "KiB"),
        "foreign": figure(r"per other controller's .*`sizing.expectedForeignGangObjects`", "KiB"),
        "relist": figure("headroom for a relist", "MiB"),
        "churn": figure("headroom for churn", ""),
    }


def _by_the_rule(running: int, finished: int, foreign: int) -> tuple[str, str]:
    """(request, limit) as the doc's rule computes them, rounded up to whole MiB."""
    rule = _sizing_rule()
    cache = rule["running"] * running + rule["finished"] * finished + rule["foreign"] * foreign
    request = rule["base"] + -(-cache // 1024)
    limit = request + rule["relist"] + -(-(cache * rule["churn"]) // 1024)
    return f"{int(request)}Mi", f"{int(limit)}Mi"


@pytest.mark.parametrize(
    "sized", [None, (0, 0, 0), (1, 1, 1), (10_000, 70_000, 10_000), (123, 4_567, 89)]
)
def test_the_memory_follows_the_sizing_rule_the_docs_write(
    sized: tuple[int, int, int] | None,
) -> None:
    names = ("expectedTrainJobs", "expectedFinishedTrainJobs", "expectedForeignGangObjects")
    values = {"sizing": dict(zip(names, sized, strict=True))} if sized else {}
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["sizing"]
    counts = sized or tuple(defaults[n] for n in names)
    resources = render(values).container["resources"]
    request, limit = _by_the_rule(*counts)
    assert (resources["requests"]["memory"], resources["limits"]["memory"]) == (request, limit)
    assert (resources["requests"]["cpu"], resources["limits"]["cpu"]) == ("100m", "1")
    page = (REPO / "docs" / "architecture" / "benchmarks.md").read_text()
    if sized == (10_000, 70_000, 10_000):  # the page's worked example
        assert f"request {request[:-2]} Mi, limit {limit[:-2]} Mi" in page
    if sized is None:  # and its defaults
        assert f"give {request[:-2]} Mi and {limit[:-2]} Mi" in page


def test_memory_set_in_resources_wins_over_the_sizing() -> None:
    sized = {"sizing": {"expectedTrainJobs": 10_000}}
    both = render({**sized, "resources": {"requests": {"memory": "1Gi"},
                                          "limits": {"memory": "2Gi"}}})  # fmt: skip
    resources = both.container["resources"]
    assert (resources["requests"]["memory"], resources["limits"]["memory"]) == ("1Gi", "2Gi")
    one = render({**sized, "resources": {"limits": {"memory": "2Gi"}}}).container["resources"]
    assert one["limits"]["memory"] == "2Gi"
    assert one["requests"]["memory"] == _by_the_rule(10_000, 20_000, 2_000)[0]
    assert "at '/sizing/expectedTrainJobs'" in refused({"sizing": {"expectedTrainJobs": -1}})


def test_the_optional_pod_settings_are_rendered() -> None:
    r = render(COMBINATIONS["extra-args"])
    pod = r.deployment["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert pod["metadata"]["labels"]["team"] == "platform"
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["spec"]["tolerations"][0]["key"] == "dedicated"
    assert r.container["image"] == "trainjob-scheduling-webhook@sha256:" + "ab" * 32
    assert {"name": "WEBHOOK_BODY_TIMEOUT", "value": "5"} in r.container["env"]
    assert r.args[-2:] == ["--max-body-bytes=8388608", "--log-level=debug"]  # last: they win
    pulled = render({"imagePullSecrets": [{"name": "regcred"}], "image": {"tag": "v9"}})
    assert pulled.deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [
        {"name": "regcred"}
    ]
    assert pulled.container["image"] == "trainjob-scheduling-webhook:v9"
    for pod_spec in [p["spec"] for p in pulled.kinds("Pod")]:
        assert pod_spec["imagePullSecrets"] == [{"name": "regcred"}]
    single = render(COMBINATIONS["one-replica"])
    assert single.deployment["spec"]["replicas"] == 1
    assert not single.kinds("PodDisruptionBudget")  # minAvailable 1 of 1 would block drains
    assert single.flag("--leader-elect") == "true"


def test_probes_and_ports_agree_with_the_flags(default: Rendered) -> None:
    ports = {p["name"]: p["containerPort"] for p in default.container["ports"]}
    assert ports == {
        "webhook": int(default.flag("--port") or 0),
        "metrics": int(default.flag("--metrics-port") or 0),
        "probes": int(default.flag("--health-port") or 0),
    }
    c = default.container
    assert (c["readinessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["port"]) == (
        "/readyz",
        "probes",
    )
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    service = {p["name"]: p for p in default.one("Service")["spec"]["ports"]}
    assert service["https-webhook"]["port"] == 443
    assert service["https-webhook"]["targetPort"] == "webhook"
    assert service["https-metrics"]["targetPort"] == "metrics"
    # The hook and test pods are as restricted as the service's.
    pods = [
        default.deployment["spec"]["template"]["spec"],
        *(p["spec"] for p in default.kinds("Pod")),
    ]
    pods += [j["spec"]["template"]["spec"] for j in default.kinds("Job")]
    assert len(pods) == 4
    for pod in pods:
        assert (
            pod["securityContext"]
            == default.deployment["spec"]["template"]["spec"]["securityContext"]
        )
        for container in pod["containers"]:
            assert container["securityContext"] == c["securityContext"]


def test_the_grace_period_outlasts_the_shutdown(combination: tuple[str, Rendered]) -> None:
    _, r = combination
    grace = r.deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    delay, timeout = (
        float(r.flag("--shutdown-delay") or 0),
        float(r.flag("--shutdown-timeout") or 0),
    )
    assert delay >= 3, "the pod must leave the endpoints before the listener closes"
    assert grace > delay + timeout


def test_every_rendered_flag_is_a_real_serve_flag(combination: tuple[str, Rendered]) -> None:
    """Parsed by the service's own parser: an unknown flag or a bad value exits 2."""
    name, r = combination
    known = {flag for flag, *_ in _SERVE_OPTIONS}
    for arg in r.args:
        assert arg.split("=", 1)[0] in known, f"{name}: {arg} is not a serve flag"
    args = build_parser().parse_args(["serve", *r.args])
    assert args.namespace == NAMESPACE
    assert args.leader_elect is True and args.metrics_auth is True
    if name == "extra-args":
        assert args.max_body_bytes == 8388608 and args.log_level == "debug"
        assert args.watch_namespaces == ("team-a", "team-b") and args.workers == 8


def test_self_managed_names_agree_between_the_objects_and_the_flags(default: Rendered) -> None:
    args = build_parser().parse_args(["serve", *default.args])
    assert args.cert_management == "self"
    assert args.cert_secret_name == SECRET and args.cert_secret_namespace == NAMESPACE
    assert args.webhook_service_name == default.one("Service")["metadata"]["name"] == BASE
    assert (
        args.mutating_webhook_configuration
        == default.one("MutatingWebhookConfiguration")["metadata"]["name"]
    )
    assert (
        args.validating_webhook_configuration
        == default.one("ValidatingWebhookConfiguration")["metadata"]["name"]
    )
    assert args.lease_name == BASE
    role = default.one("Role")
    named = {(r["resources"][0], n) for r in role["rules"] for n in r.get("resourceNames", [])}
    assert named == {("leases", args.lease_name), ("secrets", args.cert_secret_name)}
    cluster = default.one("ClusterRole", BASE)
    configs = [r for r in cluster["rules"] if r.get("resourceNames")]
    assert configs[0]["resourceNames"] == [args.mutating_webhook_configuration]
    assert args.mutating_webhook_configuration == args.validating_webhook_configuration
    # The helm test pods and the ServiceMonitor trust the CA in that Secret.
    for pod in default.kinds("Pod"):
        assert pod["spec"]["volumes"][0]["secret"]["secretName"] == args.cert_secret_name
    # No Secret is rendered: the service makes it (Helm would fight its contents otherwise).
    assert not default.kinds("Secret")


def test_cert_manager_mode(cert_manager: Rendered) -> None:
    args = build_parser().parse_args(["serve", *cert_manager.args])
    assert (args.cert_management, args.cert_dir) == ("files", "/certs")
    mounts = {m["mountPath"]: m for m in cert_manager.container["volumeMounts"]}
    assert mounts["/certs"]["readOnly"] is True
    volumes = {v["name"]: v for v in cert_manager.deployment["spec"]["template"]["spec"]["volumes"]}
    certificate = cert_manager.one("Certificate", BASE)
    assert volumes["certs"]["secret"]["secretName"] == certificate["spec"]["secretName"] == SECRET
    assert certificate["spec"]["dnsNames"] == [
        f"{BASE}.{NAMESPACE}.svc",
        f"{BASE}.{NAMESPACE}.svc.cluster.local",
    ]
    # The serving certificate comes from a CA Issuer, so its renewals keep the trusted CA.
    ca_issuer = cert_manager.one("Issuer", certificate["spec"]["issuerRef"]["name"])
    ca = cert_manager.one("Certificate", f"{BASE}-ca")
    assert ca_issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"] and ca["spec"]["isCA"]
    assert cert_manager.one("Issuer", ca["spec"]["issuerRef"]["name"])["spec"] == {"selfSigned": {}}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = cert_manager.one(kind)
        inject = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert inject == f"{NAMESPACE}/{certificate['metadata']['name']}"
    rules = [
        r for o in cert_manager.release if o["kind"] in ("ClusterRole", "Role") for r in o["rules"]
    ]
    assert not [
        r
        for r in rules
        if set(r.get("resources", [])) & {"secrets", "mutatingwebhookconfigurations"}
    ]
    external = render(COMBINATIONS["cert-manager-issuer"])
    assert [c["metadata"]["name"] for c in external.kinds("Certificate")] == [BASE]
    assert not external.kinds("Issuer")
    assert external.one("Certificate")["spec"]["issuerRef"]["kind"] == "ClusterIssuer"


# --- webhook configurations ---------------------------------------------------------------------


def _hooks(r: Rendered) -> dict[str, tuple[str, Json]]:
    """Webhooks by path: (configuration kind, webhook)."""
    found: dict[str, tuple[str, Json]] = {}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in r.one(kind)["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            assert path not in found, f"{path} twice"
            found[path] = (kind, hook)
    return found


def test_every_webhook_path_of_the_service_is_registered_and_no_other(default: Rendered) -> None:
    hooks = _hooks(default)
    assert set(hooks) == {w.path for w in WEBHOOKS}
    names = [hook["name"] for _, hook in hooks.values()]
    assert len(set(names)) == len(names)
    for w in WEBHOOKS:
        kind, hook = hooks[w.path]
        assert kind.startswith("Mutating" if w.verb == "mutate" else "Validating"), w.path
        (rule,) = hook["rules"]
        # The native gang kinds' webhooks take every version the service speaks (1.37, 1.36).
        versions = list(NATIVE_VERSIONS) if w.group == "scheduling.k8s.io" else [w.version]
        assert (rule["apiGroups"], rule["apiVersions"], rule["resources"]) == (
            [w.group],
            versions,
            [w.resource],
        )
        assert set(rule["operations"]) <= {"CREATE", "UPDATE"}
        assert hook["admissionReviewVersions"] == ["v1"] and hook["sideEffects"] == "None"
        assert hook["matchPolicy"] == "Equivalent"
        assert 1 <= hook["timeoutSeconds"] <= 10
        service = hook["clientConfig"]["service"]
        assert (service["name"], service["namespace"], service["port"]) == (BASE, NAMESPACE, 443)
        assert "caBundle" not in hook["clientConfig"] and "url" not in hook["clientConfig"]
        if w.path in TRAINJOB_PATHS:  # every served namespace
            assert hook["namespaceSelector"] == {}
        elif rule["scope"] == "Namespaced":
            (expression,) = hook["namespaceSelector"]["matchExpressions"]
            assert expression["key"] == "kubernetes.io/metadata.name"
            assert expression["operator"] == "NotIn"
            assert set(expression["values"]) == {"kube-system", NAMESPACE}
        else:
            assert w.resource == "clustertrainingruntimes" and "namespaceSelector" not in hook
    pods = hooks["/mutate--v1-pod"][1]
    assert pods["rules"][0]["operations"] == ["CREATE"]
    assert pods["objectSelector"] == {  # only the pods of a runtime's groups (its label)
        "matchExpressions": [{"key": GANG_LABEL, "operator": "Exists"}]
    }
    assert pods["reinvocationPolicy"] == "IfNeeded"
    unlabelled = hooks["/mutate--v1-pod-unlabelled"][1]
    assert unlabelled["failurePolicy"] == "Ignore"
    assert unlabelled["objectSelector"] == {
        "matchExpressions": [
            {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"},
            {"key": GANG_LABEL, "operator": "DoesNotExist"},
        ]
    }
    for path in (
        "/mutate-scheduling-k8s-io-v1beta1-workload",
        "/mutate-scheduling-k8s-io-v1beta1-podgroup",
    ):
        conditions = {c["name"]: c["expression"] for c in hooks[path][1]["matchConditions"]}
        assert conditions["not-the-service-itself"] == f"request.userInfo.username != '{SELF}'"
        assert "'TrainJob'" in conditions["owned-by-a-trainjob"]


def test_failure_policies_and_timeouts_are_values(default: Rendered) -> None:
    hooks = {hook["name"].split(".")[0] + "." + hook["name"].split(".")[1]: hook
             for _, hook in _hooks(default).values()}  # fmt: skip
    # Best effort (Ignore), so that an outage blocks nothing the service does not gang: the
    # Job webhook and the TrainJob freeze (the pod webhook ties the pods anyway; the reconciler
    # freezes a TrainJob a moment later), unlabelled JobSet pods, the TrainJob rules.
    assert {n: h["failurePolicy"] for n, h in hooks.items() if h["failurePolicy"] != "Fail"} == {
        "jobs.mutate": "Ignore",
        "trainjobs.mutate": "Ignore",
        "unlabelled-pods.mutate": "Ignore",
        "trainjobs.validate": "Ignore",
    }
    changed = render({"webhooks": {"mutatePod": {"failurePolicy": "Ignore", "timeoutSeconds": 3,
                                                 "reinvocationPolicy": "Never"}}})  # fmt: skip
    pod = _hooks(changed)["/mutate--v1-pod"][1]
    assert (pod["failurePolicy"], pod["timeoutSeconds"], pod["reinvocationPolicy"]) == (
        "Ignore", 3, "Never",
    )  # fmt: skip
    others = [h for p, (_, h) in _hooks(changed).items() if p != "/mutate--v1-pod"]
    assert [h["failurePolicy"] for h in others].count("Ignore") == 4
    extra = render({"webhooks": {"excludeNamespaces": ["kube-system", "monitoring"]}})
    values = _hooks(extra)["/mutate--v1-pod"][1]["namespaceSelector"]["matchExpressions"][0][
        "values"
    ]
    assert set(values) == {"kube-system", "monitoring", NAMESPACE}


def _match_conditions_hold(hook: Json, review: Json) -> bool:
    """The webhook's matchConditions on a review, with a CEL interpreter (cel-python), as the
    API server evaluates them: every one true, or the webhook is not called."""
    env = celpy.Environment()
    request = review["request"]
    activation = {
        "object": json_to_cel(request.get("object")),
        "oldObject": json_to_cel(request.get("oldObject")),
        "request": json_to_cel(request),
    }
    results = [
        env.program(env.compile(c["expression"])).evaluate(activation)
        for c in hook.get("matchConditions", [])
    ]
    assert all(isinstance(r, celpy.celtypes.BoolType) for r in results), results
    return all(bool(r) for r in results)


def _object_selected(hook: Json, review: Json) -> bool:
    labels = ((review["request"].get("object") or {}).get("metadata") or {}).get("labels") or {}
    expressions = (hook.get("objectSelector") or {}).get("matchExpressions", [])
    assert all(e["operator"] in ("Exists", "DoesNotExist") for e in expressions)
    return all((e["key"] in labels) == (e["operator"] == "Exists") for e in expressions)


def test_selectors_and_match_conditions_never_skip_a_review_the_service_changes(
    default: Rendered,
) -> None:
    """Every captured review that the service answers with a patch reaches it through the
    objectSelector and the matchConditions (CEL); the cheap skips do skip."""
    hooks = _hooks(default)
    cache = fixture_cache()
    reached = skipped = 0
    for name in fixture_names():
        doc = fixture(name)
        review = parse(json.dumps(doc).encode())
        verb = name.rsplit(".", 2)[1]
        served = [w for w in WEBHOOKS if w.verb == verb and w.judge(review) is None]
        # (a resource may have two webhooks: the pods', by the gang label; the TrainJob's rules
        # and its snapshot's tamper check)
        results = []
        for webhook in served:
            _, hook = hooks[webhook.path]
            if review.operation not in hook["rules"][0]["operations"]:
                continue  # the API server never sends it
            called = _object_selected(hook, doc) and _match_conditions_hold(hook, doc)
            decision = webhook.handler(review, cache)
            assert isinstance(decision, Decision)  # without a lookup, no handler awaits
            results.append((called, bool(decision.patch or not decision.allowed)))
        if not results:
            continue  # e.g. a pod's validation: no webhook of the service would be called
        if any(changes for _, changes in results):
            assert any(called for called, changes in results if changes), (
                f"{name}: the service would answer, but the webhook is skipped"
            )
        reached += any(called for called, _ in results)
        skipped += not all(called for called, _ in results)
    assert reached >= 10 and skipped >= 1, (reached, skipped)
    # A pod that already names a group is sent too (the Job controller's per-Job gang names
    # one on a ganged TrainJob's pods when their Job was made while the service was away).
    assert _match_conditions_hold(
        hooks["/mutate--v1-pod"][1], fixture("pod-create-with-schedulinggroup.mutate.json")
    )
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "j",
                "uid": "u", "controller": True}  # fmt: skip
    for kind in ("workload", "podgroup"):
        path = f"/mutate-scheduling-k8s-io-v1beta1-{kind}"
        outcome = "patched" if kind == "workload" else "rejected"
        sent = fixture(f"{kind}-create-gang-without-mincount-{outcome}.mutate.json")
        obj = sent["request"]["object"]
        obj["spec"].pop("controllerRef", None)
        obj["metadata"]["ownerReferences"] = [trainjob]
        assert _match_conditions_hold(hooks[path][1], sent)
        sent["request"]["userInfo"]["username"] = SELF  # the service's own writes
        assert not _match_conditions_hold(hooks[path][1], sent)
        sent["request"]["userInfo"]["username"] = "someone"
        obj["metadata"]["ownerReferences"] = [{**trainjob, "kind": "JobSet"}]  # someone else's
        assert not _match_conditions_hold(hooks[path][1], sent)


MUTATE_TRAINJOB_PATH = "/mutate-trainer-kubeflow-org-v1alpha1-trainjob"
GUARD_PATH = "/validate-trainer-kubeflow-org-v1alpha1-trainjob-snapshot"
TRAINJOB_PATH = "/validate-trainer-kubeflow-org-v1alpha1-trainjob"
TRAINJOB_PATHS = (TRAINJOB_PATH, MUTATE_TRAINJOB_PATH, GUARD_PATH)  # every served namespace


def _trainjob_update(change: Any) -> Json:
    """The captured suspend flip, with `change(object, oldObject)` applied to it."""
    review = fixture("trainjob-update-suspend.validate.json")
    change(review["request"]["object"], review["request"]["oldObject"])
    return review


def _set(obj: Json, key: str, value: str | None) -> Json:
    annotations = obj["metadata"].setdefault("annotations", {})
    if value is None:
        annotations.pop(key, None)
    else:
        annotations[key] = value
    return obj


def test_trainjob_updates_that_only_flip_suspend_skip_the_service_but_no_snapshot_write_does(
    default: Rendered,
) -> None:
    """Kueue's suspend and resume never wait on the service; every judged change is sent, and
    the runtime snapshot's tamper check (its own webhook) is never skipped, even alongside a
    suspend flip."""
    _, hook = _hooks(default)[TRAINJOB_PATH]
    ((condition,),) = [hook["matchConditions"]]
    assert condition["name"] == "not-only-suspend"
    assert not _match_conditions_hold(hook, fixture("trainjob-update-suspend.validate.json"))
    assert not _match_conditions_hold(hook, _trainjob_update(lambda new, old: None))  # no-op
    assert _match_conditions_hold(hook, fixture("trainjob-create.validate.json"))
    cache = fixture_cache()
    cache.service_username = SELF
    called: list[Any] = [
        lambda new, old: _set(new, SNAP, "{}"),  # a tenant adds a snapshot
        lambda new, old: (_set(old, SNAP, "{}"), _set(new, SNAP, '{"spec":{}}')),  # edits it
        lambda new, old: _set(old, SNAP, "{}"),  # removes it
        lambda new, old: _set(new, "team/note", "x"),  # any other annotation
        lambda new, old: new["metadata"].__setitem__("labels", {"kueue.x-k8s.io/queue-name": "q"}),
        lambda new, old: new["spec"]["trainer"].__setitem__("numNodes", 3),
        lambda new, old: new["spec"].__setitem__("podTemplateOverrides", []),  # a key added
        lambda new, old: old["spec"].__setitem__("initializer", {}),  # a key removed
    ]
    for i, change in enumerate(called):
        review = _trainjob_update(change)
        assert _match_conditions_hold(hook, review), i
    _, guard = _hooks(default)[GUARD_PATH]
    for i, writes in enumerate(called[:3]):  # the snapshot writes go to the guard: denied
        review = _trainjob_update(writes)
        _suspend_flip(review["request"]["object"], review["request"]["oldObject"])
        assert _match_conditions_hold(guard, review), i
        decision = guard_trainjob_review(parse(json.dumps(review).encode()), cache)
        assert not isinstance(decision, Awaitable)
        assert not decision.allowed and decision.code == 403, (i, decision)
    assert not _match_conditions_hold(guard, _trainjob_update(called[3]))


def _suspend_flip(new: Json, old: Json) -> None:
    new["spec"]["suspend"], old["spec"]["suspend"] = False, True


def _kueue_admits(new: Json, old: Json) -> None:
    """What Kueue's admission writes: its runtime patch (the flavor's node selector), resumed."""
    patch = {
        "manager": "kueue.x-k8s.io/manager",
        "trainer": {"spec": {"template": {"spec": {"nodeSelector": {"gpu": "a100"}}}}},
    }
    new["spec"]["runtimePatches"] = [patch]
    new["spec"]["suspend"], old["spec"]["suspend"] = False, True


def test_kueues_admission_and_preemption_skip_the_service_but_a_tenants_patch_does_not(
    default: Rendered,
) -> None:
    """Kueue admits a TrainJob by writing its `spec.runtimePatches` entry and resuming it, and
    preempts by restoring them and suspending: neither waits on the service when Kueue's own
    identity writes them. The same change by anyone else, or Kueue's with any other change
    (an annotation: the snapshot), is sent."""
    _, hook = _hooks(default)[TRAINJOB_PATH]
    kueue = "system:serviceaccount:kueue-system:kueue-controller-manager"

    def update(username: str, *changes: Any) -> Json:
        review = _trainjob_update(lambda new, old: [c(new, old) for c in changes])
        review["request"]["userInfo"]["username"] = username
        return review

    def preempts(new: Json, old: Json) -> None:  # the reverse: restored and suspended
        _kueue_admits(old, new)

    assert not _match_conditions_hold(hook, update(kueue, _kueue_admits))
    assert not _match_conditions_hold(hook, update(kueue, preempts))
    assert _match_conditions_hold(hook, update("alice", _kueue_admits))  # a tenant's patch
    snapshot = lambda new, old: _set(new, SNAP, "{}")  # noqa: E731
    assert _match_conditions_hold(hook, update(kueue, _kueue_admits, snapshot))
    numnodes = lambda new, old: new["spec"]["trainer"].__setitem__("numNodes", 3)  # noqa: E731
    assert _match_conditions_hold(hook, update(kueue, _kueue_admits, numnodes))
    # Another Kueue install names its controller; empty: only suspend flips skip.
    other = "system:serviceaccount:q:k"
    custom = render({"webhooks": {"validateTrainJob": {"kueueUsername": other}}})
    _, hook = _hooks(custom)[TRAINJOB_PATH]
    assert not _match_conditions_hold(hook, update(other, _kueue_admits))
    assert _match_conditions_hold(hook, update(kueue, _kueue_admits))
    _, hook = _hooks(render({"webhooks": {"validateTrainJob": {"kueueUsername": ""}}}))[
        TRAINJOB_PATH
    ]
    assert _match_conditions_hold(hook, update(kueue, _kueue_admits))
    assert not _match_conditions_hold(hook, update(kueue))  # the bare suspend flip still skips


def validate(review: Json, cache: Cache) -> Any:
    return validate_trainjob_review(parse(json.dumps(review).encode()), cache)


def _three_way(original: Any, modified: Any, current: Any) -> Any:
    """Helm 3's three-way merge, as kubectl and Helm compute it for these objects: what the chart
    removed (original -> modified) is deleted, what it sets (modified) wins, and what only the
    live object has is kept; `webhooks` merges by name (its patchMergeKey)."""
    if isinstance(modified, dict) and isinstance(current, dict):
        merged = dict(current)
        for key in original if isinstance(original, dict) else {}:
            if key not in modified:
                merged.pop(key, None)
        for key, value in modified.items():
            before = original.get(key) if isinstance(original, dict) else None
            merged[key] = _three_way(before, value, current.get(key))
        return merged
    if (
        isinstance(modified, list)
        and isinstance(current, list)
        and all(isinstance(x, dict) and "name" in x for x in modified + current)
    ):
        old = {x["name"]: x for x in original or []}
        live = {x["name"]: x for x in current}
        return [_three_way(old.get(x["name"]), x, live.get(x["name"], {})) for x in modified]
    return copy.deepcopy(modified)


def test_an_upgrade_leaves_the_injected_ca_bundle_alone(default: Rendered) -> None:
    """The chart never sets caBundle, so neither Helm 3's three-way merge nor Helm 4's
    server-side apply (which only touches the fields the chart manages) removes the one the
    service (or cert-manager) put in."""
    upgraded = render(
        {"webhooks": {"validateTrainJob": {"failurePolicy": "Fail", "timeoutSeconds": 3}}}
    )
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        original, modified = default.one(kind), upgraded.one(kind)
        live = copy.deepcopy(original)
        for hook in live["webhooks"]:
            hook["clientConfig"]["caBundle"] = "Q0E="
        merged = _three_way(original, modified, live)
        assert [h["clientConfig"]["caBundle"] for h in merged["webhooks"]] == ["Q0E="] * len(
            live["webhooks"]
        )
        assert merged["webhooks"] != live["webhooks"] or kind.startswith("Mutating")


# --- RBAC ---------------------------------------------------------------------------------------

# (apiGroup, resource, verb, resourceName or "") the service's account gets;
# tests/test_chart_rbac.py runs the service with exactly these and shows each one is used.
TRAINER, SCHEDULING, ADMISSION = (
    "trainer.kubeflow.org",
    "scheduling.k8s.io",
    "admissionregistration.k8s.io",
)
RUNTIMES = ("trainingruntimes", "clustertrainingruntimes")
CONFIGS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")


def cluster_self(backends: tuple[str, ...]) -> set[tuple[str, str, str, str]]:
    """The ClusterRole the service's account gets when the chart runs `backends`."""
    return {
    *((TRAINER, "trainjobs", v, "") for v in ("get", "list", "watch", "patch")),
    *((TRAINER, r, v, "") for r in RUNTIMES for v in ("get", "list", "watch")),  # get: the guard
    (TRAINER, "trainjobs/finalizers", "update", ""),
    (TRAINER, "trainjobs/status", "patch", ""),  # the GangScheduling condition
    *(("", "pods", v, "") for v in ("list", "watch")),  # gang health: JobSet's pods, counted
    *(("jobset.x-k8s.io", "jobsets", v, "") for v in ("list", "watch")),  # restart attempts
    ("batch", "jobs", "patch", ""),  # wakes the Jobs whose pods were held
    *((SCHEDULING, "priorityclasses", v, "") for v in ("list", "watch")),
    *(("", "nodes", v, "") for v in ("list", "watch")),  # feasibility at admission
    # The gang objects: what each backend the chart runs says it needs.
    *((group, resource, verb, "")
      for backend in default_backends(enabled=backends).backends for rule in backend.rbac
      for group in rule.api_groups for resource in rule.resources for verb in rule.verbs),
    ("events.k8s.io", "events", "create", ""),
    ("authentication.k8s.io", "tokenreviews", "create", ""),
    ("authorization.k8s.io", "subjectaccessreviews", "create", ""),
    *((ADMISSION, r, v, BASE) for r in CONFIGS for v in ("get", "watch", "patch")),
    }  # fmt: skip


CHART_BACKENDS = tuple(yaml.safe_load((CHART / "values.yaml").read_text())["serve"]["backends"])
CLUSTER_SELF = cluster_self(CHART_BACKENDS)
NAMESPACED_SELF = {
    ("coordination.k8s.io", "leases", "get", BASE),
    ("coordination.k8s.io", "leases", "update", BASE),
    ("coordination.k8s.io", "leases", "create", ""),
    *(("", "secrets", v, SECRET) for v in ("get", "watch", "update")),
    ("", "secrets", "create", ""),
}


def _flat(role: Json) -> set[tuple[str, str, str, str]]:
    return {
        (group, resource, verb, name)
        for rule in role["rules"]
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [""]
    }


CLUSTER_SCOPED = {"clustertrainingruntimes", "priorityclasses", "nodes", "tokenreviews",
                  "subjectaccessreviews", *CONFIGS}  # fmt: skip


def test_with_watched_namespaces_the_namespaced_rules_are_granted_only_there() -> None:
    """The same verbs as the default install, but those on namespaced resources only in the
    watched namespaces (a Role and RoleBinding each), the ClusterRole keeping the rest."""
    watched = ("team-a", "team-b")
    r = render({"serve": {"watchNamespaces": list(watched)}})
    cluster = _flat(r.one("ClusterRole", BASE))
    assert cluster == {t for t in CLUSTER_SELF if t[1] in CLUSTER_SCOPED}
    account = {"kind": "ServiceAccount", "name": BASE, "namespace": NAMESPACE}
    for ns in watched:
        [role] = [o for o in r.kinds("Role") if o["metadata"]["namespace"] == ns]
        assert role["metadata"]["name"] == f"{BASE}-watched"
        assert _flat(role) == {t for t in CLUSTER_SELF if t[1] not in CLUSTER_SCOPED}
        [binding] = [o for o in r.kinds("RoleBinding") if o["metadata"]["namespace"] == ns]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [account]
    assert _flat(render({}).one("ClusterRole", BASE)) == CLUSTER_SELF  # (the default: all)
    # The release namespace may be watched too: its own Role keeps its name.
    both = render({"serve": {"watchNamespaces": [NAMESPACE]}})
    names = sorted(o["metadata"]["name"] for o in both.kinds("Role"))
    assert names == [BASE, f"{BASE}-watched"]


def test_backend_settings_become_the_services_flags() -> None:
    args = build_parser().parse_args(["serve", *render({}).args])
    assert args.backends == ("native", "coscheduling", "volcano", "kai")  # all, by default
    assert args.coscheduling_schedule_timeout == 60 and args.volcano_topology_tiers == {}
    given = {
        "native": {"schedulers": ["default-scheduler", "second-scheduler"]},
        "coscheduling": {"scheduleTimeoutSeconds": 0, "affinitySchedulers": []},
        "volcano": {"topologyTiers": {"topology.kubernetes.io/zone": 2, "example.com/rack": 1}},
        "kai": {"schedulers": ["kai"], "defaultQueue": "", "topology": "racks"},
    }
    args = build_parser().parse_args(["serve", *render({"serve": given}).args])
    assert args.native_schedulers == ("default-scheduler", "second-scheduler")
    assert (args.coscheduling_schedule_timeout, args.coscheduling_affinity_schedulers) == (0, ())
    assert args.volcano_topology_tiers == {"topology.kubernetes.io/zone": 2, "example.com/rack": 1}
    assert (args.kai_schedulers, args.kai_default_queue, args.kai_topology) == (
        ("kai",), "", "racks",
    )  # fmt: skip
    bad: Json
    for bad in (
        {"volcano": {"topologyTiers": {"k": -1}}},
        {"kai": {"defaultQueue": "Not_A_Name"}},
        {"native": {"schedulers": []}},
        {"coscheduling": {"scheduleTimeoutSeconds": 2**31}},
    ):
        assert "values don't meet the specifications of the schema" in refused({"serve": bad})


@pytest.mark.parametrize("name", [b.name for b in all_backends()])
def test_each_backend_gets_the_rbac_it_declares_and_only_when_run(name: str) -> None:
    rendered = render({"serve": {"backends": [name]}})
    assert _flat(rendered.one("ClusterRole", BASE)) == cluster_self((name,))
    assert f"--backends={name}" in rendered.args


def test_feasibility_off_drops_the_node_watchs_rbac() -> None:
    off = render({"serve": {"feasibility": "off"}})
    nodes = {r for r in CLUSTER_SELF if r[1] == "nodes"}
    assert _flat(off.one("ClusterRole", BASE)) == CLUSTER_SELF - nodes
    assert "--feasibility=off" in off.args
    assert "--feasibility=deny" in render({"serve": {"feasibility": "deny"}}).args
    assert "at '/serve/feasibility'" in refused({"serve": {"feasibility": "never"}})


def test_rbac_is_exactly_what_the_service_uses(default: Rendered, cert_manager: Rendered) -> None:
    assert _flat(default.one("ClusterRole", BASE)) == CLUSTER_SELF
    assert _flat(default.one("Role", BASE)) == NAMESPACED_SELF
    assert default.one("Role", BASE)["metadata"]["namespace"] == NAMESPACE
    configs = {r for r in CLUSTER_SELF if r[0] == "admissionregistration.k8s.io"}
    assert _flat(cert_manager.one("ClusterRole", BASE)) == CLUSTER_SELF - configs
    assert _flat(cert_manager.one("Role", BASE)) == {r for r in NAMESPACED_SELF if r[1] == "leases"}
    for r in (default, cert_manager):
        for binding in r.kinds("ClusterRoleBinding") + r.kinds("RoleBinding"):
            if binding["metadata"]["name"] == BASE:
                assert binding["subjects"] == [
                    {"kind": "ServiceAccount", "name": BASE, "namespace": NAMESPACE}
                ]
    reader = default.one("ClusterRole", f"{BASE}-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    monitored = render(COMBINATIONS["monitoring"])
    binding = monitored.one("ClusterRoleBinding", f"{BASE}-metrics-reader")
    assert binding["roleRef"]["name"] == reader["metadata"]["name"]
    assert binding["subjects"][0]["name"] == "prometheus-k8s"
    assert not [
        b for b in default.kinds("ClusterRoleBinding") if "metrics-reader" in b["metadata"]["name"]
    ]
    no_auth = render({"serve": {"metricsAuth": False}})
    reviews = {r for r in CLUSTER_SELF if r[1] in ("tokenreviews", "subjectaccessreviews")}
    assert _flat(no_auth.one("ClusterRole", BASE)) == CLUSTER_SELF - reviews
    assert not [p for p in no_auth.kinds("Pod") if "metrics" in p["metadata"]["name"]]


def test_uninstall_removes_the_webhook_configurations_first(default: Rendered) -> None:
    """A pre-delete hook runs before Helm deletes any of the release's objects; its account may
    delete the two configurations, nothing else; its RBAC exists before its Job (weights)."""
    hooks = {o["kind"]: o for o in default.hooks if hook_kind(o) == "pre-delete"}
    assert set(hooks) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"}
    weight = {k: int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for k, o in hooks.items()}
    assert (
        max(weight[k] for k in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"))
        < weight["Job"]
    )
    for obj in hooks.values():
        policy = obj["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
        assert set(policy.split(",")) == {"before-hook-creation", "hook-succeeded"}
    assert _flat(hooks["ClusterRole"]) == {
        ("admissionregistration.k8s.io", r, "delete", BASE)
        for r in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
    }
    pod = hooks["Job"]["spec"]["template"]["spec"]
    sa = hooks["ServiceAccount"]["metadata"]["name"]
    assert pod["serviceAccountName"] == sa == hooks["ClusterRoleBinding"]["subjects"][0]["name"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["CONFIGURATION"] == BASE
    assert (
        pod["containers"][0]["args"][0]
        == (CHART / "files" / "delete-webhook-configurations.py").read_text()
    )
    assert not [o for o in render(COMBINATIONS["extra-args"]).hooks if hook_kind(o) == "pre-delete"]


def hook_kind(obj: Json) -> str:
    return str(obj["metadata"].get("annotations", {}).get("helm.sh/hook", ""))


def test_helm_test_pods(default: Rendered) -> None:
    pods = {p["metadata"]["name"]: p for p in default.kinds("Pod")}
    assert set(pods) == {f"{BASE}-test-webhook", f"{BASE}-test-metrics"}
    for pod in pods.values():
        assert hook_kind(pod) == "test"
        spec = pod["spec"]
        assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
        container = spec["containers"][0]
        assert container["command"] == ["python", "-c"]
        assert container["image"] == default.container["image"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["CA_FILE"] == "/ca/ca.crt"
    webhook_env = {
        e["name"]: e["value"] for e in pods[f"{BASE}-test-webhook"]["spec"]["containers"][0]["env"]
    }
    assert webhook_env["WEBHOOK_URL"] == f"https://{BASE}.{NAMESPACE}.svc:443"
    metrics_env = {
        e["name"]: e["value"] for e in pods[f"{BASE}-test-metrics"]["spec"]["containers"][0]["env"]
    }
    assert metrics_env["METRICS_URL"] == f"https://{BASE}.{NAMESPACE}.svc:8443"


# --- monitoring ---------------------------------------------------------------------------------

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
            "bool", "offset", "inf", "nan", "le"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, keywords, labels and strings
    aside)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function
        if match.group() not in KEYWORDS:
            names.add(match.group())
    return names


@cache
def service_metrics() -> frozenset[str]:
    """Every series name the service exports (counters' _total, histograms' _bucket...), and up:
    its registry as `serve` builds it (the gang signals register themselves there)."""
    metrics = Metrics()
    cache = Cache(connected=False)
    GangTracker(metrics, cache)
    FeasibilityCollector(metrics, cache)
    return frozenset({*metrics.registry._names_to_collectors, "up"})


# The API server's own, read by the webhook-down alert where they are scraped.
APISERVER_METRICS = frozenset(
    {"apiserver_admission_webhook_rejection_count", "apiserver_admission_webhook_fail_open_count"}
)


def test_the_webhook_down_alert_also_reads_the_api_servers_failed_calls() -> None:
    r = render(COMBINATIONS["monitoring"])
    groups = r.one("PrometheusRule")["spec"]["groups"]
    (down,) = [
        x for g in groups for x in g["rules"] if x.get("alert") == "TrainJobSchedulingWebhookDown"
    ]
    assert metric_names(down["expr"]) >= APISERVER_METRICS
    assert 'error_type="calling_webhook_error"' in down["expr"]
    pattern = re.search(r'name=~"([^"]+)"', down["expr"])
    assert pattern is not None
    regex = pattern.group(1).replace("\\\\", "\\")  # PromQL's string escapes
    kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    hooks = [h["name"] for kind in kinds for h in r.one(kind)["webhooks"]]
    assert hooks and all(re.fullmatch(regex, h) for h in hooks), (regex, hooks)
    assert not re.fullmatch(regex, "pods.mutate.kueue.x-k8s.io")


def _dashboard(r: Rendered) -> Json:
    config = r.one("ConfigMap", f"{BASE}-dashboard")
    dashboard: Json = json.loads(config["data"]["trainjob-scheduling.json"])
    return dashboard


def _promtool(rules: list[Json], tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("REQUIRE_PROMETHEUS") == "1":
            pytest.fail("promtool is missing (make prometheus installs Debian's prometheus)")
        pytest.skip("promtool is not installed (make prometheus)")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rules}))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_untied_and_held_alerts_fire_when_they_should(tmp_path: Path) -> None:
    """`promtool test rules` over the rendered rules: PodsUntied after 10 minutes of the gauge
    above 0; PodsHeld when the oldest hold a replica remembers is over 5 minutes old for 5
    minutes, never for short holds however often they happen."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("REQUIRE_PROMETHEUS") == "1":
            pytest.fail("promtool is missing (make prometheus installs Debian's prometheus)")
        pytest.skip("promtool is not installed (make prometheus)")
    groups = render(COMBINATIONS["monitoring"]).one("PrometheusRule")["spec"]["groups"]
    rules = {r["alert"]: r for g in groups for r in g["rules"]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    sel = f'job="{BASE}", namespace="{NAMESPACE}"'

    def fired(name: str, summary: str, **labels: str) -> Json:
        annotations = rules[name]["annotations"]
        return {"exp_labels": {"severity": "warning", **labels},
                "exp_annotations": {"summary": summary, "description": annotations["description"],
                                    "runbook_url": annotations["runbook_url"]}}  # fmt: skip

    untied = "1 TrainJobs with a gang have pods without its schedulingGroup."
    held = "A TrainJob Job's pods have been held for over 5 minutes."
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": f"trainjob_scheduling_gangs_with_untied_pods{{{sel}}}",
                 "values": "0 0 1x40"},
                # One replica: a hold that keeps going from minute 2 (its age grows 60 s a minute).
                {"series": f'trainjob_scheduling_oldest_hold_age_seconds{{{sel}, pod="a"}}',
                 "values": "0 0 0+60x40"},
                # Another replica: holds that end within 3 minutes, over and over: never alerts.
                {"series": f'trainjob_scheduling_oldest_hold_age_seconds{{{sel}, pod="b"}}',
                 "values": " ".join(str(60 * (m % 4)) for m in range(42))},
            ],
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": "TrainJobSchedulingPodsUntied",
                 "exp_alerts": []},
                {"eval_time": "13m", "alertname": "TrainJobSchedulingPodsUntied",
                 "exp_alerts": [fired("TrainJobSchedulingPodsUntied", untied)]},
                # Age above 300 s from minute 8, for 5 minutes: fires at 13, not at 10.
                {"eval_time": "10m", "alertname": "TrainJobSchedulingPodsHeld",
                 "exp_alerts": []},
                {"eval_time": "14m", "alertname": "TrainJobSchedulingPodsHeld",
                 "exp_alerts": [fired("TrainJobSchedulingPodsHeld", held)]},
            ],
        }],
    }  # fmt: skip
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    done = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "test.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_alerts_and_dashboard_use_the_services_metrics(tmp_path: Path) -> None:
    r = render(COMBINATIONS["monitoring"])
    groups = r.one("PrometheusRule")["spec"]["groups"]
    alerts = {rule["alert"]: rule for g in groups for rule in g["rules"]}
    assert {
        "TrainJobSchedulingWebhookDown", "TrainJobSchedulingWebhookErrors",
        "TrainJobSchedulingAdmissionLatencyHigh", "TrainJobSchedulingCertificateExpiresSoon",
        "TrainJobSchedulingGangWaitingTooLong", "TrainJobSchedulingReconcileErrors",
        "TrainJobSchedulingNoLeader", "TrainJobSchedulingGangApiUnavailable",
        "TrainJobSchedulingGangCanNeverFit", "TrainJobSchedulingGangWaitingWithoutHeadroom",
        "TrainJobSchedulingGangDegraded", "TrainJobSchedulingPodsUntied",
        "TrainJobSchedulingPodsHeld",
    } == set(alerts)  # fmt: skip
    used: dict[str, set[str]] = {name: metric_names(a["expr"]) for name, a in alerts.items()}
    panels = _dashboard(r)["panels"]
    for panel in panels:
        for target in panel["targets"]:
            used[f"panel {panel['title']}"] = metric_names(target["expr"])
    known = service_metrics() | APISERVER_METRICS
    unknown = {where: names - known for where, names in used.items() if names - known}
    assert not unknown, unknown
    assert all(used.values()), used
    for alert in alerts.values():
        assert f'job="{BASE}"' in alert["expr"] and alert["labels"]["severity"] in (
            "warning",
            "critical",
        )
    assert 'name="' + BASE + '"' in alerts["TrainJobSchedulingNoLeader"]["expr"]
    # Every alert links to its row of Act on an alert, which carries that anchor.
    base = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["prometheusRule"][
        "runbookBaseUrl"
    ]
    page = (REPO / "docs" / "tasks" / "alerts.md").read_text()
    for name, alert in alerts.items():
        assert alert["annotations"]["runbook_url"] == f"{base}#{name.lower()}", name
        assert f'<span id="{name.lower()}"></span>' in page, name
    # PromQL that Prometheus accepts: the rules as they are, the panels as recording rules.
    recorded = [
        {"record": f"dashboard:panel_{panel['id']}_{target['refId']}",
         "expr": target["expr"].replace("$job", ".*").replace("$namespace", ".*")}
        for panel in panels for target in panel["targets"]
    ]  # fmt: skip
    _promtool([*groups, {"name": "dashboard", "rules": recorded}], tmp_path)
    titles = " ".join(p["title"] for p in panels).lower()
    topics = ("admissions", "latency", "gangs by state", "time to schedule", "queue", "never fit",
              "headroom")  # fmt: skip
    for topic in topics:
        assert topic in titles, topic
    config = r.one("ConfigMap", f"{BASE}-dashboard")
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_the_metric_name_parser_sees_what_it_must() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, webhook) (rate(a_bucket{x="y"}[5m]))) > b '
        "or on(c) d_total"
    )
    assert metric_names(expr) == {"a_bucket", "b", "d_total"}
    assert "misspelt_metric" not in service_metrics()


def test_the_service_monitor_scrapes_over_verified_tls() -> None:
    for name in ("monitoring", "monitoring-cert-manager"):
        r = render(COMBINATIONS[name])
        monitor = r.one("ServiceMonitor")
        (endpoint,) = monitor["spec"]["endpoints"]
        service = r.one("Service")
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert endpoint["scheme"] == "https" and endpoint["path"] == "/metrics"
        tls = endpoint["tlsConfig"]
        assert tls["serverName"] == f"{BASE}.{NAMESPACE}.svc"
        assert tls["ca"]["secret"] == {"name": SECRET, "key": "ca.crt"}
        assert "insecureSkipVerify" not in tls
        assert _selected(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
        if name == "monitoring":
            assert (
                endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
            )
            assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        else:
            assert endpoint["authorization"]["credentials"] == {"name": "scraper", "key": "token"}


def test_the_network_policy_opens_the_two_ports() -> None:
    r = render(COMBINATIONS["network-policy"])
    policy = r.one("NetworkPolicy")
    assert _selected(policy["spec"]["podSelector"]["matchLabels"], _pod_labels(r))
    webhook, metrics = policy["spec"]["ingress"]
    assert webhook["ports"] == [{"port": "webhook", "protocol": "TCP"}] and "from" not in webhook
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    peers = metrics["from"]
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    } in peers
    test_pod = r.one("Pod", f"{BASE}-test-metrics")["metadata"]["labels"]
    assert any(_selected(p.get("podSelector", {}).get("matchLabels", {}), test_pod) for p in peers)


def test_the_network_policy_is_on_by_default(default: Rendered) -> None:
    policy = default.one("NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert ports == ["webhook", "metrics"]  # nothing else reaches the pods (probes always do)
    assert not render({"networkPolicy": {"enabled": False}}).kinds("NetworkPolicy")


def test_the_pods_are_system_cluster_critical_with_a_quota_admitting_them(
    default: Rendered,
) -> None:
    spec = default.deployment["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-cluster-critical"
    quota = default.one("ResourceQuota")
    assert quota["metadata"]["namespace"] == NAMESPACE
    assert quota["spec"]["scopeSelector"]["matchExpressions"] == [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["system-cluster-critical"]}
    ]
    assert int(quota["spec"]["hard"]["pods"]) > default.deployment["spec"]["replicas"] * 2
    plain = render({"priorityClassName": ""})
    assert "priorityClassName" not in plain.deployment["spec"]["template"]["spec"]
    assert not plain.kinds("ResourceQuota")
    own = render({"priorityClassName": "platform-high"})
    assert own.deployment["spec"]["template"]["spec"]["priorityClassName"] == "platform-high"
    assert not own.kinds("ResourceQuota")  # only system-* classes are limited that way


def _namespace_selected(selector: Json, namespace: str, labels: Json | None = None) -> bool:
    """A label selector on a namespace, as the API server matches it (its name is the label
    kubernetes.io/metadata.name)."""
    have = {"kubernetes.io/metadata.name": namespace, **(labels or {})}
    if any(have.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {
            "In": key in have and have[key] in values,
            "NotIn": key not in have or have[key] not in values,
            "Exists": key in have,
            "DoesNotExist": key not in have,
        }[op]
        if not ok:
            return False
    return True


def _pod_reaches(r: Rendered, namespace: str, ns_labels: Json | None, pod_labels: Json) -> bool:
    _, hook = _hooks(r)["/mutate--v1-pod"]
    review = fixture("pod-create-by-job-controller.mutate.json")
    review["request"]["namespace"] = namespace
    review["request"]["object"]["metadata"]["labels"] = pod_labels
    return (
        _namespace_selected(hook["namespaceSelector"], namespace, ns_labels)
        and _object_selected(hook, review)
        and _match_conditions_hold(hook, review)
    )


def test_a_pod_outside_the_watched_namespaces_or_not_a_jobsets_never_reaches_the_webhook(
    default: Rendered,
) -> None:
    """Trainer v2 puts no label of its own on pods (its trainjob-ancestor-step label sits on the
    Job template, not the pod template); JobSet labels every pod of a TrainJob's JobSet, so
    `jobset.sigs.k8s.io/jobset-name` is the narrowest label a TrainJob's pod is sure to carry."""
    jobset_pod = fixture("pod-create-by-job-controller.mutate.json")["request"]["object"]
    # A pod of a ReplicatedJob its runtime puts in a group (the runtime webhook labelled its
    # template; Trainer and JobSet copy the label onto every pod).
    labels = {**jobset_pod["metadata"]["labels"], GANG_LABEL: "true"}
    assert labels["jobset.sigs.k8s.io/jobset-name"] == "my-job"
    plain = {"app": "web"}
    # A JobSet pod without it (a plain JobSet's) never reaches the Fail webhook.
    assert not _pod_reaches(default, "team-a", None, jobset_pod["metadata"]["labels"])
    # Default: every namespace but kube-system and the release's.
    assert _pod_reaches(default, "team-a", None, labels)
    assert not _pod_reaches(default, "team-a", None, plain)
    assert not _pod_reaches(default, "kube-system", None, labels)
    assert not _pod_reaches(default, NAMESPACE, None, labels)
    # Watched namespaces: only those.
    watched = render({"serve": {"watchNamespaces": ["team-a", NAMESPACE]}})
    assert _pod_reaches(watched, "team-a", None, labels)
    assert not _pod_reaches(watched, "team-b", None, labels)
    assert not _pod_reaches(watched, NAMESPACE, None, labels)  # never the service's own
    assert not _pod_reaches(watched, "team-a", None, plain)
    # Label mode: only labelled namespaces (and still only watched ones, when listed).
    mark = {"key": "trainjob-scheduling.dev/enabled", "value": "true"}
    labelled = render({"webhooks": {"namespaceLabel": mark}})
    on = {"trainjob-scheduling.dev/enabled": "true"}
    assert _pod_reaches(labelled, "team-b", on, labels)
    assert not _pod_reaches(labelled, "team-b", None, labels)
    assert not _pod_reaches(labelled, "team-b", {"trainjob-scheduling.dev/enabled": "no"}, labels)
    # Every other namespaced webhook gets the same namespaceSelector (the TrainJob one: below).
    for r in (default, watched, labelled):
        selectors = [
            hook["namespaceSelector"]
            for path, (_, hook) in _hooks(r).items()
            if hook["rules"][0]["scope"] == "Namespaced" and path not in TRAINJOB_PATHS
        ]
        assert len(selectors) == 7 and all(s == selectors[0] for s in selectors)


def test_every_trainjob_the_reconciler_serves_reaches_the_tamper_check(default: Rendered) -> None:
    """The TrainJob webhook is the runtime snapshot's tamper check, so label mode, excluded
    namespaces and the release's own namespace (which narrow the other webhooks) never narrow
    it: a TrainJob the reconciler serves is never written unchecked. Only the watched-namespace
    list, which narrows the reconciler too, narrows it."""
    mark = {"key": "trainjob-scheduling.dev/enabled", "value": "true"}
    narrowed = render(
        {"webhooks": {"namespaceLabel": mark, "excludeNamespaces": ["kube-system", "ml-shared"]}}
    )
    for r in (default, narrowed):
        for path in (TRAINJOB_PATH, GUARD_PATH):
            _, hook = _hooks(r)[path]
            for namespace in ("team-a", "ml-shared", "kube-system", NAMESPACE):
                assert _namespace_selected(hook["namespaceSelector"], namespace), namespace
        # The tamper check is always Fail; the TrainJob rules are Ignore (an outage blocks no
        # TrainJob write that leaves the snapshot alone).
        assert _hooks(r)[GUARD_PATH][1]["failurePolicy"] == "Fail"
        assert _hooks(r)[TRAINJOB_PATH][1]["failurePolicy"] == "Ignore"
    assert narrowed.flag("--watch-namespaces") is None  # the reconciler serves them all
    watched = render({"serve": {"watchNamespaces": ["team-a"]}})
    _, hook = _hooks(watched)[GUARD_PATH]
    assert _namespace_selected(hook["namespaceSelector"], "team-a")
    assert not _namespace_selected(hook["namespaceSelector"], "team-b")
    assert watched.flag("--watch-namespaces") == "team-a"
    # Ignore would let a TrainJob carrying a tenant's snapshot in while no replica answers.
    assert "failurePolicy" in refused(
        {"webhooks": {"guardTrainJobSnapshot": {"failurePolicy": "Ignore"}}}
    )
    # The guard is sent exactly the requests that set, change or remove the snapshot.
    _, guard = _hooks(default)[GUARD_PATH]
    bare = fixture("trainjob-create.validate.json")
    assert not _match_conditions_hold(guard, bare)
    frozen = copy.deepcopy(bare)
    frozen["request"]["object"]["metadata"]["annotations"][SNAP] = "{}"
    assert _match_conditions_hold(guard, frozen)
    update = copy.deepcopy(frozen)
    update["request"]["operation"] = "UPDATE"
    update["request"]["oldObject"] = copy.deepcopy(frozen["request"]["object"])
    assert not _match_conditions_hold(guard, update)  # left as stored (a label edit, say)
    update["request"]["object"]["metadata"]["annotations"][SNAP] = '{"x": 1}'
    assert _match_conditions_hold(guard, update)  # changed
    del update["request"]["object"]["metadata"]["annotations"][SNAP]
    assert _match_conditions_hold(guard, update)  # removed


# What the API server does with each captured request while no replica answers, with the
# chart's defaults: "refused" (called, failurePolicy Fail) or "admitted" (never sent). The table
# in docs/tasks/install.md#blast-radius says the same per object kind.
WHILE_DOWN = {
    # Captured before the gang label existed: a JobSet pod without it (a plain JobSet's, or one
    # of a runtime labelled before it: applied again, its pods carry it; see below).
    "pod-create-by-job-controller": "admitted",
    "pod-create-with-schedulinggroup": "admitted",
    "trainjob-create": "admitted",  # no snapshot in it: only the Ignore rules webhook
    "trainjob-update-suspend": "admitted",  # Kueue's suspend/resume
    "trainjob-status-update": "admitted",  # the status subresource is not sent
    "trainjob-delete": "admitted",
    "clustertrainingruntime-create-level1": "refused",
    "trainingruntime-create": "refused",
    "trainingruntime-delete": "admitted",
    # Controlled by a TrainJob, written by someone other than the service: defaulted, so sent.
    "workload-create": "refused",
    "podgroup-create": "refused",
}


def _refused_while_down(r: Rendered, review: Json) -> bool:
    request = review["request"]
    for _, hook in _hooks(r).values():
        rule = hook["rules"][0]
        if request["resource"]["resource"] != rule["resources"][0] or request.get("subResource"):
            continue
        if request["operation"] not in rule["operations"] or hook["failurePolicy"] != "Fail":
            continue
        if _object_selected(hook, review) and _match_conditions_hold(hook, review):
            return True
    return False


def test_what_fails_while_the_service_is_down(default: Rendered) -> None:
    seen = {}
    for stem in WHILE_DOWN:
        name = next(n for n in fixture_names() if n.startswith(stem + "."))
        refused = _refused_while_down(default, fixture(name))
        seen[stem] = "refused" if refused else "admitted"
    assert seen == WHILE_DOWN
    # Everyone else's gang objects (Kueue's, a Job's own Workload) and the service's own writes.
    for kind in ("workload", "podgroup"):
        review = fixture(f"{kind}-create.mutate.json")
        obj = review["request"]["object"]
        obj["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "j", "uid": "u"}]
        obj["spec"].pop("controllerRef", None)
        assert not _refused_while_down(default, review)
        ours = fixture(f"{kind}-create.mutate.json")
        ours["request"]["userInfo"]["username"] = SELF
        assert not _refused_while_down(default, ours)
    # Kueue's admission (its runtime patch, resumed), by Kueue; the same by a tenant is judged.
    admits = _trainjob_update(_kueue_admits)
    admits["request"]["userInfo"]["username"] = (
        "system:serviceaccount:kueue-system:kueue-controller-manager"
    )
    assert not _refused_while_down(default, admits)
    admits["request"]["userInfo"]["username"] = "alice"
    assert not _refused_while_down(default, admits)  # judged when the service answers
    # A ganged TrainJob's pod (its runtime's gang label): it waits, the Job controller retries.
    ganged = fixture("pod-create-by-job-controller.mutate.json")
    ganged["request"]["object"]["metadata"]["labels"][GANG_LABEL] = "true"
    assert _refused_while_down(default, ganged)
    # A TrainJob carrying a snapshot (a tenant's forgery, a restore): the tamper check.
    carried = fixture("trainjob-create.validate.json")
    carried["request"]["object"]["metadata"]["annotations"][SNAP] = "{}"
    assert _refused_while_down(default, carried)
    # A runtime without spec.scheduling is no gang's: never sent.
    plain = fixture("clustertrainingruntime-create-level1.validate.json")
    del plain["request"]["object"]["spec"]["scheduling"]
    assert not _refused_while_down(default, plain)


# --- CRDs ---------------------------------------------------------------------------------------


def test_the_shipped_crds_are_the_references_with_the_scheduling_schema() -> None:
    for name in chart_crds.FILES:
        assert chart_crds.target(name).read_text() == chart_crds.render(name), (
            f"{name}: run python -m tests.chart_crds"
        )
    r = render(COMBINATIONS["crds"])
    crds = r.kinds("CustomResourceDefinition")
    assert {c["metadata"]["name"] for c in crds} == {
        "trainjobs.trainer.kubeflow.org",
        "trainingruntimes.trainer.kubeflow.org",
        "clustertrainingruntimes.trainer.kubeflow.org",
    }
    for crd in crds:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        source = f"trainer.kubeflow.org_{crd['metadata']['name'].split('.')[0]}.yaml"
        assert crd == {**chart_crds.build(source), "metadata": crd["metadata"]}
    assert not render().kinds("CustomResourceDefinition")
    unkept = render({"crds": {"install": True, "keep": False}})
    assert all(
        "helm.sh/resource-policy" not in c["metadata"]["annotations"]
        for c in unkept.kinds("CustomResourceDefinition")
    )


def _structural(schema: Json, where: str = "") -> list[str]:
    """Kubernetes' structural-schema rule, for the part this project wrote: every node typed."""
    errors = [] if "type" in schema else [f"{where or '.'}: no type"]
    for key, child in (schema.get("properties") or {}).items():
        errors += _structural(child, f"{where}.{key}")
    if "items" in schema:
        errors += _structural(schema["items"], f"{where}[]")
    return errors


def test_the_scheduling_schema_is_structural_and_takes_every_sample() -> None:
    schema = chart_crds.scheduling_schema()
    assert not _structural(schema)
    assert "x-kubernetes-preserve-unknown-fields" not in json.dumps(schema)
    validator = jsonschema.Draft7Validator(_strict(schema))
    samples = 0
    for path in sorted(SAMPLES.glob("*.runtime.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            scheduling = (doc or {}).get("spec", {}).get("scheduling")
            if scheduling is None or path.name.startswith("invalid"):
                continue
            errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(scheduling)]
            assert not errors, f"{path.name}: {errors}"
            samples += 1
    assert samples >= 3
    # A misspelt field, too many topology keys, an empty target list are refused.
    invalid: list[Json] = [
        {"schedulingPolicy": {"gangg": {}}},
        {"schedulingConstraints": {"topology": [{"key": "a"}, {"key": "b"}]}},
        {"replicatedJobs": [{"targetReplicatedJobs": []}]},
        {
            "replicatedJobs": [
                {
                    "targetReplicatedJobs": ["n"],
                    "job": {"schedulingPolicy": {"gang": {"minCount": "2"}}},
                }
            ]
        },
    ]
    for bad in invalid:
        assert list(validator.iter_errors(bad)), bad
    # minCount is declared, so it reaches the webhook (which refuses it, saying why).
    assert not list(validator.iter_errors({"schedulingPolicy": {"gang": {"minCount": 2}}}))


# --- values -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"replicas": 3}, "additional properties 'replicas' not allowed"),
        ({"replicaCount": "2"}, "at '/replicaCount': got string, want integer"),
        (
            {"certManagement": "cert-manager"},
            "at '/certManagement': value must be one of 'self', 'certManager'",
        ),
        (
            {"webhooks": {"mutatePod": {"failurePolicy": "fail"}}},
            "at '/webhooks/mutatePod/failurePolicy'",
        ),
        (
            {"webhooks": {"validateTrainJob": {"timeoutSeconds": 60}}},
            "at '/webhooks/validateTrainJob/timeoutSeconds'",
        ),
        ({"webhooks": {"mutatePods": {}}}, "additional properties 'mutatePods' not allowed"),
        ({"image": {"tag": 1.2}}, "at '/image/tag': got number, want string"),
        ({"serve": {"logLevel": "verbose"}}, "at '/serve/logLevel'"),
        ({"extraArgs": ["-v"]}, "at '/extraArgs/0'"),
        (
            {"monitoring": {"serviceMonitor": {"enable": True}}},
            "additional properties 'enable' not allowed",
        ),
        (
            {"terminationGracePeriodSeconds": 20},
            "must exceed serve.shutdownDelaySeconds + serve.shutdownTimeoutSeconds",
        ),
        (
            {"replicaCount": 3, "serve": {"leaderElect": False}},
            "serve.leaderElect=false with more than one replica",
        ),
    ],
)
def test_typical_mistakes_fail_with_a_clear_message(values: Json, said: str) -> None:
    assert said in refused(values)


def _value_paths(values: Any, schema: Json, prefix: str = "") -> list[str]:
    """The dotted path of every value in values.yaml, down to where the schema stops naming
    keys (a free-form map such as resources.limits or podSecurityContext counts as one value);
    a key the schema does not know is returned with a "?" in front."""
    if not isinstance(values, dict) or not values or "properties" not in schema:
        return [prefix]
    paths = []
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else key
        if key not in schema["properties"]:
            paths.append(f"?{path}")
        else:
            paths += _value_paths(value, schema["properties"][key], path)
    return paths


def test_every_value_is_typed_and_documented() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    readme = (CHART / "README.md").read_text()
    paths = _value_paths(values, schema)
    assert len(paths) > 80
    assert not [p for p in paths if p.startswith("?")], "not in values.schema.json"
    assert not [p for p in paths if f"`{p}`" not in readme], "not in the chart's README"
    # ...and the schema names no value that values.yaml leaves without a default.
    assert not _missing_defaults(values, schema)


def _missing_defaults(values: Json, schema: Json, prefix: str = "") -> list[str]:
    missing = []
    for key, node in (schema.get("properties") or {}).items():
        path = f"{prefix}.{key}" if prefix else key
        if key not in values:
            missing.append(path)
        elif isinstance(values[key], dict) and values[key]:
            missing += _missing_defaults(values[key], node, path)
    return missing


def test_notes_say_what_was_installed_and_how_to_check_it(default: Rendered) -> None:
    assert (
        f"Deployment {BASE}" in default.notes
        and f"helm test {RELEASE} -n {NAMESPACE}" in default.notes
    )
    assert "self-managed" in default.notes
    assert "cert-manager Certificate" in render(COMBINATIONS["cert-manager"]).notes
    assert "{{" not in default.notes
