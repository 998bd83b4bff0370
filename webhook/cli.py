"""`python -m webhook <command>`: the service's one entry point."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import pathlib
import sys
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, TextIO, TypeVar

import yaml

from . import package_version
from .backends.base import GangBackend
from .backends.volcano import VolcanoSettings, parse_tiers
from .core import errors as fe
from .core import overcommit
from .core.errors import Path
from .core.fields import parse
from .core.trainer import NAMESPACED_RUNTIME_KIND, RUNTIME_KINDS, Runtime, TrainJob
from .core.validation import CheckedRuntime, Verdict, check_trainjob, runtime_layout
from .tls.policy import CIPHER_SUITES, TLS_VERSIONS, TlsPolicy

EXIT_INVALID = 1
T = TypeVar("T")
EXIT_USAGE = 2


class UsageError(Exception):
    pass


def _load(paths: Sequence[str]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") if path != "-" else sys.stdin as handle:
                found = [d for d in yaml.safe_load_all(handle) if d is not None]
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise UsageError(f"{path} is not valid YAML: {exc}") from exc
        for doc in found:
            if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
                raise UsageError(f"{path}: every document must be a Kubernetes object with a kind")
            docs.append(doc)
    return docs


def _name(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, dict) else ""


def _report(kind: str, name: str, verdict: Verdict, err: TextIO) -> bool:
    for warning in verdict.warnings:
        print(f"Warning: {warning}", file=err)
    if verdict.errors:
        print(f'error: {kind} "{name}" is invalid:', file=err)
        for error in verdict.errors:
            print(f"  * {error}", file=err)
    return verdict.allowed


RuntimeKey = tuple[str, str, str]  # kind, namespace ("" when cluster-scoped), name


def _runtime_key(kind: str, namespace: str | None, name: str | None) -> RuntimeKey:
    ns = (namespace or "default") if kind == NAMESPACED_RUNTIME_KIND else ""
    return (kind, ns, name or "")


def _load_nodes(path: str) -> list[dict[str, Any]]:
    """Nodes as `kubectl get nodes -o yaml` prints them (a v1 List), or Node documents."""
    found: list[dict[str, Any]] = []
    for doc in _load([path]):
        items = doc.get("items") if doc["kind"] in ("List", "NodeList") else [doc]
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, dict) or item.get("kind", "Node") != "Node":
                raise UsageError(f"{path}: expected Nodes (kubectl get nodes -o yaml)")
            found.append(item)
    return found


def _feasibility(
    plan: Any, runtime: Runtime, trainjob: TrainJob, backend: GangBackend, doc: Any, nodes: Any
) -> list[str]:
    """Warnings for the gangs that could never fit on `nodes`, then the numbers per domain."""
    from .backends.base import Context
    from .core.feasibility import Nodes, gangs_of, judge, message
    from .core.feasibilityview import lines, section
    from .kube.feasibility import domains_by_node_labels

    topology = domains_by_node_labels(backend, Context.of(doc))
    gangs, notes = gangs_of(plan, runtime, trainjob, topology=topology)
    view = Nodes(nodes.shapes, nodes.dropped_keys)
    judged = [(g, judge(g.demand, view)) for g in gangs]
    said = [f"Warning: can never fit: {message(g, f)}" for g, f in judged if not f.fits]
    said += [f"Note: {note}" for note in notes]
    return said + lines(section(judged, len(nodes), len(nodes.shapes)))


def plan_command(
    paths: Sequence[str],
    out: TextIO,
    err: TextIO,
    backend_name: str | None = None,
    output: str = "yaml",
    nodes_path: str | None = None,
) -> int:
    """Prints the objects each TrainJob in the files would get (from the backend its pods'
    scheduler chooses, or `backend_name`); field errors exit non-zero. With `nodes_path`, also
    whether each gang could ever fit on those nodes (to stderr, or after the tree)."""
    from .backends.base import Context, expresses
    from .backends.registry import default_backends  # the Kubernetes client is slow to import
    from .core.nodes import summary_of
    from .core.plan import build_plan
    from .core.planview import tree

    nodes = summary_of(_load_nodes(nodes_path)) if nodes_path else None
    backends = default_backends()
    chosen: GangBackend | None = None
    if backend_name is not None:
        chosen = backends.named(backend_name)
        if chosen is None:
            raise UsageError(
                f"no backend {backend_name!r}: choose one of {', '.join(backends.names)}"
            )
    docs = _load(paths)
    unknown = {d["kind"] for d in docs} - {"TrainJob", *RUNTIME_KINDS}
    if unknown:
        raise UsageError(f"unexpected kinds {sorted(unknown)}: give TrainJobs and runtimes")
    ok = True
    runtimes: dict[RuntimeKey, CheckedRuntime] = {}
    invalid: set[RuntimeKey] = set()
    for doc in (d for d in docs if d["kind"] in RUNTIME_KINDS):
        # Judged as admission judges a new runtime (what `kubectl apply` of the file would be).
        runtime, errs = parse(Runtime, doc)
        layout, verdict = (
            (None, Verdict(tuple(errs))) if runtime is None else runtime_layout(runtime)
        )
        said = verdict
        if runtime is not None and verdict.allowed:  # as admission warns
            unpodded = map(overcommit.sentence, overcommit.runtime_warnings(runtime))
            said = Verdict((), (*verdict.warnings, *unpodded))
        valid = _report(doc["kind"], _name(doc), said, err)
        ok = valid and ok
        meta = doc.get("metadata")
        namespace = meta.get("namespace") if isinstance(meta, dict) else None
        key = _runtime_key(doc["kind"], namespace, _name(doc))
        if runtime is None or not valid:
            invalid.add(key)  # the cluster would refuse it: its TrainJobs get no objects
        else:
            runtimes[key] = CheckedRuntime(runtime, layout, verdict)

    rendered: list[dict[str, Any]] = []
    for doc in (d for d in docs if d["kind"] == "TrainJob"):
        trainjob, errs = parse(TrainJob, doc)
        if trainjob is None:
            _report("TrainJob", _name(doc), Verdict(tuple(errs)), err)
            ok = False
            continue
        ref = trainjob.spec.runtime_ref
        key = _runtime_key(trainjob.runtime_kind, trainjob.namespace, ref.name)
        if key in invalid:
            detail = f"the {key[0]} in the given files is invalid (see above); fix it first"
            error = fe.invalid(Path("spec", "runtimeRef", "name"), ref.name, detail)
            _report("TrainJob", _name(doc), Verdict((error,)), err)
            ok = False
            continue
        checked = runtimes.get(key)
        # Runtime warnings were printed with the runtime already.
        if not _report(
            "TrainJob", _name(doc), Verdict(check_trainjob(trainjob, checked).errors), err
        ):
            ok = False
            continue
        assert checked is not None
        for clauses in overcommit.trainjob_warnings(trainjob, None):  # the runtime's: said above
            print(f"Warning: {overcommit.sentence(clauses)}", file=err)
        plan = build_plan(trainjob, checked)
        if plan is None:
            print(
                f"Note: TrainJob {_name(doc)!r}: its runtime has no spec.scheduling, so it gets "
                "no Workload and no PodGroups",
                file=err,
            )
            continue
        backend = chosen or backends.for_plan(plan)
        if backend is None:
            print(
                f"Note: TrainJob {_name(doc)!r}: its pods name the scheduler "
                f"{plan.scheduler_name!r}, which no gang backend serves (use --backend)",
                file=err,
            )
            continue
        if not expresses(backend, plan):
            print(
                f"error: TrainJob {_name(doc)!r}: its runtime combines levels into a tree of "
                f"groups of groups, which the {backend.name} gang backend cannot express "
                "(admission denies it); keep each ReplicatedJob at one level",
                file=err,
            )
            ok = False
            continue
        for warning in backend.admission_warnings(plan, Context.of(doc)):
            print(f"Warning: {warning}", file=err)
        judged = _feasibility(plan, checked.runtime, trainjob, backend, doc, nodes) if nodes else []
        if output == "tree":
            out.write(tree(plan))
            out.writelines(f"{line}\n" for line in judged)
            continue
        err.writelines(f"{line}\n" for line in judged)
        rendered += backend.render(plan, Context.of(doc))
    if rendered:
        out.write(yaml.safe_dump_all(rendered, sort_keys=False))
    return 0 if ok else EXIT_INVALID


def build_parser(
    config: dict[str, Any] | None = None, prog: str = "python -m webhook"
) -> argparse.ArgumentParser:
    """The command line; `config` holds `serve` defaults read from a --config file."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Workload-aware scheduling for Kubeflow TrainJobs.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser(
        "plan",
        help="print the Workload and PodGroups a TrainJob would get",
        description="Print, as YAML, the Workload and PodGroups each TrainJob in the files would "
        "get from its runtime (also in the files); warnings and field errors go to stderr.",
    )
    plan.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        metavar="FILE",
        help="YAML file with TrainJobs and (Cluster)TrainingRuntimes; repeatable; - for stdin",
    )
    plan.add_argument(
        "-o",
        "--output",
        choices=["yaml", "tree"],
        default="yaml",
        help="yaml: the objects, ready to apply; tree: the plan's groups as a compact tree",
    )
    plan.add_argument(
        "--backend",
        metavar="NAME",
        help="render for this gang backend (native, coscheduling, volcano, kai) instead of "
        "the one the pods' scheduler chooses",
    )
    plan.add_argument(
        "--nodes",
        metavar="FILE",
        help="nodes as `kubectl get nodes -o yaml` prints them: also say whether each gang "
        "could ever fit on them, per domain of its topology key",
    )
    _add_explain(commands)
    _add_uninstall(commands)
    _add_serve(commands, config or {})
    _add_certs(commands)
    samples = commands.add_parser(
        "samples",
        help="list the shipped sample TrainJobs and runtimes, or print some",
        description="Without names, list the samples shipped with the package; with names, "
        "print them as one YAML stream, e.g. `python -m webhook samples "
        "torch-100-nodes.trainjob.yaml torch-distributed.runtime.yaml | python -m webhook plan "
        "-f -`.",
    )
    samples.add_argument("names", nargs="*", metavar="NAME")
    return parser


def _add_explain(commands: Any) -> None:
    explain = commands.add_parser(
        "explain",
        help="why a TrainJob is not running (yet), and whether it ever will",
        description="One report from the cluster (read only, with your kubeconfig): the plan, "
        "the gang objects and their conditions, the pods (created, bound, pending and why), "
        "Kueue's admission, whether each gang could ever fit per domain, and a one-line "
        "verdict.",
    )
    explain.add_argument("resource", choices=["trainjob", "trainjobs", "tj"])
    explain.add_argument("name", metavar="NAME")
    explain.add_argument("-n", "--namespace", help="default: the kubeconfig context's")
    explain.add_argument("-o", "--output", choices=["text", "json"], default="text")
    _add_cluster_flags(explain)


def _add_cluster_flags(command: argparse.ArgumentParser) -> None:
    """Which cluster a client command talks to (with the user's kubeconfig)."""
    command.add_argument("--kubeconfig", help="default: $KUBECONFIG, else ~/.kube/config")
    command.add_argument("--context", help="a kubeconfig context (default: the current one)")


def _on_cluster(args: argparse.Namespace, work: Callable[[Any, str], Awaitable[T]]) -> T:
    """`work(api, namespace)` against the cluster `--kubeconfig`/`--context` name (the
    context's namespace), its connection closed after; ExplainError when it cannot connect."""
    from .explain.gather import connect

    async def run() -> T:
        cluster = await connect(args.kubeconfig, args.context)
        try:
            return await work(cluster.api, cluster.namespace)
        finally:
            close: Any = cluster.api.close  # untyped in the client
            await close()

    return asyncio.run(run())


def explain_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import json

    from .explain.gather import ExplainError, gather
    from .explain.report import build, render

    async def explain(api: Any, namespace: str) -> dict[str, Any]:
        return build(await gather(api, args.namespace or namespace, args.name))

    try:
        report = _on_cluster(args, explain)
    except ExplainError as exc:
        print(f"error: {exc}", file=err)
        return EXIT_INVALID
    out.write(json.dumps(report, indent=2) + "\n" if args.output == "json" else render(report))
    return 0


def _add_uninstall(commands: Any) -> None:
    uninstall = commands.add_parser(
        "uninstall",
        help="remove the service's condition and annotation from TrainJobs (after helm uninstall)",
        description="Remove what the service wrote on TrainJobs: the GangScheduling status "
        "condition and the trainjob-scheduling.dev/runtime-snapshot annotation. Run it after "
        "`helm uninstall` (a running service writes them back). Workloads and PodGroups are "
        "left alone: running gangs stay as they are, and each goes with its TrainJob (owner "
        "references).",
    )
    where = uninstall.add_mutually_exclusive_group()
    where.add_argument("-n", "--namespace", help="only this namespace's TrainJobs")
    where.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every namespace's (the default)"
    )
    uninstall.add_argument(
        "--dry-run", action="store_true", help="only list what would be removed, change nothing"
    )
    _add_cluster_flags(uninstall)


def uninstall_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .explain.gather import ExplainError
    from .kube.uninstall import Summary, clean_up, installed_configurations

    async def uninstall(api: Any, _: str) -> tuple[Summary, list[str]]:
        present = await installed_configurations(api)
        return await clean_up(api, args.namespace, dry_run=args.dry_run), present

    try:
        summary, present = _on_cluster(args, uninstall)
    except ExplainError as exc:
        print(f"error: {exc}", file=err)
        return EXIT_INVALID
    if present:
        print(
            "Warning: the service's webhook configuration is still installed "
            f"({', '.join(present)}): a running service writes the condition and annotation "
            "back, and its TrainJob webhook refuses the annotation's removal (helm uninstall "
            "first)",
            file=err,
        )
    for cleaned in summary.cleaned:
        print(cleaned.sentence(args.dry_run), file=err if cleaned.error else out)
    verb = "would be cleaned" if args.dry_run else "cleaned"
    done = len(summary.cleaned) - len(summary.failed)
    if summary.examined or not summary.stopped:  # no count when not one TrainJob was read
        print(
            f"{summary.examined} TrainJobs examined, {done} {verb}, {len(summary.failed)} failed",
            file=out,
        )
    if summary.stopped:  # 403, no such resource, no connection: said last, after what was done
        print(f"error: cannot list TrainJobs: {summary.stopped}", file=err)
    return EXIT_INVALID if summary.failed or summary.stopped else 0


def _samples() -> dict[str, Traversable]:
    """The samples inside the installed package (a wheel or a checkout alike)."""
    folder = resources.files("webhook") / "samples"
    return {item.name: item for item in folder.iterdir() if item.name.endswith(".yaml")}


def samples_command(names: Sequence[str], out: TextIO) -> int:
    found = _samples()
    if not names:
        for name in sorted(found):
            print(name, file=out)
        return 0
    unknown = [name for name in names if name not in found]
    if unknown:
        raise UsageError(f"no sample {', '.join(unknown)}; there are: {', '.join(sorted(found))}")
    texts = [found[name].read_text(encoding="utf-8").strip("\n") for name in names]
    out.write("\n---\n".join(text.removeprefix("---\n") for text in texts) + "\n")
    return 0


def _env(name: str, default: str) -> str:
    return os.environ.get(f"WEBHOOK_{name}", default)


def _bool(text: str) -> bool:
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list (a YAML list in the config file is joined first)."""
    return tuple(part.strip() for part in str(text).split(",") if part.strip())


_bool.__name__ = "boolean (true/false)"
_names.__name__ = "comma-separated list"


def _port(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(text)
    return port


def _positive(kind: type[int] | type[float]) -> Any:
    def convert(text: str) -> int | float:
        value = kind(text)
        if value <= 0:
            raise ValueError(text)
        return value

    convert.__name__ = f"positive {kind.__name__}"  # argparse names it in its error message
    return convert


def _at_least_zero(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(text)
    return value


def _at_least_zero_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _object_name(text: str) -> str:
    """Empty, or a name a cluster object may have (a DNS subdomain)."""
    from .core.fields import is_dns_subdomain

    if text and not is_dns_subdomain(text):
        raise ValueError(text)
    return text


def _int32_seconds(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 2**31 - 1:
        raise ValueError(text)
    return value


_port.__name__ = "port (1-65535)"
_at_least_zero.__name__ = "number >= 0"
_at_least_zero_int.__name__ = "whole number >= 0"
_object_name.__name__ = "object name (a DNS subdomain) or empty"
_int32_seconds.__name__ = "seconds (0-2147483647)"


def _tls_version(text: str) -> str:
    version = {"versiontls12": "1.2", "versiontls13": "1.3"}.get(text.strip().lower(), text)
    if version not in TLS_VERSIONS:
        raise ValueError(text)
    return version


def _cipher_suites(text: str) -> tuple[str, ...]:
    names = _names(text)
    if not names or any(name not in CIPHER_SUITES for name in names):
        raise ValueError(text)
    return names


_tls_version.__name__ = "TLS version (1.2 or 1.3)"
_cipher_suites.__name__ = "cipher suite list (" + ", ".join(CIPHER_SUITES) + ")"


# flag, environment variable (after WEBHOOK_), type, default, help
_SERVE_OPTIONS: list[tuple[str, str, Any, str, str]] = [
    ("--host", "HOST", str, "0.0.0.0", "address to listen on"),
    ("--port", "PORT", _port, "9443", "webhook (TLS) port"),
    ("--health-port", "HEALTH_PORT", _port, "8081", "plain-HTTP port for /healthz and /readyz"),
    ("--metrics-port", "METRICS_PORT", _port, "8443", "metrics (TLS) port for /metrics"),
    ("--metrics-auth", "METRICS_AUTH", _bool, "true",
     "check scrapers with TokenReview + SubjectAccessReview (false: anyone may read)"),
    ("--metrics-token-audiences", "METRICS_TOKEN_AUDIENCES", _names, "",
     "audiences a scraper's token must be for (default: the API server's)"),
    ("--metrics-token-ttl", "METRICS_TOKEN_TTL", _positive(float), "60",
     "seconds a TokenReview answer is reused"),
    ("--metrics-allow-ttl", "METRICS_ALLOW_TTL", _positive(float), "300",
     "seconds an allowing SubjectAccessReview is reused"),
    ("--metrics-deny-ttl", "METRICS_DENY_TTL", _positive(float), "30",
     "seconds a denial is reused"),
    ("--cert-dir", "CERT_DIR", str, "certs", "directory holding tls.crt and tls.key"),
    ("--tls-min-version", "TLS_MIN_VERSION", _tls_version, "1.2",
     "oldest TLS version the webhook and metrics listeners accept: 1.2 or 1.3 (VersionTLS12 "
     "and VersionTLS13, Kubernetes' spellings, too)"),
    ("--tls-cipher-suites", "TLS_CIPHER_SUITES", _cipher_suites, ",".join(CIPHER_SUITES),
     "comma-separated TLS 1.2 cipher suites (IANA names), of the ECDHE AEAD suites only "
     "(TLS 1.3 suites are always on)"),
    ("--kubeconfig", "KUBECONFIG", str, "", "kubeconfig file (default: in-cluster, "
     "else $KUBECONFIG, else no cluster)"),
    ("--namespace", "NAMESPACE", str, "", "the service's namespace, where its Lease lives "
     "(default: the pod's, else default)"),
    ("--service-account", "SERVICE_ACCOUNT", str, "",
     "the username the service's API requests carry (system:serviceaccount:<namespace>:<name>): "
     "the only requester allowed to write a TrainJob's runtime snapshot (default: the pod's "
     "ServiceAccount, read from its token; else whom the API server says the kubeconfig "
     "authenticates as, as kubectl auth whoami)"),
    ("--watch-namespaces", "WATCH_NAMESPACES", _names, "",
     "comma-separated namespaces whose TrainJobs are served (default: all)"),
    ("--reconcile", "RECONCILE", _bool, "true",
     "run the reconciler (Workloads and PodGroups); false: webhooks only"),
    ("--workers", "WORKERS", _positive(int), "4", "TrainJobs reconciled at once"),
    ("--qps", "QPS", _positive(float), "20",
     "the reconciler's reporting writes (conditions, Events) per second"),
    ("--burst", "BURST", _positive(int), "30", "reporting writes allowed at once above --qps"),
    ("--gang-qps", "GANG_QPS", _positive(float), "100",
     "the reconciler's gang writes (Workloads, PodGroups, runtime snapshots) per second; "
     "they go before the reporting writes"),
    ("--gang-burst", "GANG_BURST", _positive(int), "200",
     "gang writes allowed at once above --gang-qps"),
    ("--leader-elect", "LEADER_ELECT", _bool, "true",
     "reconcile only while holding the Lease (false: a single replica)"),
    ("--lease-name", "LEASE_NAME", str, "trainjob-scheduling-webhook", "the Lease's name"),
    ("--lease-duration", "LEASE_DURATION", _positive(float), "15",
     "seconds a leader's Lease lasts without renewal"),
    ("--renew-deadline", "RENEW_DEADLINE", _positive(float), "10",
     "seconds the leader keeps trying to renew before it stops reconciling"),
    ("--retry-period", "RETRY_PERIOD", _positive(float), "2",
     "seconds between Lease attempts"),
    ("--discovery-period", "DISCOVERY_PERIOD", _positive(float), "60",
     "seconds between checks of which scheduling.k8s.io version is served"),
    ("--resync-period", "RESYNC_PERIOD", _positive(float), "600",
     "seconds between passes over every TrainJob"),
    ("--cert-poll-seconds", "CERT_POLL_SECONDS", _positive(float), "5",
     "how often tls.* are re-read"),
    ("--shutdown-delay", "SHUTDOWN_DELAY", _at_least_zero, "0",
     "seconds to keep serving, not ready, after SIGTERM (endpoint removal)"),
    ("--shutdown-timeout", "SHUTDOWN_TIMEOUT", _positive(float), "25",
     "seconds in-flight reviews get to finish on SIGTERM"),
    ("--max-body-bytes", "MAX_BODY_BYTES", _positive(int), str(6 * 1024 * 1024),
     "larger AdmissionReview bodies get 413"),
    ("--header-timeout", "HEADER_TIMEOUT", _positive(float), "10",
     "seconds a request's headers (and the TLS handshake) may take (slow clients get 408)"),
    ("--max-header-bytes", "MAX_HEADER_BYTES", _positive(int), str(64 * 1024),
     "larger request header sections get 431"),
    ("--connection-max-requests", "CONNECTION_MAX_REQUESTS", _at_least_zero_int, "1000",
     "requests a webhook connection carries before its answer closes it, so reviews spread "
     "over the replicas (0: no bound)"),
    ("--connection-max-age", "CONNECTION_MAX_AGE", _at_least_zero, "30",
     "seconds after which a webhook connection's next answer closes it (0: no bound)"),
    ("--body-timeout", "BODY_TIMEOUT", _positive(float), "10",
     "seconds a request's body may take (slow clients get 408)"),
    ("--backends", "BACKENDS", _names, "",
     "comma-separated gang backends to run (default: all; each watches its kinds and needs "
     "their RBAC)"),
    ("--native-schedulers", "NATIVE_SCHEDULERS", _names, "default-scheduler",
     "pod scheduler names whose TrainJobs get native Workloads and PodGroups"),
    ("--coscheduling-schedulers", "COSCHEDULING_SCHEDULERS", _names,
     "scheduler-plugins-scheduler,slurm-bridge-scheduler",
     "scheduler names whose TrainJobs get scheduler-plugins (Coscheduling) PodGroups"),
    ("--coscheduling-schedule-timeout", "COSCHEDULING_SCHEDULE_TIMEOUT", _int32_seconds, "60",
     "a Coscheduling PodGroup's scheduleTimeoutSeconds (0: the scheduler's own default)"),
    ("--coscheduling-affinity-schedulers", "COSCHEDULING_AFFINITY_SCHEDULERS", _names,
     "scheduler-plugins-scheduler",
     "Coscheduling schedulers whose gangs get their topology as required pod affinity (not "
     "Slurm Bridge: Slurm chooses its nodes)"),
    ("--volcano-schedulers", "VOLCANO_SCHEDULERS", _names, "volcano",
     "scheduler names whose TrainJobs get Volcano PodGroups"),
    ("--volcano-topology-tiers", "VOLCANO_TOPOLOGY_TIERS", parse_tiers, "",
     "topology-key=tier pairs: the HyperNode tier a Volcano gang of that key may span at most"),
    ("--kai-schedulers", "KAI_SCHEDULERS", _names, "kai-scheduler",
     "scheduler names whose TrainJobs get KAI Scheduler PodGroups"),
    ("--kai-default-queue", "KAI_DEFAULT_QUEUE", _object_name, "default-queue",
     "KAI Queue of TrainJobs without a kai.scheduler/queue label (empty: they are denied)"),
    ("--kai-topology", "KAI_TOPOLOGY", _object_name, "cluster-topology",
     "KAI Topology holding the gangs' topology keys as levels (a TrainJob's "
     "kai.scheduler/topology annotation wins; empty: KAI ignores the keys)"),
    ("--feasibility", "FEASIBILITY", str.lower, "warn",
     "gangs of a new TrainJob that could never fit on the nodes: warn, deny, or off (no Node "
     "watch; a runtime's trainjob-scheduling.dev/feasibility annotation wins)"),
    ("--log-level", "LOG_LEVEL", str.lower, "info", "debug, info, warning or error"),
    ("--cert-management", "CERT_MANAGEMENT", str.lower, "auto",
     "files: tls.crt/tls.key in --cert-dir; self: a Secret this service keeps, its CA injected "
     "into the webhook configurations; auto: self inside a cluster, else files"),
    ("--cert-secret-name", "CERT_SECRET_NAME", str, "trainjob-scheduling-webhook-cert",
     "the kubernetes.io/tls Secret of --cert-management=self"),
    ("--cert-secret-namespace", "CERT_SECRET_NAMESPACE", str, "",
     "its namespace (default: the service's, see --namespace)"),
    ("--webhook-service-name", "SERVICE_NAME", str, "trainjob-scheduling-webhook",
     "the Service in front of the webhooks: the certificate is for <name>.<namespace>.svc"),
    ("--mutating-webhook-configuration", "MUTATING_WEBHOOK_CONFIGURATION", str,
     "trainjob-scheduling-webhook", "whose webhooks get the CA bundle (empty: none)"),
    ("--validating-webhook-configuration", "VALIDATING_WEBHOOK_CONFIGURATION", str,
     "trainjob-scheduling-webhook", "whose webhooks get the CA bundle (empty: none)"),
    ("--cert-check-period", "CERT_CHECK_PERIOD", _positive(float), "3600",
     "seconds between certificate checks, besides every change the watches bring"),
]  # fmt: skip
CONFIG_KEYS = {flag[2:] for flag, *_ in _SERVE_OPTIONS}
_CHOICES = {
    "--log-level": ["debug", "info", "warning", "error"],
    "--feasibility": ["warn", "deny", "off"],
    "--cert-management": ["auto", "self", "files"],
}


def _add_serve(commands: Any, config: dict[str, Any]) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve the admission webhooks over TLS and reconcile Workloads and PodGroups",
        description="Serve the admission webhooks and metrics over TLS, health probes over plain "
        "HTTP, and run the reconciler. Each option comes from its flag, else the environment "
        "variable shown, else the --config file (YAML, keys as the flag names without --), "
        "else the default.",
    )
    serve.add_argument(
        "--config", metavar="FILE", help="YAML file of option defaults [$WEBHOOK_CONFIG]"
    )
    # String defaults go through `type` too, so a bad environment or file value is a usage error.
    for flag, env, kind, default, text in _SERVE_OPTIONS:
        value = config.get(flag[2:], default)
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, dict):  # a table, such as --volcano-topology-tiers
            value = ",".join(f"{k}={v}" for k, v in value.items())
        extra: dict[str, Any] = {}
        if flag in _CHOICES:
            extra["choices"] = _CHOICES[flag]
        if kind is _bool:
            extra["nargs"] = "?"  # `--reconcile` alone means true
            extra["const"] = "true"
        serve.add_argument(
            flag,
            type=kind,
            default=_env(env, str(value).lower() if isinstance(value, bool) else str(value)),
            help=f"{text} [$WEBHOOK_{env}] (default: %(default)s)",
            **extra,
        )


def load_config(argv: Sequence[str]) -> dict[str, Any]:
    """The `serve` defaults in the file named by --config (or $WEBHOOK_CONFIG), if any."""
    path = os.environ.get("WEBHOOK_CONFIG")
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            config = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise UsageError(f"cannot read the config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"the config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(config, dict):
        raise UsageError(f"the config file {path} must be a mapping of option names to values")
    config = {str(k).replace("_", "-"): v for k, v in config.items()}
    unknown = sorted(set(config) - CONFIG_KEYS)
    if unknown:
        raise UsageError(f"the config file {path} has unknown options: {', '.join(unknown)}")
    return config


def _add_certs(commands: Any) -> None:
    certs = commands.add_parser(
        "certs",
        help="write a development CA and serving certificate",
        description="Write ca.crt, ca.key, tls.crt and tls.key (a throwaway CA and a serving "
        "certificate for localhost, 127.0.0.1 and <service>.<namespace>.svc).",
    )
    certs.add_argument("--out", default="certs", help="output directory (default: certs)")
    certs.add_argument("--service", default="trainjob-scheduling-webhook")
    certs.add_argument("--namespace", default="trainjob-scheduling-system")
    certs.add_argument("--dns", action="append", default=[], help="extra DNS name; repeatable")
    certs.add_argument("--ip", action="append", default=[], help="extra IP address; repeatable")
    certs.add_argument("--days", type=int, default=365)


def serve_command(args: argparse.Namespace) -> int:
    from .backends.coscheduling import CoschedulingSettings
    from .backends.kai import KaiSettings
    from .metrics.auth import AuthSettings
    from .server import logs
    from .server.app import Limits
    from .server.certificates import CertSettings
    from .server.run import ReconcileSettings, Settings, StartupError, serve

    logs.configure(args.log_level)
    auth = AuthSettings(
        audiences=args.metrics_token_audiences,
        token_ttl=args.metrics_token_ttl,
        allow_ttl=args.metrics_allow_ttl,
        deny_ttl=args.metrics_deny_ttl,
    )
    # The option names are the settings' names, except these two.
    renamed = {"enabled": "reconcile", "namespaces": "watch_namespaces"}
    reconcile = ReconcileSettings(
        **{
            f.name: getattr(args, renamed.get(f.name, f.name))
            for f in dataclasses.fields(ReconcileSettings)
        }
    )
    settings = Settings(
        host=args.host,
        port=args.port,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        metrics_auth=auth if args.metrics_auth else None,
        cert_dir=pathlib.Path(args.cert_dir),
        kubeconfig=args.kubeconfig or None,
        namespace=args.namespace,
        service_account=args.service_account,
        reconcile=reconcile,
        cert_poll_seconds=args.cert_poll_seconds,
        shutdown_timeout=args.shutdown_timeout,
        shutdown_delay=args.shutdown_delay,
        header_timeout=args.header_timeout,
        max_header_bytes=args.max_header_bytes,
        connection_max_requests=args.connection_max_requests,
        connection_max_age=args.connection_max_age,
        limits=Limits(max_body_bytes=args.max_body_bytes, body_timeout=args.body_timeout),
        backends=args.backends or None,
        schedulers={
            "native": args.native_schedulers,
            "coscheduling": args.coscheduling_schedulers,
            "volcano": args.volcano_schedulers,
            "kai": args.kai_schedulers,
        },
        kai=KaiSettings(args.kai_default_queue, args.kai_topology),
        volcano=VolcanoSettings(topology_tiers=args.volcano_topology_tiers),
        coscheduling=CoschedulingSettings(
            args.coscheduling_schedule_timeout, frozenset(args.coscheduling_affinity_schedulers)
        ),
        feasibility=args.feasibility,
        tls=TlsPolicy(args.tls_min_version, args.tls_cipher_suites),
        certs=CertSettings(
            mode=args.cert_management,
            secret_name=args.cert_secret_name,
            secret_namespace=args.cert_secret_namespace,
            service=args.webhook_service_name,
            mutating=args.mutating_webhook_configuration,
            validating=args.validating_webhook_configuration,
            check_period=args.cert_check_period,
        ),
    )
    try:
        import uvloop

        run: Any = uvloop.run
    except ImportError:
        run = asyncio.run
    try:
        run(serve(settings))
    except StartupError as err:
        logging.getLogger("webhook.serve").error(str(err))
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def certs_command(args: argparse.Namespace, out: TextIO) -> int:
    from .tls.certs import CertSpec, issue, write

    try:
        spec = CertSpec(args.service, args.namespace, tuple(args.dns), tuple(args.ip), args.days)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    paths = write(issue(spec), pathlib.Path(args.out))
    for path in paths.values():
        print(f"wrote {path}", file=out)
    print(f"serving certificate names: {', '.join(spec.dns_names + spec.ip_addresses)}", file=out)
    return 0


def kubectl_plugin(argv: Sequence[str] | None = None) -> int:
    """`kubectl trainjob-scheduling ...` (the executable kubectl-trainjob_scheduling)."""
    return main(argv, prog="kubectl trainjob-scheduling")


def started_as(argv0: str) -> str:
    """The command's name in usage lines: what it was started by (a console script's name),
    or `python -m webhook` when run as a module."""
    name = os.path.basename(argv0)
    return "python -m webhook" if name in ("", "__main__.py", "-c", "-m") else name


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    prog = prog or started_as(sys.argv[0] if sys.argv else "")
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        config = load_config(arguments) if arguments[:1] == ["serve"] else {}
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    args = build_parser(config, prog).parse_args(arguments)
    try:
        if args.command == "plan":
            return plan_command(
                args.files, sys.stdout, sys.stderr, args.backend, args.output, args.nodes
            )
        if args.command == "explain":
            return explain_command(args, sys.stdout, sys.stderr)
        if args.command == "uninstall":
            return uninstall_command(args, sys.stdout, sys.stderr)
        if args.command == "serve":
            return serve_command(args)
        if args.command == "certs":
            return certs_command(args, sys.stdout)
        if args.command == "samples":
            return samples_command(args.names, sys.stdout)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `... | head`: the reader has gone, which is no error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return EXIT_USAGE
